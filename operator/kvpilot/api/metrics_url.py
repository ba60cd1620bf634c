"""Which Prometheus URLs the operator may query: cluster-local http(s) Services only.

The operator runs with cluster-wide read rights and sits inside the cluster network, so a user-supplied
URL it fetches is a server-side request forgery vector (``http://169.254.169.254/`` is the cloud metadata
service, which hands out node credentials). The schema admits only a Service's cluster DNS name —
``<service>.<namespace>.svc[.<cluster domain>]`` — with an optional port and path: no IP literals, no
user-info, no query. Before each query the operator checks the name again and refuses it if it resolves
to a link-local, loopback, unspecified or multicast address (an ExternalName Service can point anywhere).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
# One regex for the CRD's CEL rule and for the operator: RE2 and Python agree on this subset.
METRICS_URL_PATTERN = (
    rf"^https?://{_LABEL}\.{_LABEL}\.svc(\.{_LABEL})*(:[0-9]{{1,5}})?(/[-a-zA-Z0-9._~%!$&'()*+,;=:@/]*)?$"
)
METRICS_URL_RULE_MESSAGE = (
    "url must be a cluster-local http(s) Service URL, http(s)://<service>.<namespace>.svc[.<cluster domain>]"
    "[:port][/path], with no IP address, user-info or query (the operator fetches it: anything else is a "
    "server-side request forgery risk)"
)
METADATA_HOSTS = frozenset({"metadata", "metadata.google.internal", "metadata.azure.internal",
                            "instance-data", "instance-data.ec2.internal"})


def url_problem(url: str) -> str | None:
    """Why ``url`` may not be queried (the schema's rule, re-checked without the API server), or None."""
    if not re.fullmatch(METRICS_URL_PATTERN, url):
        return METRICS_URL_RULE_MESSAGE
    host = urlsplit(url).hostname or ""
    if host in METADATA_HOSTS:
        return f"{host} is a cloud metadata service"
    return None


def address_problem(address: str) -> str | None:
    """Why an address a metrics host resolved to must not be contacted, or None."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_link_local or ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return f"it resolves to {ip}, a link-local, loopback or otherwise non-routable address"
    if str(ip) in ("100.100.100.200", "fd00:ec2::254"):  # Alibaba and AWS (IPv6) metadata services
        return f"it resolves to {ip}, a cloud metadata service"
    return None


@dataclass(frozen=True)
class MetricsPin:
    """``--resolve HOST:PORT:ADDRESS`` (curl's form): the operator's administrator pins a metrics host to an
    address. A pinned address is trusted even where the resolved-address check would refuse it (a Prometheus
    on the node's loopback, or a cluster without cluster DNS for the operator): the administrator chose it,
    unlike a spec author. The URL must still pass the schema's rule."""

    host: str
    port: int
    address: str

    @classmethod
    def parse(cls, text: str) -> MetricsPin:
        host, sep1, rest = text.partition(":")
        port, sep2, address = rest.partition(":")
        if not (sep1 and sep2 and host and port.isdigit() and 0 < int(port) < 65536 and address):
            raise ValueError(f"--resolve {text[:200]!r}: must be HOST:PORT:ADDRESS, e.g. "
                             "prometheus.monitoring.svc:9090:10.0.0.7")
        try:
            ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            raise ValueError(f"--resolve {text[:200]!r}: ADDRESS must be an IP address") from None
        return cls(host.lower(), int(port), address.strip("[]"))


def _pin_for(url: str, pins: Iterable[MetricsPin]) -> MetricsPin | None:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return next((p for p in pins if p.host == (parts.hostname or "") and p.port == port), None)


def pinned_request(url: str, pins: Iterable[MetricsPin]) -> tuple[str, dict[str, str]]:
    """The URL to connect to and the headers to send: a pinned host is dialled at its address, with the
    original name in ``Host`` (plain http; TLS would need the name for SNI, so https is never rewritten)."""
    pin = _pin_for(url, pins)
    parts = urlsplit(url)
    if pin is None or parts.scheme != "http":
        return url, {}
    host = f"[{pin.address}]" if ":" in pin.address else pin.address
    return urlunsplit(parts._replace(netloc=f"{host}:{pin.port}")), {"Host": parts.netloc}


def resolved_problem(url: str, resolve: Callable[..., Iterable[tuple[Any, ...]]] = socket.getaddrinfo,
                     pins: Iterable[MetricsPin] = ()) -> str | None:
    """``url_problem`` plus the addresses its host resolves to (``resolve`` is injected in tests), unless the
    administrator pinned the host (``--resolve``)."""
    problem = url_problem(url)
    if problem:
        return problem
    if _pin_for(url, pins) is not None:
        return None
    parts = urlsplit(url)
    try:
        infos = resolve(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80),
                        proto=socket.IPPROTO_TCP)
    except OSError as exc:
        return f"its host does not resolve ({exc})"
    for info in infos:
        problem = address_problem(str(info[4][0]))
        if problem:
            return problem
    return None

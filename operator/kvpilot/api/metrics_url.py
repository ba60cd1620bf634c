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
from urllib.parse import urlsplit

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


def resolved_problem(url: str, resolve=socket.getaddrinfo) -> str | None:  # type: ignore[no-untyped-def]
    """``url_problem`` plus the addresses its host resolves to (``resolve`` is injected in tests)."""
    problem = url_problem(url)
    if problem:
        return problem
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

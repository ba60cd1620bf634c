"""--resolve pins: an administrator-chosen address for a metrics host, trusted where a resolved one is not."""

from __future__ import annotations

import socket

import pytest

from kvpilot.api.metrics_url import MetricsPin, pinned_request, resolved_problem

PIN = MetricsPin.parse("prometheus.monitoring.svc:9090:127.0.0.1")


def _resolves_to(address: str):  # type: ignore[no-untyped-def]
    def resolve(host: str, port: int, proto: int = 0) -> list[tuple]:  # type: ignore[type-arg]
        return [(socket.AF_INET, socket.SOCK_STREAM, proto, "", (address, port))]
    return resolve


def test_a_pin_parses_host_port_and_address() -> None:
    assert PIN == MetricsPin("prometheus.monitoring.svc", 9090, "127.0.0.1")
    assert MetricsPin.parse("P.NS.svc:80:[::1]").address == "::1"


@pytest.mark.parametrize("text", ["", "host", "host:9090", "host:x:1.2.3.4", "host:0:1.2.3.4",
                                  "host:70000:1.2.3.4", "host:9090:not-an-ip", ":9090:1.2.3.4"])
def test_a_malformed_pin_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match="--resolve"):
        MetricsPin.parse(text)


def test_a_pinned_loopback_address_is_trusted_an_unpinned_one_is_not() -> None:
    url = "http://prometheus.monitoring.svc:9090"
    assert resolved_problem(url, resolve=_resolves_to("127.0.0.1")) is not None
    assert resolved_problem(url, resolve=_resolves_to("127.0.0.1"), pins=[PIN]) is None
    # the pin is for that host and port only
    assert resolved_problem("http://prometheus.monitoring.svc:9091", resolve=_resolves_to("127.0.0.1"),
                            pins=[PIN]) is not None


def test_a_pin_never_excuses_a_url_the_schema_refuses() -> None:
    metadata = MetricsPin.parse("169.254.169.254:80:127.0.0.1")
    assert resolved_problem("http://169.254.169.254/latest", pins=[metadata]) is not None


def test_a_pinned_host_is_dialled_at_its_address_with_its_name_in_host() -> None:
    target, headers = pinned_request("http://prometheus.monitoring.svc:9090/api/v1/query", [PIN])
    assert target == "http://127.0.0.1:9090/api/v1/query"
    assert headers == {"Host": "prometheus.monitoring.svc:9090"}
    assert pinned_request("http://other.monitoring.svc:9090/x", [PIN]) == ("http://other.monitoring.svc:9090/x", {})

"""Per-interval figures of a simulated fleet for verification (autotune/verify.py): the whole fleet's, and each
pod's (a canary is judged against the pods beside it behind the same balancer).

A request counts in the interval in which it was resolved: finished, or given up (shed by the gateway, its client
timed out, or aborted in its pod). Per pod, the requests it was sent and resolved; for the fleet, the arrivals of
the interval are the offered load (the balancer's drops count as misses of nobody's pod, and of the fleet).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim import RequestRecord

from kvpilot.autotune.fleet import Fleet
from kvpilot.autotune.verify import WindowFigures

# A request lives at most this long in the harness: the client timeout (60 s) before a first token, then at most
# max_tokens decode steps; older records that are resolved need not be looked at again.
LIVE_SECONDS = 300.0


@dataclass
class _Counts:
    resolved: int = 0
    good: int = 0
    answered: int = 0
    latency_s: float = 0.0  # summed over the answered

    def add(self, good: bool, answered: bool, latency_s: float) -> None:
        self.resolved += 1
        self.good += good
        self.answered += answered
        self.latency_s += latency_s if answered else 0.0

    def figures(self, end_s: float, seconds: float, limit: int | None, pods: int, expected: int, offered: float,
                batch: float, extra_resolved: int = 0) -> WindowFigures:
        return WindowFigures(end_s, seconds, limit, pods, expected, offered, float(self.resolved + extra_resolved),
                             float(self.good), float(self.answered), batch,
                             self.latency_s / self.answered if self.answered else 0.0)


def _good(r: RequestRecord, ttft_ms: float, tpot_ms: float) -> bool:
    return (r.error is None and r.finish_s is not None and r.ttft_s is not None and r.ttft_s * 1e3 <= ttft_ms
            and (r.tpot_s is None or r.tpot_s * 1e3 <= tpot_ms))


class Tally:
    """Counts, interval after interval, what each pod and the fleet resolved (state: a cursor into the fleet's
    records, which are kept in arrival order)."""

    def __init__(self, fleet: Fleet, ttft_ms: float, tpot_ms: float) -> None:
        self.fleet = fleet
        self.ttft_ms = ttft_ms
        self.tpot_ms = tpot_ms
        self._first = 0  # records before this index are resolved and older than LIVE_SECONDS
        self._seen: set[int] = set()  # ids of records already counted
        self._dropped = 0  # the balancer's drops counted so far (requests that never reached a pod)

    def interval(self, start_s: float, end_s: float, arrivals: int,
                 expected_pods: int) -> tuple[WindowFigures, dict[str, WindowFigures]]:
        """The fleet's figures for (start_s, end_s] and each serving pod's."""
        pods: dict[str, _Counts] = {}
        whole = _Counts()
        records = self.fleet.records
        while self._first < len(records) and records[self._first].arrival_s < end_s - LIVE_SECONDS and (
                records[self._first].finish_s is not None):
            self._seen.discard(id(records[self._first]))
            self._first += 1
        for r in records[self._first:]:
            if r.finish_s is None or r.finish_s > end_s or id(r) in self._seen:
                continue
            self._seen.add(id(r))
            good, answered = _good(r, self.ttft_ms, self.tpot_ms), r.error is None
            latency = r.finish_s - r.arrival_s
            whole.add(good, answered, latency)
            name = self.fleet.pod_of(r)
            if name is not None:
                pods.setdefault(name, _Counts()).add(good, answered, latency)
        dropped, self._dropped = self.fleet.dropped - self._dropped, self.fleet.dropped
        seconds = end_s - start_s
        serving = [p for p in self.fleet.replicas if p.state == "up"]
        limits = {p.config.max_batch_size for p in serving}
        batch = sum(p.engine.counts()["active"] for p in serving) / max(1, len(serving))
        fleet = whole.figures(end_s, seconds, limits.pop() if len(limits) == 1 else None, len(serving),
                              expected_pods, float(arrivals), batch, dropped)
        per_pod = {}
        for pod in serving:
            counts = pods.get(pod.name, _Counts())
            per_pod[pod.name] = counts.figures(end_s, seconds, pod.config.max_batch_size, 1, 1,
                                               float(counts.resolved), float(pod.engine.counts()["active"]))
        return fleet, per_pod

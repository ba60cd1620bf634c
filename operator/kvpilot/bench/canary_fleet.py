"""The live canary (autotune/canary.py) in the benchmark's simulated fleet: what the fleet shows the plan while a
canary runs, and how it follows what the plan's status says.

The operator runs a canary as a second Deployment of one pod; the bench's ``Fleet`` has the same shape built in
(``Fleet.roll_to(config, pods=1)``: with a spare GPU the canary starts beside the old pods and takes over one of
them once Ready; without one, the first replaced pod is the canary; each is sent its share of the requests, as a
Service spreads connections). So while ``status.autotune.canary`` says Running the fleet holds one pod at the
new value; once the plan promotes it (status.batching moves) every pod rolls to it, and once it rolls it back
the canary pod returns to the old value. The plan sees the canary pod and the others as the operator does: the
pods with their limits, the canary Deployment, and each group's window over the interval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvsim import EngineConfig

from kvpilot.api.status import AutotuneStatus, CanaryStatus, EngineStatus
from kvpilot.autotune.fleet import Fleet, Replica
from kvpilot.bench.window import Drained, PodReadings, Slo, window_of
from kvpilot.desired.observed import DeploymentState, Observed, PodState


class CanaryFleet:
    """Follows status.autotune.canary on ``fleet``, and records each canary (``runs``) for the report and plots."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.runs: list[dict[str, Any]] = []
        self._counters: dict[str, tuple[int, int]] = {}  # pod -> (sent, gave up) at the last interval

    def _is_canary(self, r: Replica) -> bool:
        return self.fleet.canary_config is not None and r.config == self.fleet.canary_config

    def observe(self, observed: Observed, drained: dict[str, Drained], interval_s: float, slo: Slo,
                counts: list[float | None]) -> Observed:
        """``observed`` with the canary's view added while one runs: the pods (each group's limit), the canary
        Deployment, and the windows of the canary pod and of the others (requests each group was sent and
        left unanswered in the interval, from the pods' own counters)."""
        deltas = {}
        for r in self.fleet.replicas:
            sent, gave = self._counters.get(r.name, (0, 0))
            deltas[r.name] = (r.sent - sent, r.gave_up - gave)
            self._counters[r.name] = (r.sent, r.gave_up)
        if self.fleet.canary_config is None:
            return observed
        serving = [r for r in self.fleet.replicas if not r.retire]
        pods = tuple(PodState(r.name, r.state == "up", None, ip=r.name, canary=self._is_canary(r),
                              max_batch_size=str(r.config.max_batch_size)) for r in serving)
        canary = [r for r in serving if self._is_canary(r)]
        up = sum(1 for r in canary if r.state == "up")
        value = str(self.fleet.canary_config.max_batch_size)
        dep = DeploymentState(1, 1, len(canary), len(canary), up, up, False, None, value, None, pods=len(canary))

        def group(members: list[Replica]) -> Any:
            names = {r.name for r in members}
            return window_of({n: d for n, d in drained.items() if n in names}, interval_s, slo,
                             sum(deltas.get(n, (0, 0))[0] for n in names),
                             sum(deltas.get(n, (0, 0))[1] for n in names), counts)

        others = [r for r in serving if not self._is_canary(r)]
        return replace(observed, pods=pods, canary_deployment=dep, canary_kv=group(canary), others_kv=group(others))

    def without_canary(self, readings: PodReadings) -> PodReadings:
        """The pods' readings less the canary pod's, for the engine fit (it runs another limit)."""
        names = {r.name for r in self.fleet.replicas if self._is_canary(r)}
        return PodReadings({p: s for p, s in readings.samples.items() if p not in names},
                           {p: w for p, w in readings.prompts.items() if p not in names})

    def follow(self, status: EngineStatus, want: int, config_of: Callable[[int], EngineConfig], t: float) -> bool:
        """Carry out what status says of the canary; True when this handled the fleet's rollout (a canary runs,
        started or ended this interval), False when the plain rollout to ``want`` applies."""
        record = (status.autotune or AutotuneStatus()).canary or CanaryStatus()
        running = self.fleet.canary_config is not None
        if record.phase == "Running" and not running and record.to_batch_size:
            self.fleet.roll_to(config_of(record.to_batch_size), pods=1)
            self.runs.append({"startSeconds": round(t), "from": record.from_batch_size, "to": record.to_batch_size,
                              "spare": bool(record.spare), "endSeconds": None, "outcome": None})
            return True
        if running and record.phase != "Running":
            self.fleet.roll_to(config_of(want))  # promoted (want is the new value) or rolled back (the old one)
            if self.runs:
                self.runs[-1].update(endSeconds=round(t), outcome=record.outcome,
                                     message=(record.message or "")[:400])
            return True
        return running

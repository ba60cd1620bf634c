"""A canary retune (autotune/canary.py decides) in and out of status, and the objects it renders. Pure.

Status is user-writable, as for verification (desired/verifying.py): a canary record that does not parse (no
values, a time that is not RFC 3339 or in the future, a value below 1) reads as no canary, so the old pods go back
to every replica and the canary pod to none. A well-formed record is trusted as the operator's own, as a
verification record is: it can run a canary, but only within autotune's bounds and the engine's ceiling
(desired/canary_checks.py), as a hand-edited status.batching can set a value. Tenants cannot forge one: the
chart's kvpilot-edit role may read the status, not write it.

The canary runs in a Deployment of its own, ``<name>-kvpilot-canary`` (one pod), with its own LLM-API ConfigMap: a
Deployment has no "pause after the first pod", and two Deployments make the canary's size exact. Its pods carry the
engine's serving labels, so the engine's Service spreads connections over them and the old pods alike (about 1/N
of the traffic each, the share a pod will have once the value is promoted), plus ``serving.kvpilot.io/canary``,
which its selector adds. kvpilot deletes nothing: between canaries the Deployment stays, at 0 replicas, and goes
with the engine (owner reference).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kvpilot.api.models import ObjectRef
from kvpilot.api.status import AutotuneStatus, CanaryStatus
from kvpilot.autotune.canary import Canary, Ending, Phase
from kvpilot.autotune.verification import CanaryWatch, figures_from_window
from kvpilot.autotune.verify import WindowFigures
from kvpilot.desired import labels as L
from kvpilot.desired.observed import Observed, PodState
from kvpilot.desired.verifying import seconds_at, settle_of, side_of, side_record, stamp, worse_of


OUTCOMES: dict[Ending, Literal["Promoted", "RolledBack", "Abandoned"]] = {
    Ending.PROMOTED: "Promoted", Ending.ROLLED_BACK: "RolledBack", Ending.ABANDONED: "Abandoned"}


def canary_of(status: AutotuneStatus | None, now: datetime) -> Canary | None:
    """The canary status holds as running (None: none, or a record that does not parse)."""
    record = status.canary if status is not None else None
    if record is None or record.phase is None or not record.from_batch_size or not record.to_batch_size \
            or record.from_batch_size < 1 or record.to_batch_size < 1 or record.from_batch_size == record.to_batch_size:
        return None
    started = seconds_at(record.started_at, now)
    if started is None or started > now.timestamp():
        return None
    ready = seconds_at(record.ready_at, now)
    seen = seconds_at(record.seen_until, now)
    watch = CanaryWatch(started, record.from_batch_size, record.to_batch_size,
                        settle_of(record.in_force_at, record.last_batch, record.calm_at, now),
                        side_of(record.canary), side_of(record.others), worse_of(record.worse_windows))
    return Canary(Phase(record.phase), record.from_batch_size, record.to_batch_size, started, bool(record.spare),
                  record.reason or "", ready if ready is not None and ready <= now.timestamp() else None, watch,
                  seen if seen is not None and seen <= now.timestamp() else None, record.pods or "")


def canary_record(canary: Canary | None, previous: CanaryStatus | None, pod: str | None,
                  ending: tuple[Canary, Ending, str, float] | None) -> CanaryStatus | None:
    """status.autotune.canary after this pass: the canary running (None: none), and how the last one ended
    (``ending``: the canary this pass ended, how, the verdict's message and when; else the previous record's)."""
    prev = previous or CanaryStatus()
    last = prev if ending is None else CanaryStatus(
        from_batch_size=ending[0].from_value, to_batch_size=ending[0].to_value,
        outcome=OUTCOMES[ending[1]], message=ending[2][:1024],
        decided_at=stamp(ending[3]))
    if canary is None:
        if last.outcome is None:
            return None
        return CanaryStatus(from_batch_size=last.from_batch_size, to_batch_size=last.to_batch_size,
                            outcome=last.outcome, message=last.message, decided_at=last.decided_at)
    w = canary.judged
    return CanaryStatus(
        phase=canary.phase.value, from_batch_size=canary.from_value, to_batch_size=canary.to_value,
        reason=canary.reason or None, started_at=stamp(canary.started_at_s), spare=canary.spare,
        ready_at=stamp(canary.ready_at_s), pod=pod, canary=side_record(w.canary), others=side_record(w.others),
        in_force_at=stamp(w.settle.in_force_s),
        last_batch=round(w.settle.last_batch) if w.settle.last_batch is not None else None,
        calm_at=stamp(w.settle.calm_s), worse_windows=w.worse or None, seen_until=stamp(canary.seen_until_s),
        pods=canary.pods or None,
        outcome=last.outcome, message=last.message, decided_at=last.decided_at)


def canary_pod(observed: Observed) -> PodState | None:
    """The canary pod (the newest not leaving, if a previous one is still draining)."""
    pods = [p for p in observed.pods if p.canary and not p.deleting]
    return max(pods, key=lambda p: p.started_at or "") if pods else None


def _agreed_limit(pods: list[PodState]) -> int | None:
    """The runtime limit every one of ``pods`` runs (None: none reports one, or they differ: a rollout)."""
    values = {p.max_batch_size for p in pods}
    if len(values) != 1:
        return None
    value = values.pop()
    return int(value) if value is not None and value.isdigit() else None


def canary_figures(observed: Observed, old_pods: int, now: datetime) -> tuple[WindowFigures | None,
                                                                              WindowFigures | None]:
    """This interval's windows of the canary pod and of the other pods, as verification reads them; each
    group's limit is the one all its serving pods were given (None while they differ: not evidence)."""
    serving = [p for p in observed.pods if not p.deleting]
    canary = [p for p in serving if p.canary]
    others = [p for p in serving if not p.canary]
    end = now.timestamp()

    def figures(w: Any, pods: list[PodState], expected: int) -> WindowFigures | None:
        if w is None or w.window_seconds <= 0 or w.samples <= 0:
            return None
        return figures_from_window(w, end, _agreed_limit(pods), expected)

    return figures(observed.canary_kv, canary, 1), figures(observed.others_kv, others, old_pods)


def idle_value(observed: Observed, in_force: int, ceiling: int | None) -> int:
    """The value the canary Deployment is rendered at between canaries (0 pods): the one it holds, the last
    canary's (what ``kubectl get deployment <name>-kvpilot-canary`` then shows was tried), so that neither a rollback nor
    a change made on every pod rewrites its template (a new ReplicaSet each time, the first while the rolled-back
    pod still drains); the value in force where it holds none that the engine may run."""
    held = observed.canary_deployment.max_batch_size if observed.canary_deployment is not None else None
    value = int(held) if held is not None and held.isdigit() else 0
    return value if 1 <= value and (ceiling is None or value <= ceiling) else in_force


# The engine's (ConfigMap, Deployment) rendered at a value (desired/plan.py): what the canary copies.
CanarySource = Callable[[int], tuple[dict[str, Any], dict[str, Any]]]


@dataclass(frozen=True)
class CanaryRender:
    """What a canary retune asks of the rendering: how many pods the engine's own Deployment runs, and the canary
    Deployment's value and pods (rendered while a canary runs, and at 0 pods once one has run: kvpilot deletes
    nothing)."""

    old_pods: int
    value: int
    pods: int

    def render(self, owner: ObjectRef, source: CanarySource, exists: bool, idle: bool = False) -> list[dict[str, Any]]:
        """The canary's ConfigMap and Deployment (none while none runs or ever ran: ``exists`` says whether its
        Deployment does). ``idle``: at 0 pods whatever a canary asks (a multi-node engine runs none)."""
        if (self.pods == 0 or idle) and not exists:
            return []
        cm, dep = source(self.value)
        return canary_children(owner, dep, cm, 0 if idle else self.pods)


def canary_children(owner: ObjectRef, deployment: dict[str, Any], config_map: dict[str, Any],
                    replicas: int) -> list[dict[str, Any]]:
    """The canary's ConfigMap and Deployment, from the engine's own rendered at the canary's value: renamed, one
    selector label more, ``replicas`` pods."""
    cm = copy.deepcopy(config_map)
    cm["metadata"]["name"] = L.canary_config_map_name(owner.name)
    dep = copy.deepcopy(deployment)
    dep["metadata"]["name"] = L.canary_deployment_name(owner.name)
    dep["metadata"]["labels"][L.CANARY_LABEL] = "true"
    spec = dep["spec"]
    spec["replicas"] = replicas
    spec["selector"]["matchLabels"][L.CANARY_LABEL] = "true"
    # One pod: it is replaced in place (a value changes only between canaries, at 0 replicas).
    spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    template = spec["template"]
    template["metadata"]["labels"][L.CANARY_LABEL] = "true"
    for volume in template["spec"].get("volumes") or []:
        if (volume.get("configMap") or {}).get("name") == L.config_map_name(owner.name):
            volume["configMap"]["name"] = cm["metadata"]["name"]
    return [cm, dep]

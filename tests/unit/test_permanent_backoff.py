"""A write the API server would refuse again backs the engine off to a cap, whatever else the loop does in between
(issue 22, item 3): the metrics samples taken meanwhile do not end the back-off (they reset the failure count, and
the engine applied every 2 s), nor do its children's watch events; a change of the spec retries at once. On the
virtual clock of tests/unit/virtual_time.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kvpilot import loop as loop_module
from kvpilot.desired.observed import PodState
from kvpilot.desired.settings import Settings
from kvpilot.k8s.errors import Invalid, NameConflict, Rejected, Transient, convert
from kvpilot.reconcile import ApplyFailed
from tests.unit.helpers import manifest
from tests.unit.virtual_time import VirtualTime


def body(generation: int = 1) -> dict[str, Any]:
    doc = manifest(name="e1", autotune={"enabled": True, "intervalSeconds": 30})
    doc["metadata"].update({"namespace": "ns", "uid": "u1", "generation": generation})
    return doc


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every pass fails on the Deployment (as the issue's duplicate env name did); the list is filled with the
    virtual times of the passes by ``run_loop``."""
    passes: list[float] = []

    async def reconcile(*_: Any, **__: Any) -> Any:
        raise ApplyFailed([("Deployment e1", Rejected("HTTP 500: failed to create typed patch object: .spec."
                                                      "template.spec.containers[name=\"server\"].env: duplicate "
                                                      "entries for key [name=\"KVSIM_PROFILE\"]"))])

    monkeypatch.setattr(loop_module, "reconcile", reconcile)
    return passes


def run_loop(vt: VirtualTime, passes: list[float], seconds: float, *, wake_every: float = 0,
             spec_change_at: float | None = None) -> int:
    """Run one engine's loop for ``seconds`` of virtual time, its pods sampled every 5 s and (``wake_every``) a
    child's watch event waking it that often; returns how many samples were taken."""
    samples: list[float] = []

    async def run() -> None:
        loops = loop_module.EngineLoops(api=None, settings=Settings(), resync_seconds=30,  # type: ignore[arg-type]
                                        clock=vt.clock, wait=vt.wait)

        async def sample(*_: Any) -> None:
            samples.append(vt.now)

        loops.signals.sample = sample  # type: ignore[method-assign]
        loops.observe("ADDED", body())
        loop = loops.loops[("ns", "e1")]
        loop.pods = (PodState("e1-a", ready=True, fingerprint=None, ip="127.0.0.9"),)  # serving: sampled
        original = loops._reconcile

        async def timed(target: loop_module.EngineLoop) -> None:
            passes.append(vt.now)
            await original(target)

        loops._reconcile = timed  # type: ignore[method-assign]
        changed = False
        next_wake = wake_every
        while vt.now < seconds:
            if wake_every and vt.now >= next_wake:
                loop.wake.set()
                next_wake = vt.now + wake_every
            if spec_change_at is not None and not changed and vt.now >= spec_change_at:
                loops.observe("MODIFIED", body(generation=2))
                changed = True
            await asyncio.sleep(0)
        await loops.stop_all()

    asyncio.run(run())
    return len(samples)


def test_samples_and_child_events_do_not_end_a_permanent_back_off(failing: list[float]) -> None:
    vt = VirtualTime()
    samples = run_loop(vt, failing, 300, wake_every=3)
    assert samples > 50  # the pods were sampled all along (every 5 s)
    # 0, 30, 150 s: the permanent table (30, 120, 300, ...) from the first failure, nothing in between.
    assert [round(t) for t in failing] == [0, 30, 150], failing


def test_a_spec_change_retries_at_once_and_the_back_off_goes_on(failing: list[float]) -> None:
    vt = VirtualTime()
    run_loop(vt, failing, 300, wake_every=3, spec_change_at=60)
    times = [round(t) for t in failing]
    assert times[:2] == [0, 30] and 60 <= times[2] <= 61, times
    # The retry failed too: the next one waits the next step of the table (300 s), not the first.
    assert len(times) == 3, times


@pytest.mark.parametrize("error,permanent", [
    (Invalid("HTTP 422"), True), (Rejected("HTTP 400"), True), (NameConflict("Service", "ns", "e1", "x"), True),
    (Transient("HTTP 503"), False),
])
def test_which_failures_are_permanent(error: Exception, permanent: bool) -> None:
    assert loop_module.is_permanent(ApplyFailed([("Deployment e1", error)])) is permanent  # type: ignore[list-item]


def test_one_permanent_failure_among_transient_ones_backs_the_pass_off() -> None:
    failed = ApplyFailed([("Service e1", Transient("HTTP 504")), ("Deployment e1", Invalid("HTTP 422"))])
    assert loop_module.is_permanent(failed) and isinstance(failed.cause, Invalid)


def test_the_api_servers_refusals_are_classified_by_status_and_words() -> None:
    from kubernetes.client.exceptions import ApiException

    def answer(status: int, message: str) -> BaseException:
        exc = ApiException(status=status)
        exc.body = '{"message": "%s"}' % message
        return convert(exc)

    assert isinstance(answer(500, "failed to create typed patch object: duplicate entries for key"), Rejected)
    assert isinstance(answer(500, "etcdserver: request timed out"), Transient)
    assert isinstance(answer(400, "bad request"), Rejected)
    assert isinstance(answer(429, "too many requests"), Transient)
    assert isinstance(answer(408, "timeout"), Transient)

"""The closed loop on the local cluster: simulated pods really run (kvsim behind trtllm-serve's command
line, bound to their pod IPs), a load generator drives them past their batch limit, and the operator
scrapes, retunes and rolls out — status says what it did and why."""

from __future__ import annotations

import asyncio
import json
import sys

from tests.e2e.conftest import ROOT, condition, kubectl, wait_for

sys.path.insert(0, str(ROOT / "hack"))
import closedloop  # noqa: E402


def test_tuner_raises_the_batch_limit_under_load_and_rolls_it_out(ns: str) -> None:
    closedloop_doc = closedloop.closed_loop_engine(ns, "loop", start_batch=4, replicas=2)
    kubectl("apply", "-f", "-", stdin=json.dumps(closedloop_doc))
    kubectl("wait", "--for=condition=Available", "ie/loop", "-n", ns, "--timeout=180s")
    wait_for(lambda: len(closedloop.ready_endpoints(ns, "loop")) == 2, 60, "two ready pods")
    stats = closedloop.LoadStats()

    def raised() -> dict | None:
        batching = closedloop.get_engine(ns, "loop")["status"]["batching"]
        return batching if batching["maxBatchSize"] > 4 else None

    async def drive() -> None:
        await closedloop.generate_load(lambda: closedloop.ready_endpoints(ns, "loop"), rate=24, seconds=75,
                                       prompt_words=200, max_tokens=200, stats=stats)

    asyncio.run(drive())
    batching = wait_for(raised, 30, "a raised runtime max_batch_size")
    assert batching["reason"] == "AutotuneRaised" and batching["maxBatchSize"] <= 256
    engine = closedloop.get_engine(ns, "loop")
    history = engine["status"]["autotune"]["history"]
    first = history[-1]  # newest first
    assert first["action"] == "Raise" and first["applied"] is True and first["fromBatchSize"] == 4
    assert all(h["toBatchSize"] <= 256 for h in history)
    assert engine["status"]["batching"]["summary"] == f"{batching['maxBatchSize']}/256"
    # The value in force reached the pods as a rolling change (never through spec).
    assert engine["spec"]["batching"]["maxBatchSize"] == 4
    dep = json.loads(kubectl("get", "deployment", "loop", "-n", ns, "-o", "json"))
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max_batch_size") + 1] == str(batching["maxBatchSize"])
    events = kubectl("get", "events", "-n", ns, "--field-selector", "reason=BatchSizeChanged")
    assert "AutotuneRaised" in events
    assert stats.ok > 0 and condition(engine, "Available")["status"] == "True"

"""The live tuner's window carries the traffic the pods served (arrival rate, mean prompt and output, the share
stopped at max_tokens), read from kvsim's trtllm-serve metrics by the operator's sampler: the what-if simulation
has its input in the live operator, not only in the benchmark. Shown in status.kvCache.traffic."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.e2e.conftest import apply, kubectl, wait_for
from tests.e2e.test_simulated import ie, ready_pod_ips, sim_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
import closedloop  # noqa: E402

RATE, SPEEDUP, MAX_TOKENS = 3.0, 10, 48
# A 20 s pass is 200 s of engine time: 60 requests at RATE / SPEEDUP per engine second on the one pod. Half of it.
WHOLE_WINDOW_REQUESTS = 30


def test_the_live_window_gets_the_traffic_the_pods_served(ns: str) -> None:
    # Release 1.3: its server mounts /prometheus/metrics (return_perf_metrics), whose request counter carries
    # the finish reasons; 1.2's TensorRT backend serves no such page (tests/e2e/test_releases.py).
    apply(sim_engine(ns, runtime__simulation={"profile": "llama-3.1-8b-fp8-h100", "speedupRatio": SPEEDUP},
                     runtime__env=[{"name": "KVSIM_TRTLLM_RELEASE", "value": "1.3"}],
                     autotune={"mode": "Advisory", "intervalSeconds": 20, "warmupSeconds": 0}))
    kubectl("wait", "--for=condition=Available", "ie/sim", "-n", ns, "--timeout=180s")
    stats = closedloop.LoadStats()

    def traffic() -> dict[str, int] | None:
        return ((ie(ns).get("status") or {}).get("kvCache") or {}).get("traffic")

    def whole_window() -> dict[str, int] | None:
        """A record of a window the load filled: the first one can cover only the load's first seconds (on CI's
        loaded machine, 10 requests at 3/min in engine time: 3 s of a 20 s window), and a record of a moved load
        replaces, not pools with, it (autotune/pooling.py)."""
        seen = traffic()
        return seen if seen and int(seen.get("requests", 0)) >= WHOLE_WINDOW_REQUESTS else None

    async def drive() -> None:
        await closedloop.generate_load(lambda: [f"{ip}:8000" for ip in ready_pod_ips(ns)], rate=RATE, seconds=150,
                                       prompt_words=300, max_tokens=MAX_TOKENS, stats=stats,
                                       stop=lambda: bool(whole_window()) and stats.ok > 150)

    asyncio.run(drive())
    seen = wait_for(whole_window, 60, f"status.kvCache.traffic of {WHOLE_WINDOW_REQUESTS} requests or more")
    print(f"status.kvCache.traffic {seen}; client: {stats.sent} sent, {stats.ok} ok at {RATE} req/s wall")
    assert stats.ok > 0 and stats.errors == 0, stats
    # Per pod, in the engine's own time: kvsim's clock runs SPEEDUP times the wall clock the load is paced by.
    assert 0.5 * RATE * 60 / SPEEDUP <= seen["requestsPerMinute"] <= 1.5 * RATE * 60 / SPEEDUP, seen
    assert seen["promptTokens"] >= 100, seen  # 300 words of prompt
    assert 1 <= seen["outputTokens"] <= MAX_TOKENS + 1, seen
    # kvsim's server generates each request's max_tokens and counts it under finished_reason="length": every
    # request stopped at its cap, so the what-if places the cap at the mean output (autotune/capped.py).
    assert seen["stoppedAtMaxTokens"] == "1.000000" and seen["maxTokens"] == seen["outputTokens"], seen

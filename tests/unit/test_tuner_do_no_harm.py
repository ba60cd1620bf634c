"""Property (issue 8): for random traffic in which no static max_batch_size within the bounds beats the current
one, the tuner never changes it. Each example runs the operator's plan() in the loop of a simulated fleet."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kvsim.workload import parse_workload

from kvpilot.bench.tuner import Slo, engine_config, run_autotuned, run_static

PROFILE = "llama-3.1-8b-fp8-h100"
CEILING = 512
START = 64
OTHERS = (32, 128, 512)
DURATION = 300.0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate=st.floats(0.2, 6.0), prompt=st.integers(100, 3000), output=st.integers(50, 500),
       seed=st.integers(0, 1000), gamma=st.booleans(), shed=st.booleans())
def test_the_tuner_never_changes_when_no_static_value_beats_the_current(rate: float, prompt: int, output: int,
                                                                        seed: int, gamma: bool, shed: bool) -> None:
    # shed: the suite's harness (the gateway sheds what is not scheduled within half the TTFT objective)
    doc = {"name": "prop", "seed": seed, "maxTokens": 1024,
           "inputTokens": {"distribution": "lognormal", "mean": prompt, "median": max(1, int(prompt * 0.7))},
           "outputTokens": {"distribution": "lognormal", "mean": output, "median": max(1, int(output * 0.7))},
           "arrivals": [{"durationSeconds": DURATION, "ratePerSecond": rate,
                         "process": "gamma" if gamma else "poisson", "cv": 2.0}]}
    requests = parse_workload(doc).requests()
    assume(requests)
    slo = Slo(2000, 50)
    horizon = DURATION + 120
    queue_timeout = slo.ttft_ms / 2e3 if shed else None
    current = run_static(requests, engine_config(PROFILE, CEILING, START), 2, slo, horizon, DURATION,
                         queue_timeout)["goodput"]
    best_other = max(run_static(requests, engine_config(PROFILE, CEILING, m), 2, slo, horizon, DURATION,
                                queue_timeout)["goodput"] for m in OTHERS)
    assume(best_other <= current)  # the premise: nothing in the bounds beats the current value
    tuned = run_autotuned(requests, PROFILE, CEILING, 2, 90.0, slo, horizon, DURATION, start=START,
                          autotune_max=CEILING, queue_timeout_s=queue_timeout)
    assert tuned["changes"] == 0, tuned["history"]

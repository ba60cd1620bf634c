"""Property (issue 18): on a served engine that is NOT the profile the tuner's what-if starts from, perturbed at
random within kvsim's measured error (each calibrated parameter and the GPU memory within +/-30%), and
for random traffic, the tuner never ends below 0.98x the static value it started from.

Each example runs the operator's own observe/fit/plan path (``run_autotuned``: ``Planner.observe_pods`` and
``Planner.plan_inline``) in the loop of a simulated fleet whose pods run the perturbed engine, and scores it
against that same engine held at the start value. The suite (``kvpilot bench tuner --suite --perturbed``) covers
the fixed perturbations on its cases; this draws others, and other traffic, so that a perturbation between the
suite's does not escape it. The runs are as long as the suite's (30 minutes): the tuner weighs a restart against
the traffic it expects to serve after it (its planning horizon), so a run much shorter than that horizon can end
below its start even on the nominal engine (measured: 7 minutes of 23 req/s, 1,729-token prompts, TPOT 60 ms,
0.78x static 64 nominal; the same traffic for 30 minutes on a perturbed engine, 1.20x).
"""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kvsim.perturb import Perturbation
from kvsim.workload import parse_workload

from kvpilot.bench.cases import CASE_SECONDS
from kvpilot.bench.perturb import served_profile
from kvpilot.bench.tuner import Slo, engine_config, run_autotuned, run_static

PROFILE = "llama-3.1-8b-bf16-a100"
CEILING = 512
START = 64
DURATION = float(CASE_SECONDS)
NEVER_BELOW = 0.98

factor = st.floats(0.7, 1.3)


# derandomize: the same examples on every run, so a failure in CI reproduces on a laptop.
@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(decode=factor, prefill=factor, overhead=factor, per_seq=factor, memory=factor,
       rate=st.floats(1.0, 30.0), prompt=st.integers(200, 3000), output=st.integers(100, 800),
       tpot=st.sampled_from([40, 60, 100]), seed=st.integers(0, 1000))
def test_on_a_perturbed_engine_the_tuner_never_ends_below_its_start(decode: float, prefill: float, overhead: float,
                                                                     per_seq: float, memory: float, rate: float,
                                                                     prompt: int, output: int, tpot: int,
                                                                     seed: int) -> None:
    served = served_profile(PROFILE, Perturbation(decode=decode, prefill=prefill, overhead=overhead,
                                                  per_seq=per_seq, memory=memory))
    doc = {"name": "perturbed-prop", "seed": seed, "maxTokens": 2048,
           "inputTokens": {"distribution": "lognormal", "mean": prompt, "median": max(1, int(prompt * 0.7))},
           "outputTokens": {"distribution": "lognormal", "mean": output, "median": max(1, int(output * 0.7))},
           "arrivals": [{"durationSeconds": DURATION, "ratePerSecond": rate}]}
    requests = parse_workload(doc).requests()
    assume(requests)
    slo = Slo(2000, tpot)
    horizon = DURATION + 120
    queue_timeout = slo.ttft_ms / 2e3  # the suite's harness: a gateway sheds what waits half the TTFT objective
    start = run_static(requests, engine_config(served, CEILING, START), 2, slo, horizon, DURATION,
                       queue_timeout)["goodput"]
    tuned = run_autotuned(requests, PROFILE, CEILING, 2, 90.0, slo, horizon, DURATION, start=START,
                          autotune_max=CEILING, queue_timeout_s=queue_timeout, served=served)
    assert tuned["goodput"] >= NEVER_BELOW * start, (
        f"autotuned {tuned['goodput']:.3f} < {NEVER_BELOW} x static {START} ({start:.3f}) on "
        f"decode={decode:.2f} prefill={prefill:.2f} overhead={overhead:.2f} per_seq={per_seq:.2f} "
        f"memory={memory:.2f}; history {tuned['history']}")

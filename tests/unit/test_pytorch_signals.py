"""The tuner reads the PyTorch backend: the limit in force and "batch full" from what PyExecutor reports
(numActiveRequests, maxNumActiveRequests, numQueuedRequests) beside the limit kvpilot rendered, where the
maxBatchSize* fields read 0; the what-if's model check works there; hostile caps mislead nothing.

The payloads are built from the fields PyExecutor fills (NVIDIA/TensorRT-LLM
tensorrt_llm/_torch/pyexecutor/py_executor.py ``_get_init_iter_stats`` / ``_update_iter_stats``, index ids
4553249729, 3542389387 and the later 54965565749; no release tag confirmed), then checked against kvsim's own
PyTorch server output."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from kvpilot.autotune.gate import engine_model, model_check
from kvpilot.autotune.inputs import TunerInput
from kvpilot.autotune.policy import decide
from kvpilot.autotune.signals import limit_in_force, waiting_beside_full_batch
from kvpilot.autotune.summarize import summarize
from kvpilot.autotune.window import KvWindow
from kvpilot.observe.scrape import decode_json
from kvpilot.trtllm.metrics import MetricsRejected, parse_iteration_stats
from tests.unit.helpers import engine

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
PROFILE = "llama-3.1-8b-fp8-h100"


def pytorch_iteration(it: int, active: int, queued: int, cap: int = 64, used: int = 3000, gen: int | None = None,
                      ctx: int = 0, done: int = 0, latency_ms: float = 24.0) -> dict[str, Any]:
    """One /metrics object as PyExecutor fills it. ``_get_init_iter_stats``: timestamp, iter, numNewActiveRequests,
    numActiveRequests, newActiveRequestsQueueLatencyMS, an InflightBatchingStats and an all-zero
    StaticBatchingStats ("not used in pytorch path"). ``_update_iter_stats``: iterLatencyMS, numQueuedRequests,
    numCompletedRequests, maxNumActiveRequests (max_batch_size x PP), gpuMemUsage (cpu and pinned 0),
    kvCacheStats, and the inflight counts with avgNumDecodedTokensPerIter 0 and microBatchId. Nothing sets the
    maxBatchSize* or maxNumTokens* fields: they serialize as 0."""
    gen = active - ctx if gen is None else gen
    return {
        "timestamp": "12-01-2026 12:00:00.000000", "iter": it, "iterLatencyMS": latency_ms,
        "newActiveRequestsQueueLatencyMS": 0.0, "numNewActiveRequests": ctx, "numActiveRequests": active,
        "numQueuedRequests": queued, "numCompletedRequests": done, "maxNumActiveRequests": cap,
        "maxBatchSizeStatic": 0, "maxBatchSizeRuntime": 0, "maxBatchSizeTunerRecommended": 0,
        "maxNumTokensStatic": 0, "maxNumTokensRuntime": 0, "maxNumTokensTunerRecommended": 0,
        "gpuMemUsage": 76_000_000_000, "cpuMemUsage": 0, "pinnedMemUsage": 0,
        "kvCacheStats": {"maxNumBlocks": 20000, "freeNumBlocks": 20000 - used, "usedNumBlocks": used,
                         "tokensPerBlock": 32, "allocTotalBlocks": used, "allocNewBlocks": 0, "reusedBlocks": 0,
                         "missedBlocks": 0, "cacheHitRate": 0.0},
        "inflightBatchingStats": {"numScheduledRequests": gen + ctx, "numContextRequests": ctx,
                                  "numGenRequests": gen, "numPausedRequests": 0, "numCtxTokens": 512 * ctx,
                                  "microBatchId": 0, "avgNumDecodedTokensPerIter": 0.0},
        "staticBatchingStats": {"numScheduledRequests": 0, "numContextRequests": 0, "numCtxTokens": 0,
                                "numGenTokens": 0, "emptyGenSlots": 0},
    }


def full_with_queue(cap: int = 64, n: int = 12, **kw: Any) -> list[dict[str, Any]]:
    """A pod whose batch stands at its cap with requests queued (PyExecutor fetches only below the cap)."""
    return [pytorch_iteration(100 + 10 * i, active=cap, queued=8 + i, cap=cap, ctx=1 if i % 3 == 0 else 0,
                              done=1, **kw) for i in range(n)]


def window_of(*payloads: list[dict[str, Any]]) -> KvWindow:
    pods = {f"p{i}": parse_iteration_stats(json.loads(json.dumps(p)), 10.0 * i) for i, p in enumerate(payloads)}
    w = summarize(pods, window_seconds=60.0)
    assert w is not None
    return w


def test_the_pytorch_payload_parses_with_its_cap_and_no_batch_size() -> None:
    (s,) = parse_iteration_stats([pytorch_iteration(7, active=64, queued=5)], 0.0)
    assert (s.max_batch_size_runtime, s.max_batch_size_static, s.tuner_recommended) == (0, 0, 0)
    assert (s.max_num_active_requests, s.active_requests, s.queued_requests) == (64, 64, 5)


def test_the_limit_in_force_and_batch_full_come_from_pytorch_s_own_report() -> None:
    w = window_of(full_with_queue(), full_with_queue())
    assert (w.runtime_batch_size, w.active_limit, w.full_waiting_share) == (0, 64, 1.0)
    assert limit_in_force(w, rendered=64) == 64 and limit_in_force(w) == 64  # the cap confirms what was rendered
    assert waiting_beside_full_batch(w, rendered=64)
    # Below the cap the executor admits from its queue: a queue there is not the limit's doing.
    below = window_of([pytorch_iteration(i, active=40, queued=6) for i in range(12)])
    assert below.full_waiting_share == 0.0 and not waiting_beside_full_batch(below, rendered=64)
    # No queue: nothing waits, however full the batch.
    idle = window_of([pytorch_iteration(i, active=64, queued=0) for i in range(12)])
    assert not waiting_beside_full_batch(idle, rendered=64)


def test_pipeline_parallel_ranks_multiply_the_cap_not_the_limit() -> None:
    """maxNumActiveRequests = max_batch_size x PP (get_max_num_sequences): 128 at PP 2 is a limit of 64."""
    w = window_of(full_with_queue(cap=128))
    assert limit_in_force(w, rendered=64, pipeline_parallel=2) == 64
    assert limit_in_force(w, pipeline_parallel=2) == 64  # nothing rendered known: the cap over PP
    assert waiting_beside_full_batch(w, rendered=64, pipeline_parallel=2)
    assert limit_in_force(replace(w, active_limit=127), pipeline_parallel=2) == 0  # no whole limit: unknown


def test_tensorrt_still_reads_its_runtime_batch_size() -> None:
    trt = [{**pytorch_iteration(i, active=64, queued=5), "maxBatchSizeRuntime": 48, "maxBatchSizeStatic": 64}
           for i in range(12)]
    w = window_of(trt)
    assert limit_in_force(w, rendered=64) == 48  # the in-engine tuner's value is the one in force
    assert waiting_beside_full_batch(w, rendered=64)


@pytest.mark.parametrize("value", [-1, -64, float("nan"), float("inf"), "64", True, [64], 2.5, 2**41])
def test_a_malformed_cap_rejects_the_payload(value: Any) -> None:
    with pytest.raises(MetricsRejected, match="maxNumActiveRequests"):
        parse_iteration_stats([{**pytorch_iteration(1, 64, 5), "maxNumActiveRequests": value}], 0.0)


def test_nan_and_infinity_literals_never_reach_the_parser() -> None:
    body = json.dumps(pytorch_iteration(1, 64, 5)).replace('"maxNumActiveRequests": 64', '"maxNumActiveRequests": NaN')
    with pytest.raises(MetricsRejected, match="NaN"):
        decode_json(f"[{body}]".encode())


def tuner_input(w: KvWindow, current: int = 64) -> TunerInput:
    spec = engine(autotune={"mode": "Auto", "minBatchSize": 8, "maxBatchSize": 1024}).spec.autotune
    return TunerInput(current=current, ceiling=1024, spec=spec, window=w, scheduler_policy="GuaranteedNoEvict",
                      now=NOW, expected_pods=1)


@pytest.mark.parametrize("cap", [0, 1, 63, 2**39])
def test_a_cap_that_contradicts_the_rendered_limit_misleads_nothing(cap: int) -> None:
    """A zero, tiny or absurd maxNumActiveRequests (a foreign pod, a hostile reply): the limit stays the rendered
    one, "full" is judged against it, and the tuner decides exactly as if the field were absent."""
    honest = window_of(full_with_queue())
    hostile = window_of([{**p, "maxNumActiveRequests": cap} for p in full_with_queue()])
    assert limit_in_force(hostile, rendered=64) == 64
    assert waiting_beside_full_batch(hostile, rendered=64)  # the batch was at the rendered limit
    assert decide(tuner_input(hostile)) == decide(tuner_input(honest))
    # A batch below the rendered limit is not full, whatever the cap claims.
    half = window_of([{**pytorch_iteration(i, active=32, queued=6), "maxNumActiveRequests": cap} for i in range(12)])
    assert not waiting_beside_full_batch(half, rendered=64)
    assert decide(tuner_input(half)) == decide(tuner_input(window_of(
        [pytorch_iteration(i, active=32, queued=6) for i in range(12)])))


def test_pods_that_disagree_on_the_cap_give_no_cap() -> None:
    w = window_of(full_with_queue(cap=64), full_with_queue(cap=96))
    assert w.active_limit == 0 and limit_in_force(w, rendered=64) == 64
    assert limit_in_force(w) == 0  # nothing rendered, nothing agreed: unknown, so no model check


def model() -> Any:
    spec = engine(runtime__simulation={"profile": PROFILE}, autotune={"mode": "Auto", "maxBatchSize": 256}).spec
    m = engine_model(spec, 256, restart_seconds=60.0, surge_pods=0)
    assert m is not None
    return m


def measured_pytorch(rate: float, cap: int = 4) -> KvWindow:
    """Light traffic that 4 slots serve per the model, yet the pods queued beside a full batch, with no latency
    histograms: a PyTorch window as kvpilot builds it (maxBatchSize* 0)."""
    w = window_of(full_with_queue(cap=cap))
    return replace(w, arrival_rate=rate, prompt_mean=220, output_mean=250, completion_rate=min(rate, 3.0))


def test_the_model_check_runs_on_the_pytorch_backend() -> None:
    """Before: maxBatchSizeRuntime 0 switched the check off. Now the limit in force is the rendered one, confirmed
    by the cap, and the queue beside the full batch is the evidence, as on TensorRT."""
    w = measured_pytorch(1.7)
    assert w.runtime_batch_size == 0
    why = model_check(model(), w, rendered=4)
    assert why is not None and "queued beside a full batch" in why
    # The same with nothing rendered known: the cap alone names the limit.
    assert model_check(model(), w) is not None
    # A true overload: the model sees it too and stays trusted.
    assert model_check(model(), measured_pytorch(12.0), rendered=4) is None
    # Nothing queued: nothing to check.
    assert model_check(model(), replace(w, mean_queued=0.0), rendered=4) is None


def test_the_planner_hands_the_rendered_limit_and_pp_to_the_model_check() -> None:
    from kvpilot import planning
    from kvpilot.api.status import BatchingStatus, EngineInfo, EngineStatus
    from kvpilot.desired.observed import Observed

    e = engine(runtime__simulation={"profile": PROFILE}, autotune={"mode": "Auto", "maxBatchSize": 256})
    status = EngineStatus(engine=EngineInfo(max_batch_size=256), batching=BatchingStatus(max_batch_size=4))
    assert planning.model_reproduces(e, Observed(kv=measured_pytorch(1.7), status=status)) is False
    # A pod claiming a cap of 2 where 4 was rendered, its batch "full" at 2 beside a queue: not believed; against
    # the rendered 4 the batch was not full, so there is no evidence against the model.
    claimed = measured_pytorch(1.7, cap=2)
    assert claimed.full_waiting_share == 1.0 and claimed.peak_active == 2
    assert planning.model_reproduces(e, Observed(kv=claimed, status=status)) is True


def kvsim_window(tmp_path: Path, max_batch_size: int, pp: int, requests: int) -> KvWindow:
    """What kvsim's PyTorch trtllm-serve answers on GET /metrics (its route, its JSON), as kvpilot reads it."""
    from kvsim.serve.args import parse
    from kvsim.serve.server import SimServer
    from kvsim.serve.settings import resolve
    from kvsim.trtllm.checkpoint import main as checkpoint_main

    checkpoint_main(["--profile", PROFILE, "--output_dir", str(tmp_path / "ckpt")])
    (tmp_path / "extra.yaml").write_text("enable_iter_perf_stats: true\n")
    env = {"KVSIM_PROFILE": PROFILE, "KVSIM_TRTLLM_RELEASE": "1.4"}
    argv = [str(tmp_path / "ckpt"), "--backend", "pytorch", "--max_batch_size", str(max_batch_size),
            "--max_seq_len", "4096", "--pp_size", str(pp), "--extra_llm_api_options", str(tmp_path / "extra.yaml")]
    server = SimServer(resolve(parse(argv), env))
    for _ in range(requests):
        server.submit(list(range(300)), 200)
    samples = []
    for step in range(1, 7):
        server.engine.advance_to(0.5 * step)
        reply = asyncio.run(server.iteration_stats(None))  # type: ignore[arg-type]
        samples += parse_iteration_stats(decode_json(reply.body), 0.5 * step)
    w = summarize({"pod": samples}, window_seconds=3.0)
    assert w is not None
    return w


def test_kvsim_s_pytorch_server_reports_what_the_tuner_reads(tmp_path: Path) -> None:
    w = kvsim_window(tmp_path, max_batch_size=8, pp=1, requests=30)
    assert (w.runtime_batch_size, w.active_limit, w.peak_active) == (0, 8, 8) and w.peak_queued > 0
    assert limit_in_force(w, rendered=8) == 8 and waiting_beside_full_batch(w, rendered=8)
    assert not waiting_beside_full_batch(w, rendered=16)  # rendered 16, cap 8: not believed, and 8 < 16


def test_kvsim_s_pytorch_server_multiplies_the_cap_by_pp(tmp_path: Path) -> None:
    w = kvsim_window(tmp_path, max_batch_size=8, pp=2, requests=40)
    assert w.active_limit == 16 and limit_in_force(w, rendered=8, pipeline_parallel=2) == 8
    assert waiting_beside_full_batch(w, rendered=8, pipeline_parallel=2)
    assert 0 < w.full_waiting_share <= 1

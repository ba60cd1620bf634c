"""Iteration stats: trtllm-serve's field names, drain-on-read, bounded buffer, consistent block counts."""

from __future__ import annotations

import re

from kvsim.request import Request

from .helpers import run_all

TOP = {"timestamp", "iter", "iterLatencyMS", "numActiveRequests", "numQueuedRequests", "numCompletedRequests",
       "maxNumActiveRequests", "maxBatchSizeStatic", "maxBatchSizeTunerRecommended", "maxBatchSizeRuntime",
       "maxNumTokensStatic", "maxNumTokensRuntime", "gpuMemUsage", "kvCacheStats", "inflightBatchingStats"}
KV = {"maxNumBlocks", "freeNumBlocks", "usedNumBlocks", "tokensPerBlock", "allocTotalBlocks", "allocNewBlocks",
      "reusedBlocks", "missedBlocks", "cacheHitRate"}
IFB = {"numScheduledRequests", "numContextRequests", "numGenRequests", "numPausedRequests", "numCtxTokens",
       "microBatchId", "avgNumDecodedTokensPerIter"}


def test_fields_and_consistency(make_engine):
    engine = make_engine(capacity_policy="MAX_UTILIZATION")
    run_all(engine, [Request(100, 1400, arrival_s=i * 1e-3) for i in range(3)], step_s=0.05)
    engine2 = make_engine(iter_stats_max_iterations=100000, capacity_policy="MAX_UTILIZATION")
    run_all(engine2, [Request(100, 1400, arrival_s=i * 1e-3) for i in range(3)])
    stats = engine2.drain_iteration_stats()
    assert stats
    for s in stats:
        assert TOP <= s.keys() and KV <= s["kvCacheStats"].keys() and IFB <= s["inflightBatchingStats"].keys()
        kv = s["kvCacheStats"]
        assert kv["freeNumBlocks"] + kv["usedNumBlocks"] == kv["maxNumBlocks"]
        assert re.fullmatch(r"\d\d-\d\d-\d{4} \d\d:\d\d:\d\d\.\d{6}", s["timestamp"])
    iters = [s["iter"] for s in stats]
    assert iters == sorted(iters) and len(set(iters)) == len(iters)
    assert any(s["inflightBatchingStats"]["numPausedRequests"] > 0 for s in stats)
    assert engine2.drain_iteration_stats() == []  # drained on read


def test_buffer_is_bounded(make_engine):
    engine = make_engine(iter_stats_max_iterations=5)
    run_all(engine, [Request(100, 30, arrival_s=i * 0.01) for i in range(20)])
    stats = engine.drain_iteration_stats()
    assert len(stats) == 5
    assert stats[-1]["iter"] == engine.iteration

"""Shared helpers for the kvsim tests: small engines whose pools fill up quickly."""

from __future__ import annotations

from kvsim.config import EngineConfig
from kvsim.engine import Engine
from kvsim.request import Request


def small_config(**overrides) -> EngineConfig:
    """An 8B FP8 H100 engine shrunk to a pool of ``kv_max_tokens`` tokens (default 4096) so tests hit limits."""
    base = dict(kv_max_tokens=4096, max_seq_len=4096, tokens_per_block=16, max_batch_size=64,
                build_max_batch_size=64, build_max_num_tokens=2048)
    base.update(overrides)
    return EngineConfig(**base)


def run_all(engine: Engine, requests: list[Request], step_s: float | None = None) -> None:
    for r in requests:
        engine.submit(r)
    if step_s is None:
        engine.run_until_idle()
        return
    while not engine.idle:
        engine.advance_to(engine.now + step_s)
        engine.check_invariants()


# Flags of the blog that inspired kvpilot, which TensorRT-LLM 1.x does not have. Spelled without their dashes
# so the repository never carries them as flags; the tests prepend "--" and check they are rejected.
BLOG_ONLY_FLAGS = ("use_inflight_batching", "enable_paged_kv_cache", "paged_kv_cache_block_size")


def flag(name: str) -> str:
    return f"--{name}"

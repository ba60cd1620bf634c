"""Enumerations and bounds shared by the schema sections."""

from __future__ import annotations

ARCHITECTURES = ("llama", "mistral", "mixtral", "qwen", "gemma")
BACKENDS = ("tensorrt", "pytorch", "simulated")
DTYPES = ("float16", "bfloat16")
QUANTIZATIONS = ("none", "fp8", "int4_awq", "int8_weight_only", "nvfp4")
KV_CACHE_DTYPES = ("auto", "fp8", "int8")
SCHEDULER_POLICIES = ("GuaranteedNoEvict", "MaxUtilization")
ROLLOUT_STRATEGIES = ("Auto", "Surge", "NoSurge")
SIMULATION_PROFILES = (
    "llama-3.1-8b-fp8-h100",
    "llama-3.1-8b-bf16-h100",
    "llama-3.1-8b-bf16-a100",
    "llama-3.1-8b-fp8-h200",
    "llama-3.1-8b-fp8-l40s",
    "llama-3.1-8b-fp8-l4",
    "llama-3.1-70b-fp8-h100-tp2",
    "llama-3.1-70b-fp8-h100-tp4",
    "llama-3.1-70b-bf16-h100-tp4",
    "llama-3.1-70b-fp8-h200",
    "llama-3.1-405b-bf16-h100-tp8-pp2",
)
TOKENS_PER_BLOCK_CHOICES = (2, 4, 8, 16, 32, 64, 128)
MAX_BATCH = 16384
TUNER_MAX_DEFAULT = 1024  # autotune.maxBatchSize when absent and the start is at most this (models.parse_spec)
MAX_TOKENS = 1048576
MAX_BUILD_SECONDS = 172800  # the largest build.timeoutSeconds (activeDeadlineSeconds) admission allows

"""Fingerprint table tests: build inputs change it; serving-only and batching-only changes do not."""

from __future__ import annotations

import pytest

from kvpilot.desired.fingerprint import compute_fingerprint
from tests.unit.helpers import engine

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.2.0"


def fp(image: str = IMAGE, ceiling: int | None = None, **overrides: object) -> str:
    spec = engine("tensorrt", **overrides).spec
    return compute_fingerprint(spec, image, ceiling if ceiling is not None else spec.build.max_batch_size)


KEEPS = {
    "replicas": {"serving__replicas": 4},
    "runtime batch size": {"batching__maxBatchSize": 128},
    "runtime tokens": {"batching__maxNumTokens": 4096},
    "scheduler policy": {"batching__schedulerPolicy": "MaxUtilization"},
    "kv memory percent": {"batching__kvCacheFreeGpuMemoryPercent": 80},
    "block reuse": {"batching__enableBlockReuse": False},
    "startup timeout": {"serving__startupTimeoutSeconds": 60},
    "rollout": {"serving__rollout": {"maxSurge": 1, "maxUnavailable": 0}},
    "autotune": {"autotune": {"mode": "Auto", "maxBatchSize": 256}},
    "port": {"serving__port": 9000},
    "build timeout": {"build__timeoutSeconds": 600},
}
CHANGES = {
    "dtype": {"build__dtype": "float16"},
    "quantization": {"build__quantization": "fp8"},
    "kv dtype": {"build__kvCacheDtype": "fp8"},
    "tensor parallel": {"build__tensorParallelSize": 2},
    "pipeline parallel": {"build__pipelineParallelSize": 2},
    "tokens per block": {"build__kvCache": {"tokensPerBlock": 64}},
    "ceiling": {"build__maxBatchSize": 1024},
    "max input": {"build__maxInputLen": 2048},
    "max seq": {"build__maxSeqLen": 16384},
    "max tokens": {"build__maxNumTokens": 16384},
    "beam width": {"build__maxBeamWidth": 2},
    "multiple profiles": {"build__multipleProfiles": False},
    "revision": {"model__revision": "abc123"},
    "source": {"model__source": "hf://meta-llama/Llama-3.1-70B-Instruct"},
    "architecture": {"model__architecture": "mistral"},
    "gpu product": {"serving__gpuProduct": "NVIDIA-H200"},
}


@pytest.mark.parametrize("overrides", KEEPS.values(), ids=KEEPS.keys())
def test_serving_and_batching_changes_keep_the_fingerprint(overrides: dict) -> None:
    assert fp(**overrides) == fp()


@pytest.mark.parametrize("overrides", CHANGES.values(), ids=CHANGES.keys())
def test_build_input_changes_change_the_fingerprint(overrides: dict) -> None:
    assert fp(**overrides) != fp()


def test_image_changes_the_fingerprint() -> None:
    assert fp(image="nvcr.io/nvidia/tensorrt-llm/release:1.2.1") != fp()


def test_a_tuner_raised_ceiling_changes_the_fingerprint() -> None:
    assert fp(ceiling=1024) != fp(ceiling=512)


def test_fingerprint_is_stable_and_hex() -> None:
    value = fp()
    assert value == fp() and len(value) == 64 and int(value, 16) >= 0

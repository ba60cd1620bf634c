"""InferenceEngine manifests for tests: a valid base and a table of invalid variants.

The same table runs offline (``kvpilot render``'s validator) and against a real API server (admission),
so both must reject each case with a message naming what must hold.
"""

from __future__ import annotations

import copy
from typing import Any

API = "serving.kvpilot.io/v1alpha1"


def base(name: str = "valid", backend: str = "simulated") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {
            "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
            "revision": "0e9e39f249a16976918f6564b8830bc894c89659",
            "architecture": "llama",
        },
        "runtime": {"backend": backend},
        "engineCache": {"claimName": "engines"},
        "serving": {"gpuProduct": "NVIDIA-H100-80GB-HBM3"},
    }
    if backend == "simulated":
        spec["runtime"]["simulation"] = {"profile": "llama-3.1-8b-fp8-h100"}
    return {"apiVersion": API, "kind": "InferenceEngine", "metadata": {"name": name}, "spec": spec}


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    if value is _DELETE:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return out


_DELETE = object()

# (id, path to set, value, field the error must name, words the message must contain)
INVALID: list[tuple[str, str, Any, str, str]] = [
    ("batch-above-ceiling", "spec.batching.maxBatchSize", 1024, "spec.batching.maxBatchSize", "build.maxBatchSize"),
    ("tokens-above-build", "spec.batching.maxNumTokens", 16384, "spec.batching.maxNumTokens", "build.maxNumTokens"),
    ("input-not-below-seq", "spec.build.maxInputLen", 8192, "spec.build.maxInputLen", "maxSeqLen"),
    ("tokens-per-block-not-pow2", "spec.build.kvCache.tokensPerBlock", 48, "spec.build.kvCache.tokensPerBlock",
     "power of two"),
    ("tokens-per-block-too-big", "spec.build.kvCache.tokensPerBlock", 256, "spec.build.kvCache.tokensPerBlock",
     "128"),
    ("inflight-needs-paged", "spec.build.kvCache.type", "continuous", "spec.build.kvCache.type", "paged"),
    ("autotune-min-above-max", "spec.autotune.minBatchSize", 2048, "spec.autotune.minBatchSize", "maxBatchSize"),
    ("percent-zero", "spec.autotune.targetKvCacheUtilizationPercent", 0,
     "spec.autotune.targetKvCacheUtilizationPercent", "1"),
    ("percent-above-100", "spec.batching.kvCacheFreeGpuMemoryPercent", 101,
     "spec.batching.kvCacheFreeGpuMemoryPercent", "100"),
    ("source-scheme", "spec.model.source", "http://example.com/model", "spec.model.source", "hf://"),
    ("hf-needs-revision", "spec.model.revision", _DELETE, "spec.model.revision", "revision"),
    ("unknown-backend", "spec.runtime.backend", "vllm", "spec.runtime.backend", "tensorrt"),
    ("unknown-quantization", "spec.build.quantization", "int3", "spec.build.quantization", "fp8"),
    ("unknown-architecture", "spec.model.architecture", "gpt5", "spec.model.architecture", "llama"),
    ("batch-wrong-type", "spec.batching.maxBatchSize", "sixty-four", "spec.batching.maxBatchSize", "integer"),
    ("replicas-negative", "spec.serving.replicas", -1, "spec.serving.replicas", "0"),
    ("unknown-field", "spec.build.useInflightBatching", True, "spec.build.useInflightBatching", "unknown field"),
    ("tensorrt-needs-architecture", "spec.model.architecture", _DELETE, "spec.model", "architecture"),
    ("simulated-needs-profile", "spec.runtime.simulation", _DELETE, "spec.runtime", "simulation"),
    ("cache-needs-claim-or-size", "spec.engineCache", {"accessMode": "ReadWriteOnce"}, "spec.engineCache",
     "claimName"),
    ("rollout-cannot-progress", "spec.serving.rollout", {"maxSurge": 0, "maxUnavailable": 0}, "spec.serving.rollout",
     "maxSurge"),
    ("prometheus-needs-url", "spec.autotune.metrics", {"source": "Prometheus"}, "spec.autotune.metrics.url", "url"),
    ("metrics-url-metadata-ip", "spec.autotune.metrics", {"source": "Prometheus", "url": "http://169.254.169.254/latest"},
     "spec.autotune.metrics.url", "cluster-local"),
    ("metrics-url-external-host", "spec.autotune.metrics", {"source": "Prometheus", "url": "https://example.com"},
     "spec.autotune.metrics.url", "cluster-local"),
    ("metrics-url-userinfo", "spec.autotune.metrics",
     {"source": "Prometheus", "url": "http://a:b@prometheus.monitoring.svc:9090"}, "spec.autotune.metrics.url",
     "cluster-local"),
    ("metrics-url-scheme", "spec.autotune.metrics", {"source": "Prometheus", "url": "file:///etc/passwd"},
     "spec.autotune.metrics.url", "cluster-local"),
    ("gemma-no-pipeline", "spec.build.pipelineParallelSize", 2, "spec.build.pipelineParallelSize", "gemma"),
    ("chunking-off-long-prompt", "spec.batching.enableChunkedContext", False, "spec.batching.enableChunkedContext",
     "maxInputLen"),
    ("bad-gpu-product", "spec.serving.gpuProduct", "H100 80GB", "spec.serving.gpuProduct", "match"),
    ("bad-name", "metadata.name", "Llama_8B", "metadata.name", "DNS-1035"),
    ("pytorch-no-quantization", "spec.build.quantization", "fp8", "spec.build", "pre-quantized"),
]


def invalid_case(case_id: str, name: str | None = None) -> dict[str, Any]:
    """The manifest of one invalid case (named ``name`` unless the case is about the name)."""
    cid, path, value, _field, _words = next(c for c in INVALID if c[0] == case_id)
    backend = {"tensorrt-needs-architecture": "tensorrt", "pytorch-no-quantization": "pytorch"}.get(cid, "simulated")
    doc = base(name or cid, backend=backend)
    if cid == "gemma-no-pipeline":
        doc = _set(doc, "spec.model.architecture", "gemma")
    if cid == "chunking-off-long-prompt":
        doc = _set(doc, "spec.build.maxInputLen", 4096)
        doc = _set(doc, "spec.batching.maxNumTokens", 2048)
    return _set(doc, path, value)


def override(doc: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A copy of ``doc`` with spec fields replaced; keys use '__' for '.', e.g. build__maxBatchSize=1024."""
    out = copy.deepcopy(doc)
    for key, value in spec.items():
        node = out["spec"]
        parts = key.split("__")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out

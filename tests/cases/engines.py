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
    ("autotune-min-above-max", "spec.autotune.minBatchSize", 600, "spec.autotune.minBatchSize", "maxBatchSize"),
    ("autotune-min-above-implied-max", "spec.autotune.minBatchSize", 2048, "spec.autotune.minBatchSize",
     "the larger of 1024 and batching.maxBatchSize"),
    ("autotune-min-above-a-high-start", "spec.autotune.minBatchSize", 2049, "spec.autotune.minBatchSize",
     "the larger of 1024 and batching.maxBatchSize"),
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
    ("ranks-not-whole-nodes", "spec.build.tensorParallelSize", 12, "spec.serving.gpusPerNode",
     "build.tensorParallelSize x build.pipelineParallelSize"),
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
    ("bad-gpu-product", "spec.serving.gpuProduct", "H100 80GB", "spec.serving.gpuProduct", "label value"),
    ("bad-name", "metadata.name", "Llama_8B", "metadata.name", "DNS-1035"),
    ("pytorch-quantization", "spec.build.quantization", "int4_awq", "spec.build", "none, fp8 or nvfp4"),
    ("pytorch-quantize-needs-cache", "spec.engineCache", _DELETE, "spec.build", "need engineCache"),
    # Issue 19: a TensorRT engine on a TensorRT-LLM release without the TensorRT backend (1.3.0rc21 and later).
    ("tensorrt-on-pytorch-only-image", "spec.runtime.image", "nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc1",
     "spec.runtime.image", "set runtime.backend: pytorch"),
    ("simulated-tensorrt-on-pytorch-only-release", "spec.runtime.env",
     [{"name": "KVSIM_TRTLLM_RELEASE", "value": "1.3.0rc22"}], "spec.runtime.simulation.backend",
     "set runtime.simulation.backend: pytorch"),
    # Issue 13: values that reach the build script (shell characters, option-like, traversal).
    ("source-command-substitution", "spec.model.source", "pvc://models/llama/$(touch /tmp/x)", "spec.model.source",
     "shell characters"),
    ("source-semicolon", "spec.model.source", "pvc://models/llama;touch", "spec.model.source", "shell characters"),
    ("source-quote", "spec.model.source", "pvc://models/it's", "spec.model.source", "shell characters"),
    ("source-space", "spec.model.source", "pvc://models/with space", "spec.model.source", "shell characters"),
    ("source-traversal", "spec.model.source", "pvc://models/../etc", "spec.model.source", "do not start with '.'"),
    ("source-trailing-newline", "spec.model.source", "hf://org/name\n", "spec.model.source", "shell characters"),
    ("revision-trailing-newline", "spec.model.revision", "main\n", "spec.model.revision", "commit, tag or branch"),
    ("revision-option", "spec.model.revision", "--help", "spec.model.revision", "commit, tag or branch"),
    ("dataset-option", "spec.build.calibration.dataset", "--tp_size", "spec.build.calibration.dataset",
     "Hugging Face dataset"),
    ("dataset-bad-claim", "spec.build.calibration.dataset", "pvc://Data_Sets/x", "spec.build.calibration.dataset",
     "pvc://<claim>"),
    ("image-with-space", "spec.runtime.image", "img:1 ; rm -rf /", "spec.runtime.image", "image reference"),
    # Issue 13: limits the child objects hit at the API server (label values, qualified names, tolerations).
    ("claim-name-too-long", "spec.engineCache.claimName", "c" * 64, "spec.engineCache.claimName", "63"),
    ("gpu-product-too-long", "spec.serving.gpuProduct", "G" * 64, "spec.serving.gpuProduct", "63"),
    ("gpu-product-trailing-dash", "spec.serving.gpuProduct", "H100-", "spec.serving.gpuProduct", "label value"),
    ("node-selector-bad-key", "spec.serving.nodeSelector", {"bad key": "x"}, "spec.serving.nodeSelector",
     "qualified name"),
    ("node-selector-long-prefix", "spec.serving.nodeSelector", {"a" * 254 + "/zone": "x"},
     "spec.serving.nodeSelector", "qualified name"),
    ("node-selector-bad-value", "spec.serving.nodeSelector", {"zone": "us east"}, "spec.serving.nodeSelector.zone",
     "label value"),
    ("node-selector-long-value", "spec.serving.nodeSelector", {"zone": "z" * 64}, "spec.serving.nodeSelector.zone",
     "63"),
    ("toleration-exists-with-value", "spec.serving.tolerations", [{"key": "k", "operator": "Exists", "value": "v"}],
     "spec.serving.tolerations[0].value", "must be empty"),
    ("toleration-no-key-equal", "spec.serving.tolerations", [{"operator": "Equal", "value": "v"}],
     "spec.serving.tolerations[0].operator", "must be Exists"),
    ("toleration-seconds-not-noexecute", "spec.serving.tolerations",
     [{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}],
     "spec.serving.tolerations[0].effect", "NoExecute"),
    ("toleration-bad-key", "spec.serving.tolerations", [{"key": "a b", "operator": "Exists"}],
     "spec.serving.tolerations[0].key", "qualified name"),
    ("resources-bad-key", "spec.build.resources", {"requests": {"ｆｕｌｌ": "1"}}, "spec.build.resources.requests",
     "every key must be cpu"),
    ("resources-negative", "spec.serving.resources", {"limits": {"memory": "-1Gi"}},
     "spec.serving.resources.limits.memory", "must be >= 0"),
    ("cache-size-zero", "spec.engineCache", {"size": "0Gi"}, "spec.engineCache.size", "must be > 0"),
    ("cache-size-negative-int", "spec.engineCache", {"size": -5}, "spec.engineCache.size", "must be > 0"),
    ("integer-beyond-int64", "spec.serving.tolerations",
     [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2**70}],
     "spec.serving.tolerations[0].tolerationSeconds", "integer"),
    ("toleration-bad-value", "spec.serving.tolerations", [{"key": "k", "value": "v" * 64}],
     "spec.serving.tolerations[0].value", "63"),
]

# Values at the edge of what must stay accepted (the restrictions above must not refuse real names).
VALID_EDGES: list[tuple[str, str, Any]] = [
    ("pvc-nested-path", "spec.model.source", "pvc://models/llama-3.1/8B_instruct/v1.0/"),
    ("pvc-claim-only", "spec.model.source", "pvc://models"),
    ("s3-partitioned", "spec.model.source", "s3://my-bucket.eu/models/llama/date=2026-11-01/"),
    ("hf-dots", "spec.model.source", "hf://Qwen/Qwen2.5-7B-Instruct"),
    ("revision-branch", "spec.model.revision", "refs/pr/12"),
    ("dataset-org", "spec.build.calibration.dataset", "abisee/cnn_dailymail"),
    ("dataset-pvc", "spec.build.calibration.dataset", "pvc://datasets/cnn_dailymail"),
    ("image-digest", "spec.runtime.image", "nvcr.io/nvidia/tensorrt-llm/release:1.2.0@sha256:" + "a" * 64),
    ("claim-63", "spec.engineCache.claimName", "c" * 63),
    ("gpu-63", "spec.serving.gpuProduct", "G" * 63),
    ("node-selector-qualified", "spec.serving.nodeSelector", {"topology.kubernetes.io/zone": "us-east-1a",
                                                              "pool": ""}),
    ("resources-extended", "spec.build.resources", {"requests": {"cpu": "500m", "memory": 0, "hugepages-2Mi": "1Gi",
                                                                 "rdma/hca": 1}}),
    ("null-is-absent", "spec.serving.replicas", None),
    ("null-object-is-absent", "spec.autotune", None),
    ("cache-size-fraction", "spec.engineCache", {"size": "0.5Ti"}),
    ("tolerate-everything", "spec.serving.tolerations", [{"operator": "Exists"}]),
    ("toleration-noexecute", "spec.serving.tolerations",
     [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}]),
    # From TensorRT-LLM's default start, with no autotune.maxBatchSize, the tuner's bound is the start: a floor
    # up to it holds.
    ("autotune-min-at-a-high-start", "spec.autotune.minBatchSize", 2048),
    ("autotune-min-1024-at-a-low-start", "spec.autotune.minBatchSize", 1024),
]


def valid_edge(case_id: str, name: str | None = None) -> dict[str, Any]:
    cid, path, value = next(c for c in VALID_EDGES if c[0] == case_id)
    doc = base(name or cid)
    if cid == "autotune-min-at-a-high-start":
        doc = _set(_set(doc, "spec.build.maxBatchSize", 2048), "spec.batching.maxBatchSize", 2048)
    return _set(doc, path, value)


def invalid_case(case_id: str, name: str | None = None) -> dict[str, Any]:
    """The manifest of one invalid case (named ``name`` unless the case is about the name)."""
    cid, path, value, _field, _words = next(c for c in INVALID if c[0] == case_id)
    backend = {"tensorrt-needs-architecture": "tensorrt", "pytorch-quantization": "pytorch",
               "pytorch-quantize-needs-cache": "pytorch", "tensorrt-on-pytorch-only-image": "tensorrt"}.get(cid, "simulated")
    doc = base(name or cid, backend=backend)
    if cid == "pytorch-quantize-needs-cache":
        doc = _set(doc, "spec.build.quantization", "fp8")
    if cid == "gemma-no-pipeline":
        doc = _set(doc, "spec.model.architecture", "gemma")
    if cid == "autotune-min-above-max":
        doc = _set(doc, "spec.autotune.maxBatchSize", 512)
    if cid == "autotune-min-above-a-high-start":
        doc = _set(_set(doc, "spec.build.maxBatchSize", 4096), "spec.batching.maxBatchSize", 2048)
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

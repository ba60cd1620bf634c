"""The OpenAPI schema of ``InferenceEngine.spec``: every field, its description, default, bounds and rules.

This is the single definition of the user-facing API. ``kvpilot crd`` renders it into the CRD in ``crds/``;
``kvpilot render`` validates and defaults manifests against it offline; ``tests/unit/test_api_parity.py``
proves the typed models in ``models.py`` agree with it field for field.
"""

from __future__ import annotations

from kvpilot.api.enums import TUNER_MAX_DEFAULT
from kvpilot.api.openapi import Rule, Schema, expand_object_defaults, obj
from kvpilot.api.schema_build import BACKEND_RULES, build_schema, model_schema, runtime_schema
from kvpilot.api.schema_serving import (
    MULTINODE_RULES,
    autotune_schema,
    batching_schema,
    engine_cache_schema,
    serving_schema,
)


SPEC_RULES = (
    *BACKEND_RULES,  # the backend and its TensorRT-LLM release (schema_build.py)
    Rule(
        "!has(self.model.architecture) || self.model.architecture != 'gemma' || "
        "self.build.pipelineParallelSize == 1",
        "build.pipelineParallelSize must be 1 for gemma: its checkpoint converter supports tensor parallelism only",
        ".build.pipelineParallelSize",
    ),
    Rule(
        "self.runtime.backend == 'pytorch' || self.batching.maxBatchSize <= self.build.maxBatchSize",
        "batching.maxBatchSize must be <= build.maxBatchSize (the engine's ceiling): trtllm-serve refuses a larger "
        "runtime value",
        ".batching.maxBatchSize",
    ),
    Rule(
        f"has(self.autotune.maxBatchSize) || self.autotune.minBatchSize <= {TUNER_MAX_DEFAULT} || "
        "self.autotune.minBatchSize <= self.batching.maxBatchSize",
        f"autotune.minBatchSize must be <= autotune.maxBatchSize, which when absent is the larger of "
        f"{TUNER_MAX_DEFAULT} and batching.maxBatchSize",
        ".autotune.minBatchSize",
    ),
    Rule(
        "self.runtime.backend == 'pytorch' || self.batching.maxNumTokens <= self.build.maxNumTokens",
        "batching.maxNumTokens must be <= build.maxNumTokens",
        ".batching.maxNumTokens",
    ),
    Rule(
        "self.batching.mode != 'inflight' || self.build.kvCache.type == 'paged'",
        "in-flight batching (batching.mode inflight) requires a paged KV cache (build.kvCache.type paged)",
        ".build.kvCache.type",
    ),
    Rule(
        "self.batching.enableChunkedContext || self.build.maxInputLen <= self.batching.maxNumTokens",
        "without chunked context, build.maxInputLen must be <= batching.maxNumTokens (a prompt is one iteration)",
        ".batching.enableChunkedContext",
    ),
    Rule(
        "self.runtime.backend != 'tensorrt' || has(self.model.architecture)",
        "model.architecture must be set for backend tensorrt: it selects the checkpoint converter",
        ".model",
    ),
    Rule(
        "self.runtime.backend != 'simulated' || has(self.runtime.simulation)",
        "runtime.simulation must be set when runtime.backend is simulated",
        ".runtime",
    ),
    Rule(
        "self.runtime.backend == 'pytorch' || has(self.engineCache)",
        "engineCache must be set for backends that build an engine (tensorrt, simulated)",
    ),
)


def spec_schema() -> Schema:
    """The full ``spec`` schema."""
    schema = obj(
        "The desired model, engine, serving pods and tuning. kvpilot never writes spec: tuned values live in status.",
        {
            "model": model_schema(),
            "runtime": runtime_schema(),
            "build": build_schema(),
            "batching": batching_schema(),
            "serving": serving_schema(),
            "engineCache": engine_cache_schema(),
            "autotune": autotune_schema(),
        },
        required=("model",),
        rules=SPEC_RULES + MULTINODE_RULES,
    )
    return expand_object_defaults(schema)

"""Schema sections for how it runs: batching, serving pods, engine cache and autotune (no rebuilds)."""

from __future__ import annotations

import json

from kvpilot.api.openapi import (
    DNS1123_SUBDOMAIN,
    POSITIVE,
    Rule,
    Schema,
    array,
    boolean,
    integer,
    obj,
    quantity,
    resources,
    string,
    string_map,
)
from kvpilot.api.metrics_url import METRICS_URL_PATTERN, METRICS_URL_RULE_MESSAGE
from kvpilot.api.enums import MAX_BATCH, MAX_TOKENS, ROLLOUT_STRATEGIES, SCHEDULER_POLICIES, TUNER_MAX_DEFAULT
from kvpilot.api import patterns as P


def batching_schema() -> Schema:
    return obj(
        "Runtime batching of trtllm-serve. Changing these rolls the pods; it never rebuilds the engine.",
        {
            "mode": string(
                "inflight: requests join and leave the batch every iteration (continuous batching); static: a "
                "batch runs to completion before the next is admitted (TensorRT-LLM STATIC_BATCH).",
                enum=("inflight", "static"),
                default="inflight",
            ),
            "maxBatchSize": integer(
                "The runtime max_batch_size to start from (at most build.maxBatchSize). When autotune runs in "
                "Auto mode the value in force is status.batching.maxBatchSize.",
                1,
                MAX_BATCH,
                default=64,
            ),
            "maxNumTokens": integer(
                "Runtime token budget per iteration (at most build.maxNumTokens).", 1, MAX_TOKENS, default=8192
            ),
            "schedulerPolicy": string(
                "GuaranteedNoEvict reserves every admitted request's blocks to completion, so a started request is "
                "never paused; MaxUtilization packs more requests and pauses the newest when blocks run out.",
                enum=SCHEDULER_POLICIES,
                default="GuaranteedNoEvict",
            ),
            "kvCacheFreeGpuMemoryPercent": integer(
                "Share of the GPU memory left after weights and activations that the KV-cache pool takes.",
                1,
                100,
                default=90,
            ),
            "enableBlockReuse": boolean("Reuse KV-cache blocks of shared prompt prefixes.", default=True),
            "enableChunkedContext": boolean(
                "Split long prompts over several iterations (chunked prefill).", default=True
            ),
            "dynamicBatchSizeTuning": boolean(
                "TensorRT-LLM's in-engine tuner (dynamic_batch_config.enable_batch_size_tuning); it can only lower "
                "the effective batch size below the runtime maxBatchSize.",
                default=True,
            ),
        },
        default={},
    )


def serving_schema() -> Schema:
    toleration = obj(
        "A toleration, as in a Pod spec.",
        {
            "key": string("Taint key (a qualified name; empty with operator Exists matches every taint).",
                          max_length=317, rules=(Rule(P.qualified_name_cel("self") + " || self == ''",
                                                      P.QUALIFIED_NAME_MESSAGE),)),
            "operator": string("Exists or Equal (default).", enum=("Exists", "Equal")),
            "value": string("Taint value (a label value; empty for Exists).", max_length=P.LABEL_VALUE_MAX,
                            rules=(P.label_value_rule(),)),
            "effect": string("Taint effect.", enum=("NoSchedule", "PreferNoSchedule", "NoExecute")),
            "tolerationSeconds": integer("How long a NoExecute taint is tolerated.", 0, None, fmt="int64"),
        },
        # The API server's own checks of a Pod's tolerations (k8s.io/kubernetes validateTolerations).
        rules=(
            Rule("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
                 "value must be empty when operator is Exists", ".value"),
            Rule("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
                 "operator must be Exists when key is empty (which means: match every key and value)", ".operator"),
            Rule("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                 "effect must be NoExecute when tolerationSeconds is set", ".effect"),
        ),
    )
    node_selector = string_map("Extra node labels the pods require (label keys and values).", 32,
                               P.LABEL_VALUE_MAX)
    node_selector["additionalProperties"]["x-kubernetes-validations"] = [P.label_value_rule().to_schema()]
    node_selector["x-kubernetes-validations"] = [
        Rule(f"self.all(k, {P.qualified_name_cel('k')})", "every key " + P.QUALIFIED_NAME_MESSAGE).to_schema()
    ]
    return obj(
        "The pods that serve the engine with trtllm-serve's OpenAI-compatible API.",
        {
            "replicas": integer(
                "Serving replicas; each takes tensorParallelSize x pipelineParallelSize GPUs: one pod, or for a "
                "multi-node engine one group of pods (see gpusPerNode). Also reachable through the scale "
                "subresource (kubectl scale, HPA, KEDA).",
                0,
                1000,
                default=1,
            ),
            "gpuProduct": string(
                "GPU model to run on: the node label nvidia.com/gpu.product (e.g. NVIDIA-H100-80GB-HBM3). Builds run "
                "on it too, because engines are GPU-specific; it is part of the fingerprint.",
                max_length=P.LABEL_VALUE_MAX,
                rules=(P.label_value_rule(),),
            ),
            "gpusPerNode": integer(
                "GPUs one node gives the engine. An engine with more ranks (build.tensorParallelSize x "
                "build.pipelineParallelSize) than this spans several nodes: each replica becomes a group of "
                "ranks/gpusPerNode pods, one per node, served by a LeaderWorkerSet (docs/multinode.md).",
                1,
                MAX_GPUS_PER_NODE,
                default=8,
            ),
            "port": integer("Port of the OpenAI-compatible HTTP API.", 1, 65535, default=8000),
            "resources": resources("CPU and memory of each serving pod (GPUs follow the parallel sizes)."),
            "nodeSelector": node_selector,
            "tolerations": array("Tolerations of the serving and build pods.", toleration, 32),
            "priorityClassName": string("PriorityClass of the serving pods.", pattern=DNS1123_SUBDOMAIN),
            "startupTimeoutSeconds": integer(
                "How long a pod may take to load the model before it is restarted (the startupProbe budget).",
                10,
                86400,
                default=1800,
            ),
            "rollout": obj(
                "Rolling-update limits. The default (maxSurge 0, maxUnavailable 1) needs no spare GPU: it stops one "
                "old pod before starting its replacement.",
                {
                    "strategy": string(
                        "Auto: roll with surge (maxUnavailable 0, so serving capacity never drops) by as many pods "
                        "as the free GPUs of the pods' product place, up to every replica (then a rollout takes "
                        "one start-to-Ready time); with none free, use maxSurge/maxUnavailable. Surge: always "
                        "maxSurge 1, maxUnavailable 0 (a new pod waits for a GPU). NoSurge: always "
                        "maxSurge/maxUnavailable. The autotuner prices a restart with the strategy in force.",
                        enum=ROLLOUT_STRATEGIES,
                        default="Auto",
                    ),
                    "maxSurge": integer("Extra pods allowed during a rollout.", 0, 1000, default=0),
                    "maxUnavailable": integer("Pods that may be down during a rollout.", 0, 1000, default=1),
                },
                default={},
                rules=(
                    Rule(
                        "self.maxSurge + self.maxUnavailable >= 1",
                        "maxSurge and maxUnavailable must not both be 0: a rollout could never progress",
                    ),
                ),
            ),
        },
        default={},
    )


MAX_GPUS_PER_NODE = 64
MAX_NODES_PER_GROUP = 64  # pod names <name>-lws-<group>-<worker> must stay DNS labels (63 characters)
_RANKS = "(self.build.tensorParallelSize * self.build.pipelineParallelSize)"
# Spec-level rules (they read build and serving), added to SPEC_RULES in spec_schema.py.
MULTINODE_RULES = (
    Rule(
        f"{_RANKS} <= self.serving.gpusPerNode || {_RANKS} % self.serving.gpusPerNode == 0",
        "build.tensorParallelSize x build.pipelineParallelSize must be at most serving.gpusPerNode (one node) or "
        "a multiple of it: a multi-node engine spans whole nodes, each pod holding serving.gpusPerNode ranks",
        ".serving.gpusPerNode",
    ),
    Rule(
        f"{_RANKS} <= self.serving.gpusPerNode * {MAX_NODES_PER_GROUP}",
        f"build.tensorParallelSize x build.pipelineParallelSize must be at most {MAX_NODES_PER_GROUP} x "
        "serving.gpusPerNode: a multi-node engine spans at most "
        f"{MAX_NODES_PER_GROUP} nodes",
        ".serving.gpusPerNode",
    ),
    Rule(
        f"{_RANKS} <= self.serving.gpusPerNode || has(self.engineCache)",
        "engineCache must be set for a multi-node engine (build.tensorParallelSize x build.pipelineParallelSize "
        "above serving.gpusPerNode): the ranks on every node read the engine, or the prepared checkpoint, from "
        "one shared volume",
    ),
    Rule(
        f"{_RANKS} <= self.serving.gpusPerNode || !has(self.engineCache) || !has(self.engineCache.size) || "
        "self.engineCache.accessMode == 'ReadWriteMany'",
        "engineCache.accessMode must be ReadWriteMany for a multi-node engine: its pods on several nodes mount the "
        "same cache",
        ".engineCache.accessMode",
    ),
)


def engine_cache_schema() -> Schema:
    return obj(
        "The volume engines are cached on, each under its fingerprint, so the same engine is never built twice. "
        "Name an existing claim, or give a size (and storage class) for one the operator creates.",
        {
            "claimName": string(
                "An existing PersistentVolumeClaim, or the name of the one to create when size is set "
                "(default <name>-engines). At most 63 characters: it labels the engine index.",
                max_length=P.LABEL_VALUE_MAX,
                pattern=DNS1123_SUBDOMAIN,
            ),
            "storageClassName": string("StorageClass of the claim the operator creates.", pattern=DNS1123_SUBDOMAIN),
            "size": quantity("Size of the claim the operator creates, e.g. 200Gi.", rule=POSITIVE),
            "accessMode": string(
                "Access mode of the claim the operator creates; ReadWriteMany lets pods on several nodes share it.",
                enum=("ReadWriteOnce", "ReadWriteMany"),
                default="ReadWriteMany",
            ),
        },
        rules=(
            Rule(
                "has(self.claimName) || has(self.size)",
                "engineCache must name an existing claim (claimName) or ask for a new one (size)",
            ),
        ),
    )


def autotune_schema() -> Schema:
    return obj(
        "Retuning of the runtime maxBatchSize from the KV-cache pool the operator observes.",
        {
            "enabled": boolean("Observe the pods and decide.", default=True),
            "mode": string(
                "Auto applies decisions (a rolling restart, never a spec change); Advisory only records them in "
                "status.autotune.",
                enum=("Auto", "Advisory"),
                default="Advisory",
            ),
            "minBatchSize": integer("Lowest runtime maxBatchSize the tuner may set.", 1, MAX_BATCH, default=8),
            "maxBatchSize": integer(
                "Highest runtime maxBatchSize the tuner may set (also bounded by the engine's ceiling). When absent, "
                f"the larger of {TUNER_MAX_DEFAULT} and batching.maxBatchSize, so a start above {TUNER_MAX_DEFAULT} "
                "(TensorRT-LLM's default is 2048) is kept rather than clamped into the bounds at once.",
                1,
                MAX_BATCH,
            ),
            "targetKvCacheUtilizationPercent": integer(
                "KV-cache pool utilization (used/max blocks) to aim for at peak.", 1, 100, default=85
            ),
            "intervalSeconds": integer(
                "How often the tuner decides, over the pods' metrics of the last intervalSeconds (the pods are "
                "sampled every intervalSeconds/6, at most 5 s apart). 15 s, as the HorizontalPodAutoscaler's sync "
                "period: each interval of waiting is an interval served at the old limit.",
                5, 3600, default=15),
            "cooldownSeconds": integer(
                "Minimum time between two applied changes (each one restarts the pods).", 0, 86400, default=600
            ),
            "warmupSeconds": integer(
                "Metrics of a pod younger than this are ignored (cold caches mislead).", 0, 3600, default=60
            ),
            "canary": string(
                "In mode Auto, whether a change the tuner proposes for a gain (not a protective lower, a rollback "
                "or a correction into the bounds) is first tried on one pod beside the others behind the same "
                "Service (the <name>-kvpilot-canary Deployment), compared with them over the same windows, then promoted "
                "to every pod or rolled back; only for an engine of two or more replicas on a Deployment (a "
                "multi-node engine, or a single pod, is verified after the change instead). Auto: where the "
                "rollout cannot restart every pod at once (no free GPU for each), as there a bad change would "
                "otherwise reach pod after pod before it is judged; with a free GPU for every pod the rollout "
                "takes one start and verification judges the change after it. Always: every such change. Off (the "
                "default): none; every change rolls to every pod and is verified after it. A canary holds the "
                "other pods at the old value while it is judged (about four minutes): in the tuner suite, where "
                "the tuner's changes were gains, that cost up to 15% of a 30-minute run's goodput (docs/live-tuner.md, "
                "'Canary retunes'); it pays where a bad change is likely and costly.",
                enum=("Auto", "Always", "Off"),
                default="Off",
            ),
            "allowRebuild": boolean(
                "May raise the engine's ceiling (build.maxBatchSize in force) through a new build when the gain "
                "outweighs the build and restart cost.",
                default=False,
            ),
            "slo": obj(
                "Latency objectives; the tuner lowers the batch size rather than break them.",
                {
                    "timeToFirstTokenMillis": integer("Time to first token objective.", 1, 600000),
                    "timePerOutputTokenMillis": integer("Time per output token objective.", 1, 60000),
                },
            ),
            "metrics": obj(
                "Where the KV-cache metrics come from.",
                {
                    "source": string(
                        "Pod: each pod's trtllm-serve /metrics (iteration stats); Prometheus: a Prometheus server.",
                        enum=("Pod", "Prometheus"),
                        default="Pod",
                    ),
                    "url": string(
                        "Base URL of the Prometheus server (for source Prometheus): a cluster-local Service, "
                        "http(s)://<service>.<namespace>.svc[.<cluster domain>][:port][/path]. The operator "
                        "refuses other hosts and any name that resolves to a link-local or loopback address.",
                        max_length=512,  # keeps the CEL regex's estimated cost far below the API server's limit
                        rules=(Rule(f"self.matches({json.dumps(METRICS_URL_PATTERN)})", METRICS_URL_RULE_MESSAGE),),
                    ),
                },
                default={},
                rules=(
                    Rule(
                        "self.source != 'Prometheus' || has(self.url)",
                        "url must be set when source is Prometheus",
                        ".url",
                    ),
                ),
            ),
        },
        default={},
        rules=(
            Rule(
                "!has(self.maxBatchSize) || self.minBatchSize <= self.maxBatchSize",
                "minBatchSize must be <= maxBatchSize",
                ".minBatchSize",
            ),
        ),
    )

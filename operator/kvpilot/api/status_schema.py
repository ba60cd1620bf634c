"""The OpenAPI schema of ``InferenceEngine.status`` — what the operator observed and decided.

Only the operator writes status. The runtime batch size in force lives here (``status.batching``), never
in spec, so a GitOps tool that owns spec never fights the tuner. ``api/status.py`` holds the typed models of
this schema; ``tests/unit/test_api_parity.py`` keeps the two in step.
"""

from __future__ import annotations

from kvpilot.api.openapi import Schema, array, boolean, integer, map_list, obj, string

HISTORY_LIMIT = 20


def _condition() -> Schema:
    return obj(
        "A standard condition (metav1.Condition).",
        {
            "type": string("EngineReady, Available, Progressing or Degraded.", max_length=316),
            "status": string("True, False or Unknown.", enum=("True", "False", "Unknown")),
            "reason": string("A PascalCase reason.", max_length=1024),
            "message": string("What happened, for a person.", max_length=32768),
            "observedGeneration": integer("The spec generation this condition was computed from.", 0, fmt="int64"),
            "lastTransitionTime": string("When status last changed.", max_length=64, fmt="date-time"),
        },
        required=("type", "status", "lastTransitionTime", "reason", "message"),
    )


def _engine() -> Schema:
    return obj(
        "The engine in service: the last one that built successfully. A failed build leaves it serving.",
        {
            "fingerprint": string("Hash of every input that affects the build.", max_length=64),
            "path": string("Where the engine lives on the cache volume (or the checkpoint for pytorch).", 1024),
            "claimName": string("The cache PersistentVolumeClaim.", 253),
            "image": string("The TensorRT-LLM image it was built with and is served with.", 512),
            "maxBatchSize": integer("The engine's ceiling on the runtime max_batch_size.", 0),
            "maxNumTokens": integer("The engine's ceiling on the runtime max_num_tokens.", 0),
            "maxSeqLen": integer("The engine's maximum sequence length.", 0),
            "tokensPerBlock": integer("Tokens per KV-cache block compiled into the engine.", 0),
            "tensorParallelSize": integer("Tensor-parallel size of the engine.", 0),
            "pipelineParallelSize": integer("Pipeline-parallel size of the engine.", 0),
            "builtAt": string("When the build finished.", 64, fmt="date-time"),
            "buildJob": string("The Job that built it.", 253),
            "trtllm": obj(
                "What the build Job found the serving image to be; serving renders from this surface.",
                {
                    "version": string("tensorrt_llm.__version__ in the image.", 64),
                    "trtLlmArgsHasPerfMetricsMaxRequests": boolean(
                        "Whether TrtLlmArgs has perf_metrics_max_requests (return_perf_metrics is safe on TensorRT)."),
                    "collectorPrefix": string("Prefix of the Prometheus collector's metric names.", 32),
                    "collectorNames": array("Metric names kvpilot reads that the image's collector exports.",
                                            string("A metric name.", 128), 64),
                    "probeError": string("Why the probe could not read a fact, if it could not.", 512),
                },
            ),
        },
    )


def _build() -> Schema:
    return obj(
        "The most recent build the operator started for the current spec.",
        {
            "fingerprint": string("Fingerprint being built.", 64),
            "job": string("The build Job.", 253),
            "state": string("Where the build stands.", enum=("Building", "Succeeded", "Failed", "CacheHit")),
            "message": string("Why it failed, from the build container's termination message.", 4096),
            "startedAt": string("When the Job was created.", 64, fmt="date-time"),
            "finishedAt": string("When it finished.", 64, fmt="date-time"),
            "observedGeneration": integer("The spec generation that asked for this build.", 0, fmt="int64"),
        },
    )


def _batching() -> Schema:
    return obj(
        "The runtime max_batch_size in force and why.",
        {
            "maxBatchSize": integer("The runtime max_batch_size the pods run with.", 0),
            "source": string("Who set it: Spec (spec.batching.maxBatchSize) or Autotune.", enum=("Spec", "Autotune")),
            "reason": string("Why it has this value (SpecValue, AutotuneRaised, AutotuneLowered, EngineCeiling).", 128),
            "message": string("The decision's explanation.", 1024),
            "changedAt": string("When it last changed.", 64, fmt="date-time"),
            "summary": string("runtime/ceiling, for kubectl get.", 32),
            "specValue": integer("spec.batching.maxBatchSize when this value was set; a new spec value resets it.", 0),
        },
    )


def _kv_cache() -> Schema:
    return obj(
        "The KV-cache pool as last observed, summed over ready pods.",
        {
            "utilizationPercent": integer("Used blocks over the pool's blocks, percent (peak of the window).", 0, 100),
            "usedBlocks": integer("Blocks in use.", 0, fmt="int64"),
            "maxBlocks": integer("Blocks in the pool.", 0, fmt="int64"),
            "tokensPerBlock": integer("Tokens per block.", 0),
            "waitingRequests": integer("Requests queued for admission (peak of the window).", 0),
            "activeRequests": integer("Requests in the batch (peak of the window).", 0),
            "pausedRequests": integer("Requests paused for lack of blocks in the window.", 0),
            "traffic": obj(
                "The traffic the tuner's what-if simulation replays, from the pods' metrics: the last window, pooled "
                "with the windows before it while the traffic held within its noise (absent until enough requests "
                "finished).",
                {
                    "requestsPerMinute": integer("Requests received per minute, per pod.", 0),
                    "promptTokens": integer("Mean prompt length of the requests.", 0),
                    "outputTokens": integer("Mean output length of the requests.", 0),
                    "requests": integer("The finished requests these figures stand for (at most about a minute's "
                                        "traffic; up to five minutes' on bursty arrivals).", 0, fmt="int64"),
                    "arrivalCv": string("Coefficient of variation of the gaps between arrivals, a decimal "
                                        "(1: Poisson; above 1: bursty), from the scatter of the arrivals counted "
                                        "per sample over the last minutes (absent: too little evidence; the "
                                        "what-if then assumes Poisson arrivals).", 8,
                                        pattern=r"^[0-9]+(\.[0-9]+)?$"),
                    "stoppedAtMaxTokens": string("Share of the finished requests that stopped at their max_tokens "
                                                 "(the request counter's finished_reason=\"length\" series), a "
                                                 "decimal from 0 to 1 (absent: the pods do not count it).", 8,
                                                 pattern=r"^(0(\.[0-9]{1,6})?|1(\.0{1,6})?)$"),
                    "maxTokens": integer("The requests' max_tokens as the what-if places it from that share and "
                                         "the mean output (no release exports it; absent: unknown, and each "
                                         "replayed request reserves its own output).", 1, fmt="int64"),
                },
            ),
            "observedAt": string("When the metrics were read.", 64, fmt="date-time"),
        },
    )


def _decision() -> Schema:
    return obj(
        "One autotune decision.",
        {
            "at": string("When it was decided.", 64, fmt="date-time"),
            "action": string("What it did.", enum=("Raise", "Lower", "Hold", "Rebuild")),
            "fromBatchSize": integer("The runtime max_batch_size before.", 0),
            "toBatchSize": integer("The runtime max_batch_size after (or recommended).", 0),
            "reason": string("A PascalCase reason.", 128),
            "message": string("The explanation.", 1024),
            "applied": boolean("Whether it was applied (false in Advisory mode or when held)."),
        },
    )


DECIMAL = r"^-?[0-9]+(\.[0-9]+)?$"


def _model() -> Schema:
    def decimal(description: str) -> Schema:
        return string(description, 16, pattern=DECIMAL)

    return obj(
        "The engine model the tuner's what-if simulates: a kvsim profile calibrated to the pods' metrics, and how "
        "far it is from what they show (absent until the pods have reported iterations).",
        {
            "profile": string("The kvsim profile the fit starts from (or the template, for an engine kvsim has "
                              "no profile of).", 128),
            "known": boolean("Whether kvsim knows this model, precision and GPU (false: a template fitted from "
                             "the engine's own metrics)."),
            "trust": string("Trusted: the calibrated model predicts the pods' iteration latency within the bound and the "
                            "what-if ranks changes. Distrusted: it is off by more, and the tuner decides from "
                            "measurements alone, with conservative steps. Calibrating: not enough evidence yet.",
                            enum=("Trusted", "Distrusted", "Calibrating")),
            "hbmEfficiency": decimal("Fitted share of the HBM bandwidth a decode step reaches."),
            "prefillMfu": decimal("Fitted share of the tensor peak a prefill reaches."),
            "stepOverheadMillis": decimal("Fitted fixed cost of one iteration, milliseconds."),
            "perSequenceMicros": decimal("Fitted cost per scheduled sequence, microseconds."),
            "weightStreamScale": decimal("A template's fitted weight stream over its own (absent for a known "
                                         "engine)."),
            "kvPoolTokens": integer("KV tokens in one pod's pool at the limit in force (maxNumBlocks x "
                                    "tokensPerBlock).", 0, fmt="int64"),
            "iterations": integer("Iterations behind the fit (older ones count less).", 0, fmt="int64"),
            "latencyErrorPercent": decimal("The fit's error on each window's mean iteration latency, predicted "
                                           "before the window, percent (running mean of its magnitude)."),
            "datasheetErrorPercent": decimal("The same error for the uncalibrated profile, percent."),
            "goodputErrorPercent": decimal("The what-if's simulated minus the pods' measured goodput at the limit "
                                           "in force, in percent of the offered traffic (its traffic fit included: "
                                           "shown, not part of the bound)."),
            "boundPercent": integer("The latency error beyond which the tuner does not trust its model, percent.",
                                    0, 100),
            "message": string("Why the tuner trusts its model or not, with the figures.", 1024),
            "fittedAt": string("When the fit had last taken in metrics as these figures were written (they are "
                               "rewritten only when they move).", 64, fmt="date-time"),
        },
    )


def _verification_side() -> Schema:
    return obj(
        "The pooled figures of the windows on one side of a change.",
        {
            "windowsMilli": integer("Windows pooled, in thousandths (older ones fade).", 0, fmt="int64"),
            "seconds": integer("Seconds of windows pooled.", 0, fmt="int64"),
            "offered": integer("Requests that arrived.", 0, fmt="int64"),
            "resolved": integer("Requests answered, shed or given up.", 0, fmt="int64"),
            "good": integer("Resolved requests that met both objectives.", 0, fmt="int64"),
            "answered": integer("Resolved requests that were answered.", 0, fmt="int64"),
            "sharePermille": integer("The windows' mean share of requests served in time, in thousandths.", 0),
            "lastSharePermille": integer("The last window's share, in thousandths.", 0),
            "successiveSquaresMicro": integer("Sum of the squared differences of successive windows' shares, in "
                                              "millionths (their scatter).", 0, fmt="int64"),
            "promptTokens": integer("Mean prompt tokens of the traffic.", 0),
            "outputTokens": integer("Mean output tokens of the traffic.", 0),
            "split": integer("Answered requests whose misses per objective are known.", 0, fmt="int64"),
            "tpotMissed": integer("Of those, the ones that missed the TPOT objective.", 0, fmt="int64"),
            "ttftMissed": integer("Of those, the ones that missed the TTFT objective.", 0, fmt="int64"),
        },
    )


def _verification() -> Schema:
    return obj(
        "What the tuner measured of its last change, and what it keeps to judge the next one.",
        {
            "outcome": string("The last verdict: Keep, RollBack or Undecided.", enum=("Keep", "RollBack", "Undecided")),
            "reason": string("Why (PascalCase).", 64),
            "message": string("The verdict with both windows' figures.", 1024),
            "decidedAt": string("When the last verdict was reached.", 64, fmt="date-time"),
            "watch": obj(
                "The applied change under verification.",
                {
                    "changedAt": string("When it was applied.", 64, fmt="date-time"),
                    "fromBatchSize": integer("The value before.", 0),
                    "toBatchSize": integer("The value it set.", 0),
                    "before": _verification_side(),
                    "after": _verification_side(),
                    "inForceAt": string("When every pod first ran the new value.", 64, fmt="date-time"),
                    "lastBatch": integer("The mean batch of the last window at the new value.", 0),
                    "calmAt": string("When the evidence starts (the batch settled, one request later).", 64,
                                     fmt="date-time"),
                    "otherLoad": integer("Settled windows left out because the load had changed.", 0),
                    "worseWindows": integer("Judged windows in a row whose verdict was a rollback (on thin "
                                            "evidence a loss near its bound must show on two).", 0),
                },
            ),
            "baselineBatchSize": integer("The value the baseline was measured at.", 0),
            "baseline": _verification_side(),
            "baselineInForceAt": string("When every pod first ran that value.", 64, fmt="date-time"),
            "baselineLastBatch": integer("The mean batch of the last window at that value.", 0),
            "baselineCalmAt": string("When its batch had settled (the baseline counts from then).", 64,
                                     fmt="date-time"),
            "baselineMissingWindows": integer("Settled windows in a row at that value in which 20% or more of the "
                                              "requests missed an objective (up to 3: a break that lasts).", 0),
            "bars": array("After a rollback (or a lower that did not help), the values barred for the planning "
                          "horizon at the load they were measured at.", obj(
                "No change in this direction to this value or beyond it until then, at this load.",
                {
                    "direction": string("Raise or Lower.", enum=("Raise", "Lower")),
                    "batchSize": integer("The barred value (and beyond).", 0),
                    "until": string("When the bar ends.", 64, fmt="date-time"),
                    "requestsPerMinute": integer("The offered load it was measured at (0: any).", 0),
                    "promptTokens": integer("The mean prompt it was measured at (0: any).", 0),
                },
            ), 8),
            "seenUntil": string("The end of the last window taken in.", 64, fmt="date-time"),
            "pods": string("The serving pods and their restarts when last seen (a digest).", 64),
            "changeRequestsPerMinute": integer("The offered load measured just before the last applied change "
                                               "(the cooldown holds at that load only; absent: not measured).", 0),
            "changePromptTokens": integer("The mean prompt measured just before the last applied change.", 0),
        },
    )


def _canary() -> Schema:
    return obj(
        "The canary retune running now (one pod at the new value beside the others, judged against them, then "
        "promoted or rolled back), and how the last one ended.",
        {
            "phase": string("Running (judged against the other pods) or Promoting (the others take the value); "
                            "absent: no canary runs.", enum=("Running", "Promoting")),
            "fromBatchSize": integer("The value the other pods run.", 0),
            "toBatchSize": integer("The value the canary runs.", 0),
            "reason": string("Why the tuner proposed the change (PascalCase).", 64),
            "startedAt": string("When the canary started.", 64, fmt="date-time"),
            "spare": boolean("It started beside every other pod (a free GPU), not in place of one."),
            "readyAt": string("When the canary pod was first Ready.", 64, fmt="date-time"),
            "pod": string("The canary pod.", 253),
            "canary": _verification_side(),
            "others": _verification_side(),
            "inForceAt": string("When the canary's first clean window began.", 64, fmt="date-time"),
            "lastBatch": integer("The canary's mean batch in its last window.", 0),
            "calmAt": string("When its evidence starts (its batch settled, one request later).", 64, fmt="date-time"),
            "worseWindows": integer("Judged windows in a row whose verdict was a rollback (on thin evidence a "
                                    "loss near its bound must show on two).", 0),
            "seenUntil": string("The end of the last window taken in.", 64, fmt="date-time"),
            "pods": string("The serving pods and their restarts when last seen (a digest).", 64),
            "outcome": string("How the last canary ended: Promoted; RolledBack (it served worse, or its pod could "
                              "not run it); Abandoned (the spec, the engine or the other pods moved on before a "
                              "verdict).", enum=("Promoted", "RolledBack", "Abandoned")),
            "message": string("The last canary's verdict with both groups' figures.", 1024),
            "decidedAt": string("When the last canary ended.", 64, fmt="date-time"),
        },
    )


def _autotune() -> Schema:
    return obj(
        "What the tuner recommends and what it did.",
        {
            "recommendation": _decision(),
            "lastAppliedAt": string("When a decision last changed the pods (the cooldown counts from here).", 64,
                                    fmt="date-time"),
            "whatIfDeclinedAt": string("When the what-if simulation last ran and declined a change the rules "
                                       "proposed (it reruns a few minutes later).", 64, fmt="date-time"),
            "ceilingRequest": integer(
                "An engine ceiling the tuner asked to build (allowRebuild); it overrides build.maxBatchSize "
                "in the fingerprint.", 0),
            "ceilingRequestFrom": integer(
                "build.maxBatchSize when the ceiling was requested; a different spec value cancels the request.", 0),
            "history": array(f"The last {HISTORY_LIMIT} decisions that changed something.", _decision(),
                             HISTORY_LIMIT),
            "model": _model(),
            "verification": _verification(),
            "canary": _canary(),
        },
    )


def _groups() -> Schema:
    return obj(
        "A multi-node engine's groups (one per replica), each a LeaderWorkerSet group of pods, one per node.",
        {
            "replicas": integer("Groups that exist.", 0),
            "ready": integer("Groups whose every pod is Ready (they serve).", 0),
            "podsPerGroup": integer("Pods (nodes) in one group: the ranks over serving.gpusPerNode.", 0),
            "readyPods": integer("Ready pods over all groups, leaders and workers.", 0),
            "summary": string("Ready groups / groups, for kubectl get.", 64),
            "leaders": array("Each group's leader pod as <uid>:<template revision>, by group index (a new UID "
                             "under the same revision: the group was recreated).", string("uid:revision.", 128), 1000),
            "lastRecreation": obj(
                "The last time a group was recreated as one (LeaderWorkerSet RecreateGroupOnPodRestart).",
                {
                    "group": integer("The group's index.", 0),
                    "at": string("When the operator saw its new leader.", 64, fmt="date-time"),
                    "message": string("What happened, for a person.", 1024),
                },
            ),
        },
    )


def status_schema() -> Schema:
    """The full ``status`` schema."""
    return obj(
        "What the operator observed and decided.",
        {
            "observedGeneration": integer("The spec generation last reconciled.", 0, fmt="int64"),
            "conditions": map_list(
                "EngineReady, Available, Progressing and Degraded.", _condition(), ("type",), 16
            ),
            "engine": _engine(),
            "build": _build(),
            "batching": _batching(),
            "kvCache": _kv_cache(),
            "autotune": _autotune(),
            "replicas": integer("Serving replicas that exist: pods, or groups for a multi-node engine.", 0),
            "readyReplicas": integer("Serving replicas that are ready: pods, or groups for a multi-node engine.", 0),
            "groups": _groups(),
            "selector": string("Label selector of the serving pods (for the scale subresource).", 1024),
            "endpoint": string("In-cluster URL of the OpenAI-compatible API.", 1024),
        },
    )

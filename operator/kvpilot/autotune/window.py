"""The autotuner's input: what the KV pool, the batch and the traffic did over one tuning window.

It lives with the tuner (``kvpilot.autotune``) because it is the tuner's input; ``kvpilot.observe`` fills it
from the pods' metrics, the benchmark fills it from kvsim, and ``kvpilot.desired`` only carries it in
``Observed``. Keeping it here means the tuner never imports ``kvpilot.desired`` (which imports the tuner).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KvWindow:
    """The autotuner's view of the pool over the last window, aggregated over warm, ready pods."""

    samples: int
    pods: int
    peak_utilization: float
    mean_utilization: float
    peak_used_blocks: int
    max_blocks: int
    tokens_per_block: int
    peak_active: int
    mean_active: float
    peak_queued: int
    mean_queued: float
    paused: int
    runtime_batch_size: int
    tuner_recommended: int = 0
    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    window_seconds: float = 0.0
    completion_rate: float = 0.0  # requests finished per second, per pod
    queue_growth: float = 0.0  # change of the queue per second, per pod (> 0: arrivals outpace service)
    ttft_miss_fraction: float | None = None  # share of requests over the TTFT objective in the window
    tpot_miss_fraction: float | None = None
    # Iteration latency against the generation batch (least squares over the window): how TPOT grows with
    # the batch, so a larger limit's TPOT can be predicted before it is tried. None when not fitted.
    step_ms_intercept: float | None = None
    step_ms_per_request: float | None = None
    mean_generation: float = 0.0
    mean_unscheduled: float = 0.0  # active requests the capacity scheduler held back for lack of KV blocks
    blocks_per_request: float = 0.0  # the most KV blocks one active request held on average, in one sample
    # The pods' own cap on active requests (maxNumActiveRequests: max_batch_size x PP; the PyTorch backend's only
    # report of its limit, its maxBatchSize* fields read 0) when every sample that reports one agrees, else 0; and
    # the share of samples in which requests were queued while the batch stood at that cap (autotune/summarize.py).
    active_limit: int = 0
    full_waiting_share: float = 0.0
    # Metrics payloads rejected (malformed) or samples ignored (inconsistent with the engine) in the window, and
    # the latest reason: reported in a condition so a hostile or foreign pod is visible, never a crash.
    rejected_samples: int = 0
    rejection: str | None = None
    # The traffic, for the tuner's what-if simulation (autotune/whatif.py): requests received per second per
    # pod and the mean prompt and output of the requests finished in the window (the request counters and token
    # histograms of /prometheus/metrics; 0: unknown), and the share of them that stopped at their max_tokens
    # (finished_reason "length"; None: unknown), from which the what-if places the cap (autotune/capped.py).
    arrival_rate: float = 0.0
    prompt_mean: float = 0.0
    output_mean: float = 0.0
    length_share: float | None = None
    # The inter-arrival gaps' coefficient of variation (1: Poisson; > 1: bursty), from the scatter of the arrivals
    # counted per sample (autotune/burst.py). None: too little evidence; the what-if then draws Poisson arrivals.
    arrival_cv: float | None = None
    # For the verification of an applied change (autotune/verify.py): requests resolved in the window (answered,
    # shed or given up) and of those the ones that met both objectives, per second per pod. 0: not counted
    # (the pods' histograms give misses per objective, not per request; verification then estimates from them).
    resolved_rate: float = 0.0
    good_rate: float = 0.0
    # How far the pods are from having finished what they were sent (autotune/censored.py): the requests they
    # finished since they started (their request counters, summed) and the requests in them (active and queued)
    # at the window's end. 0: not counted (a pod without the counter).
    finished_total: float = 0.0
    in_pods: float = 0.0

    @property
    def miss_share(self) -> float:
        """The share of the window's requests that missed an objective, as far as the pods say: the larger of
        the two shares (the union of the two is not exported, so the true share may be larger)."""
        return max(self.ttft_miss_fraction or 0.0, self.tpot_miss_fraction or 0.0)

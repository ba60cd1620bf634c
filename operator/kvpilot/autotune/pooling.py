"""The traffic the what-if replays: the window pooled with the windows before it while the traffic holds. Pure.

One window is a small sample. At 8 requests per second over two pods a 15 s window counts ~120 arrivals, so its
rate scatters by ~9% and its mean prompt (a spread like the suite's, cv ~0.75) by ~7%. The what-if replays the
traffic it is given as if it lasted, and an engine near its prefill capacity turns that scatter into a cliff:
measured on document Q&A served by an engine 20% faster than its profile (rag-then-chat-a100.all-fast from 2048,
docs/tuner-suite.md "Tenth pass"), the window that triggered the lower read 8.8 req/s and 2,208-token prompts
(8.0 and 2,000 offered: 21% more prompt tokens per second). Fed that, the what-if put the pods at 2048 at 4.07
good req/s, where they served 7.8 over the phase, and a lower to 42 that gained 1% of the phase cost 5% of the
run when chat arrived.

So the traffic is carried from pass to pass (status.kvCache.traffic, with the requests it stands for) and each
window is pooled into it while the two agree within their noise (``agrees``): the rate within Z standard errors of
a Poisson count (scaled by the arrivals' cv), each mean length within Z standard errors of a mean whose lengths
scatter like LENGTH_CV. The past counts for at most POOL_SECONDS of traffic, so the newest 15 s window keeps a
fifth of the weight or more (on bursty arrivals the past counts longer and the window less: below). A window that
disagrees starts the pool afresh: a step in the load, a new mix (``shift.mix_wait`` then holds the what-if), or a
stale or missing record.

Measured on steady Poisson traffic with lognormal lengths (sigma 0.8), 2,000 windows each
(tests/unit/test_traffic_pooling.py): the prompt tokens per second scatter 0.37-0.41x as much as one window's
(standard deviation of the log: 0.046 against 0.125 at 4 req/s per pod and 2,000-token prompts; 0.099 against
0.263 at 1 req/s), the worst 1% 0.36-0.47x, and 0.5-0.8% of the windows start the pool afresh. Z trades that
against steps: a 1.4x step in the load at 4 req/s per pod is 3.4 standard errors, so it starts afresh, while a
smaller one (or a 1.4x step at 1 req/s per pod, 1.7 standard errors there) is pooled and followed at a fifth of
the way per window.

Bursty arrivals (the sampler's cv at BURSTY_CV, 2, or above, autotune/burst.py) scatter a window's rate cv times as
much, and the what-if draws its own bursts from that cv already: a burst window replayed as the traffic ahead
counts the burst twice. So there the past's weight is cv^2 times POOL_SECONDS (the precision a Poisson pool has),
capped at the sampler's burstiness history (from cv 2.24), and a window whose pods fill in a burst pools its rate
into the record, whose lengths stand (``burst_pooled``). Measured on bursty traffic (gamma arrivals, cv 3, 8 req/s
over two pods) served at 2048 by engines slower than their profile (burst-a100.all-slow and .prefill0.7 from 2048,
no spare GPU; docs/tuner-suite.md, "Twenty-fourth pass"): one burst window read 11.5-12.4 req/s, the what-if
replayed it alone (its pods filled), predicted 14-24% more good requests at 54-66 than staying at 2048, and the
restart that followed cost 4-8% of the run.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvpilot.autotune.burst import BURST_HISTORY_SECONDS
from kvpilot.autotune.shift import OVERLAP_SHARE, STALE_WINDOWS, SeenTraffic
from kvpilot.autotune.window import KvWindow

POOL_SECONDS = 60.0  # the past's weight is capped at this much traffic (four 15 s windows)
Z = 3.0  # standard errors: a window of steady traffic starts the pool afresh in under 1% of windows
LENGTH_CV = 1.0  # the lengths' coefficient of variation the test allows (a lognormal of sigma 0.8 has 0.95)
# The arrivals' cv from which the pool reads them as bursty (``bursty_cv``): a window's count then scatters at least
# twice a Poisson one's. Measured at every 15 s tick of the suite's cases, the estimator (autotune/burst.py) reads
# steady Poisson traffic as 1 except for a tail of 1.12-1.2 (its noise band is two standard errors), a run's first
# half-minute as up to 1.5 (long-output-l40s) and a step in the load as up to 2.1 for a minute after it
# (phase-shift-l40s's 2 -> 36 req/s, where the rate test reads the step and the pool starts afresh anyway);
# burst-a100's gamma arrivals of cv 3 read 2.5-3.5.
BURSTY_CV = 2.0
FILLING_SHARE = 0.5  # of the finished requests: a window whose pods grew by more is filling (``filling``)


def window_traffic(w: KvWindow) -> SeenTraffic | None:
    """The window's own traffic, standing for the requests that finished in it (none while the pods fill:
    ``filling``); None where it has none."""
    if not (w.arrival_rate > 0 and w.prompt_mean > 0 and w.output_mean > 0):
        return None
    finished = w.completion_rate * max(0.0, w.window_seconds) * max(1, w.pods)
    return SeenTraffic(w.arrival_rate, w.prompt_mean, w.output_mean, 0.0, 0.0 if filling(w) else max(1.0, finished),
                       w.length_share)


def filling(w: KvWindow) -> bool:
    """Whether the requests in the pods grew by more than FILLING_SHARE of those that finished in the window
    (arrivals are the finished requests plus that growth): pods that started empty, or a queue that grows. The
    requests that finish first are the short ones, so such a window's lengths read short, by more than their noise:
    on the cold start of document Q&A on an engine decoding 30% slower than its profile, the mean output of the
    first windows read 134, 170 and 227 tokens (~300 offered). Pooled, the what-if read 181 where the window alone
    read 227, and the lower it sized went to 24 instead of 32 (4,804 good requests in the phase at 24, 5,236 at
    32). Such a window is read alone and starts no pool (on bursty arrivals it pools its rate into the record
    instead: ``burst_pooled``). Steady traffic reads as filling now and then, by the batch's own swells: measured
    in the suite, 2 of 56 windows of document Q&A at 8 req/s over two pods (an engine 20% faster than its profile,
    at 2048), 1 of 52 on the nominal engine at 64, none of 60 of chat at 30 req/s; each then costs the pooling of
    two passes. A queue that grows (the suite's ramp and chat at 64) reads as filling window after window, and
    those lengths go unpooled too: the requests stuck in the queue are the long ones."""
    growth = (w.arrival_rate - w.completion_rate) * max(0.0, w.window_seconds)
    return growth > FILLING_SHARE * max(1.0, w.completion_rate * max(0.0, w.window_seconds))


def pooled_traffic(before: SeenTraffic | None, w: KvWindow) -> SeenTraffic | None:
    """The traffic the what-if replays at this pass, and status records for the next: the window pooled with
    ``before`` (the record of the last pass, with its age) while they agree; the window alone where they do not,
    or where ``before`` is unusable. A pass sooner than OVERLAP_SHARE of a window after the last reads a window
    that overlaps the one pooled already: it keeps the record as it is while the two agree."""
    now = window_traffic(w)
    if now is None:
        return now
    if now.requests <= 0:
        return burst_pooled(before, now, w)
    if before is None or not _usable(before, w) or not agrees(before, now, w):
        return now
    if _overlapping(before, w):
        return replace(before, age_s=0.0)
    past_s = _past_seconds(before, w)
    past = before.rate_per_pod * max(1, w.pods) * past_s  # the requests the capped past stands for
    rate = _pooled_rate(before, now, past_s, w)

    def mean(old: float, new: float) -> float:
        return (old * past + new * now.requests) / (past + now.requests)

    # The share is weighted like the lengths. Where one side did not count it, the other's stands alone with the
    # pooled requests' weight: it is the best figure there is, and ``pool_seconds`` bounds how long it carries.
    old_share, new_share = before.length_share, now.length_share
    share = new_share if old_share is None else old_share if new_share is None else mean(old_share, new_share)
    return SeenTraffic(rate, mean(before.prompt_mean, now.prompt_mean), mean(before.output_mean, now.output_mean),
                       0.0, past + now.requests, share)


def burst_pooled(before: SeenTraffic | None, now: SeenTraffic, w: KvWindow) -> SeenTraffic:
    """A window whose pods fill (``filling``: its lengths read short) is read alone, except on bursty arrivals
    (cv BURSTY_CV or above) beside a usable record whose rate it agrees with: pods that fill in a burst are the
    burst the what-if draws from the cv already. Then the record stands, its rate pooled with the window's (the
    rate is counted from arrivals, so a filling window's is right), its lengths and the requests it stands for as
    they were (the window's lengths read short, and its finished requests add none). A pass sooner than
    OVERLAP_SHARE of a window after the last reads a window pooled already: the record is kept as it is.

    While every window fills (a queue that grows on bursty arrivals) the record's lengths carry on for as long as
    the rate agrees: they are the last ones read while the pods did not fill, where the windows' own read short."""
    if bursty_cv(w) < BURSTY_CV or before is None or not _usable(before, w) or not rate_agrees(before, now, w):
        return now
    if _overlapping(before, w):
        return replace(before, age_s=0.0)
    return replace(before, rate_per_pod=_pooled_rate(before, now, _past_seconds(before, w), w), age_s=0.0)


def _usable(before: SeenTraffic, w: KvWindow) -> bool:
    """Whether the record of the last pass may be pooled into: it stands for requests, and it is fresh."""
    return before.requests > 0 and before.age_s is not None and before.age_s <= STALE_WINDOWS * w.window_seconds


def _overlapping(before: SeenTraffic, w: KvWindow) -> bool:
    """Whether this pass comes sooner than OVERLAP_SHARE of a window after the last: its window overlaps the one
    pooled already."""
    return before.age_s is not None and before.age_s < OVERLAP_SHARE * w.window_seconds


def _past_seconds(before: SeenTraffic, w: KvWindow) -> float:
    """The seconds of traffic the record stands for, capped at what the pool may weigh (``pool_seconds``)."""
    return min(pool_seconds(w), before.requests / (before.rate_per_pod * max(1, w.pods)))


def _pooled_rate(before: SeenTraffic, now: SeenTraffic, past_s: float, w: KvWindow) -> float:
    """The rate over the capped past (``past_s`` seconds of it) and the window, each weighted by its time."""
    return (before.rate_per_pod * past_s + now.rate_per_pod * w.window_seconds) / (past_s + w.window_seconds)


def bursty_cv(w: KvWindow) -> float:
    """The arrivals' cv the sampler estimated where it reads BURSTY_CV or above, else 1: Poisson, nearly so, or
    unknown."""
    cv = w.arrival_cv
    return cv if cv is not None and math.isfinite(cv) and cv >= BURSTY_CV else 1.0


def pool_seconds(w: KvWindow) -> float:
    """How much past traffic the pool may weigh: POOL_SECONDS, times cv^2 on bursty arrivals (a rate over cv^2 as
    long scatters as little as a Poisson one), up to the burstiness history the sampler keeps."""
    cv = bursty_cv(w)
    return max(POOL_SECONDS, min(BURST_HISTORY_SECONDS, POOL_SECONDS * cv * cv))


def rate_agrees(before: SeenTraffic, now: SeenTraffic, w: KvWindow) -> bool:
    """Whether the window's rate is the recorded rate within the noise of both counts (cv times a Poisson
    count's wherever the sampler reads the cv above 1, not only from BURSTY_CV)."""
    arrivals = now.rate_per_pod * w.window_seconds * max(1, w.pods)
    cv = w.arrival_cv if w.arrival_cv is not None and math.isfinite(w.arrival_cv) and w.arrival_cv > 1 else 1.0
    rate_error = cv * math.sqrt(1.0 / max(1.0, arrivals) + 1.0 / before.requests)
    return abs(math.log(now.rate_per_pod / before.rate_per_pod)) <= Z * rate_error


def agrees(before: SeenTraffic, now: SeenTraffic, w: KvWindow) -> bool:
    """Whether the window's traffic is the recorded traffic within the noise of both samples."""
    length_error = LENGTH_CV * math.sqrt(1.0 / now.requests + 1.0 / before.requests)
    return (rate_agrees(before, now, w)
            and abs(math.log(now.prompt_mean / before.prompt_mean)) <= Z * length_error
            and abs(math.log(now.output_mean / before.output_mean)) <= Z * length_error)


def replayed(before: SeenTraffic | None, w: KvWindow) -> KvWindow:
    """The window as the what-if reads it: its traffic replaced by the pooled traffic (``pooled_traffic``)."""
    traffic = pooled_traffic(before, w)
    if traffic is None:
        return w
    return replace(w, arrival_rate=traffic.rate_per_pod, prompt_mean=traffic.prompt_mean,
                   output_mean=traffic.output_mean, length_share=traffic.length_share)

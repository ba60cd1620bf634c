"""How bursty the arrivals are, from what the operator can observe: arrival counts per sample.

Live, the operator never sees an arrival time: it sees counters (finished requests) and gauges (requests in
the pod) once per sample, so the only evidence of burstiness is how much the per-sample arrival counts
scatter. This module turns those counts into the coefficient of variation (cv) of the inter-arrival times
that the tuner's what-if (autotune/whatif.py) draws its gamma gaps with.

The math
--------
Let ``N_1 .. N_m`` be the arrivals in ``m`` consecutive sub-intervals of equal length ``T`` (one sample
period) and ``lam`` the arrival rate. For a stationary renewal process whose gaps have mean ``1/lam`` and
coefficient of variation ``cv``, renewal theory (Cox, *Renewal Theory*, 1962, sec. 4.5) gives

    Var N(T) = cv^2 * lam*T + c + o(1),      c = 1/12 + 5 cv^4 / 4 - 2 k3 lam^3 / 3

(``k3``: the gaps' third central moment; for gamma gaps ``c = (1 - cv^4) / 12``, for Poisson ``c = 0``).
So the index of dispersion ``Var N(T) / E N(T)`` tends to ``cv^2`` once ``lam*T`` is large: at the suite's
bursty case (8 req/s, cv 3, T = 5 s) the correction is ``c / (lam T) = -6.7 / 40``, under 2% of cv^2 = 9.

Instead of the plain variance we use the **Allan factor**, half the mean squared difference of successive
counts over the mean count:

    A = sum_i (N_{i+1} - N_i)^2 / (2 (m - 1) * mean(N))

which has the same limit (``E A = cv^2 + 1.5 c / (lam T)`` for a renewal process) but is blind to a slow
change of the rate: a ramp from 12 to 20 req/s inside the history would add the spread of the two rates to
the plain variance (an index of dispersion near 6 for perfectly Poisson traffic), while it adds one squared
step to the Allan sum. The Poisson part of the count noise is in both: ``A = 1`` for Poisson arrivals, so
``A - 1`` is the excess over Poisson noise and ``cv = sqrt(A)``.

Limits, and what the estimator does about them
----------------------------------------------
* **Small counts.** As ``lam*T -> 0`` every point process looks Poisson at that scale (``A -> 1``): few
  arrivals per sample under-state the burstiness. Below ``MIN_MEAN_COUNT`` arrivals per sample there is no
  estimate (None: the what-if keeps Poisson arrivals, today's behaviour).
* **Few sub-intervals.** Under Poisson arrivals ``A`` scatters like ``chi^2_(m-1) / (m-1)``: standard error
  ``sqrt(2 / (m-1))`` (about 0.19 at the 55 differences of a 5-minute history at 5 s samples, 0.45 at the
  10 of the minimum). A figure inside ``1 +/- Z * sqrt(2/(m-1))`` is not evidence against Poisson: it reads as
  ``cv = 1`` exactly (so a steady Poisson fleet replays exactly what it did before this estimator existed and
  hits the what-if's cache). Fewer than ``MIN_DIFFERENCES`` differences: None.
* **Non-renewal traffic** (a diurnal cycle, sessions of correlated requests) is summarized by the one cv
  that gives the same count scatter at the sample period, which is the time scale the queue sees.
* **Hostile metrics.** A count that is not finite, negative or above ``MAX_COUNT`` (a reset counter, a broken
  pod) breaks the chain of differences instead of entering it; the result is clamped to
  ``[CV_MIN, CV_MAX]``. ``CV_MAX = 4`` (cv^2 = 16): beyond it the what-if's few minutes of simulated traffic
  hold only a handful of bursts, so a larger cv would be sampling noise of the simulation; and one glitched
  count (a counter that jumped by 10^6) cannot make the traffic look more than that bursty. ``CV_MIN = 0.5``:
  real request streams are not that regular (a cv far below 1 needs a pacing client); a lower figure is
  more likely a sampler artefact (counts smoothed across samples) than traffic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set

MIN_MEAN_COUNT = 3.0  # arrivals per sample below this: too few to tell burstiness from Poisson noise
MIN_DIFFERENCES = 10  # successive differences needed (about a minute of 5 s samples)
Z = 2.0  # Poisson band half-width in standard errors (one-sided false-positive rate ~2-3% per window)
CV_MIN = 0.5
CV_MAX = 4.0
MAX_COUNT = 1e7  # arrivals in one sample period: far above any fleet, far below float trouble when squared


def _usable(x: float | None) -> float | None:
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 or x > MAX_COUNT:
        return None
    return float(x)


def allan_factor(counts: Sequence[float | None]) -> tuple[float, int, float] | None:
    """(Allan factor, number of successive differences, mean count) of the usable counts; None without any
    pair. A None or unusable count breaks the chain: no difference spans it."""
    values = [_usable(c) for c in counts]
    diffs: list[float] = []
    kept: list[float] = []
    prev: float | None = None
    for v in values:
        if v is not None:
            kept.append(v)
            if prev is not None:
                diffs.append(v - prev)
        prev = v
    if not diffs:
        return None
    mean = sum(kept) / len(kept)
    if mean <= 0:
        return None
    factor = sum(d * d for d in diffs) / (2 * len(diffs) * mean)
    return factor, len(diffs), mean


def arrival_cv(counts: Sequence[float | None]) -> float | None:
    """The coefficient of variation of the inter-arrival gaps that explains the scatter of ``counts``
    (arrivals per sample, equal sample periods, in time order; None where a sample is unusable). None when the
    evidence is thin (see the module docstring); 1.0 when it does not distinguish the traffic from Poisson."""
    stats = allan_factor(counts)
    if stats is None:
        return None
    factor, n, mean = stats
    if n < MIN_DIFFERENCES or mean < MIN_MEAN_COUNT or not math.isfinite(factor):
        return None
    if abs(factor - 1.0) <= Z * math.sqrt(2.0 / n):
        return 1.0
    return min(CV_MAX, max(CV_MIN, math.sqrt(max(0.0, factor))))


# The counts the estimate reads: five minutes of samples (60 at the 5 s period of a 30 s interval; how closely
# that history estimates a cv: docs/live-tuner.md, "Burstiness: the arrival cv").
BURST_HISTORY_SECONDS = 300.0
PERIOD_TOLERANCE = 0.25  # a sample period this far (relatively) from the median one is not an "equal" period


def fleet_arrivals(before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]],
                   scraped: Set[str]) -> float | None:
    """Arrivals of the whole fleet between two samples, from each pod's (finished-requests counter, requests in
    the pod) at both: finished + growth of those in the pod, per pod (as autotune/summarize.traffic_fit counts them
    over a window). None unless the same pods were read at both samples and every pod scraped now was read (a
    pod that came or went, or did not answer, would count as a drop or a jump of the traffic), or when a
    counter went back (a restarted pod) or a figure is not finite."""
    if not after or set(before) != set(after) or set(after) != set(scraped):
        return None
    total = 0.0
    for pod, (done_after, in_after) in after.items():
        done_before, in_before = before[pod]
        done = done_after - done_before
        if not all(math.isfinite(x) for x in (done_after, done_before, in_after, in_before)) or done < 0:
            return None
        total += max(0.0, done + in_after - in_before)
    return total


def equal_periods(samples: Sequence[tuple[float, float | None]]) -> list[float | None]:
    """The counts of ``samples`` ((period, count) in time order), None where the period is not within
    PERIOD_TOLERANCE of the median period (a late sample counts more arrivals without more burstiness)."""
    periods = sorted(p for p, _ in samples)
    if not periods:
        return []
    median = periods[len(periods) // 2]
    return [c if median > 0 and abs(p - median) <= PERIOD_TOLERANCE * median else None for p, c in samples]

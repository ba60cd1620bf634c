"""The outputs of young pods, read as the traffic sends them: the lengths that have not finished yet, counted.
Pure.

The what-if reads the mean output from the requests that *finished* in the window (``replay.fit_traffic``). In
pods that started empty, the requests that finish first are the short ones: a request finishes once its own
lifetime has passed, and none has lived longer than the pods' traffic. Measured on the suite's document Q&A
(outputs ~300 tokens offered, 286 sent) from TensorRT-LLM's default of 2048 without a spare GPU
(docs/tuner-suite.md, "Fifteenth pass"): at 2048 the pods decode at ~150 ms a token, and the window of the
protective lower at 60 s read outputs of 172-197 tokens on each of the four perturbed engines tried
(per-sequence cost x0.7 and x1.3, step overhead x0.7, memory x0.8). Fed that, the what-if sized the lower at
22-31 where the documents want 44-46 (on the engine 30% cheaper per sequence: 5,566 good requests in the phase
at 23, 6,358 at 46); with outputs of 286 it chose 44-46.

The pods' request counter (``request_success_total``, cumulative since the pod started) and the requests in the
pods now say how far the pods' traffic is from having finished what it started. Model: pods that started empty
receive a steady traffic; a request arriving ``s`` after the start has finished by now if its output is under
``c_max (1 - s / age)`` (its lifetime grows with its output). With outputs lognormal (log-spread ``sigma``,
median ``m``) and ``x = c_max / m``, the share of the requests sent so far that finished is

    q(x) = Phi(ln x / sigma) - exp(sigma^2 / 2) / x * Phi(ln x / sigma - sigma)

(the distribution function of a normal plus an exponential, at ln x). ``q`` falls as the share of unfinished
requests grows and tends to 1 - E[output] / c_max in steady traffic, whatever its age. Solved for ``x``, the
window's finished outputs are those under ``c_max``: their mean is the lognormal's times
``Phi(z - sigma) / Phi(z)`` (z = ln x / sigma), so the traffic's mean is the window's divided by that. On pods
that have served for a while ``x`` is large and the factor 1 within noise. A factor above ``MAX_FACTOR``
(outputs read on a handful of the shortest requests) is held there.
"""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist

from kvpilot.autotune.capped import OUTPUT_SIGMA, cap_from_length_share
from kvpilot.autotune.window import KvWindow

MAX_FACTOR = 2.0  # the most the window's mean output is scaled by
# Below this the correction is within the window's own noise, and the window is read as it is: ~100 outputs
# finished in a 15 s window of document Q&A over two pods, of a spread whose cv is ~0.95, put its mean within
# about +/-10%. Pods that restarted into traffic already mixed read slightly young for a while (chat then
# documents: 77% finished, a correction of 7%, which sized the lower above what the documents then held).
MIN_FACTOR = 1.1
MIN_FINISHED = 20.0  # requests finished since the pods started, fewer say nothing about the share
BISECTIONS = 60
_NORMAL = NormalDist()


def finished_share(log_x: float, sigma: float = OUTPUT_SIGMA) -> float:
    """q: the share of the requests sent since the pods started that finished, where the longest a finished one
    could be is ``exp(log_x)`` times the outputs' median (see the module's docstring)."""
    z = log_x / sigma
    return max(0.0, _NORMAL.cdf(z) - math.exp(sigma * sigma / 2.0 - log_x) * _NORMAL.cdf(z - sigma))


def truncation(share: float, sigma: float = OUTPUT_SIGMA) -> float | None:
    """ln x for a finished ``share`` (``finished_share`` inverted by bisection); None where the share says the
    traffic is in steady state (1 or more) or is no share at all."""
    if not math.isfinite(share) or share <= 0.0 or share >= 1.0:
        return None
    lo, hi = -6.0 * sigma, 12.0 * sigma
    if finished_share(hi, sigma) <= share:
        return None
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        if finished_share(mid, sigma) < share:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def output_factor(finished_total: float, in_pods: float, sigma: float = OUTPUT_SIGMA) -> float:
    """What the window's mean output is multiplied by to stand for the traffic's: 1 where the counters do not
    say (no counter, too few finished) or the pods are past their filling."""
    return _correction(finished_total, in_pods, sigma)[0]


def _correction(finished_total: float, in_pods: float, sigma: float) -> tuple[float, float]:
    """(``output_factor``, the longest output a finished request can have, in medians of the outputs: inf
    where the pods are past their filling)."""
    if not (math.isfinite(finished_total) and math.isfinite(in_pods)) or finished_total < MIN_FINISHED \
            or in_pods <= 0:
        return 1.0, math.inf
    log_x = truncation(finished_total / (finished_total + in_pods), sigma)
    if log_x is None:
        return 1.0, math.inf
    z = log_x / sigma
    below = _NORMAL.cdf(z - sigma)
    factor = _NORMAL.cdf(z) / below if below > 0 else MAX_FACTOR
    return (min(MAX_FACTOR, factor) if factor >= MIN_FACTOR else 1.0), math.exp(log_x)


def uncensored(traffic: KvWindow, w: KvWindow) -> tuple[KvWindow, str | None]:
    """``traffic`` (the window as the what-if reads it) with its mean output scaled by ``output_factor`` of
    ``w``'s counters, and a note saying so; ``traffic`` as it is (and None) where the factor is 1, or where the
    longest output a finished request can have is past the requests' max_tokens as placed (``fit_traffic``):
    the cap, not the pods' age, then bounds what finishes. Measured on chat (outputs ~520, cut at 1,024) at
    2048 105 s into the run: 71% finished reads as a correction of 12%, but the longest a finished output can
    be was ~1,800 tokens, past the cap; scaled, the lower went to 419 where 296 had held, and TPOT broke there."""
    factor, reach = _correction(w.finished_total, w.in_pods, OUTPUT_SIGMA)
    if factor == 1.0 or traffic.output_mean <= 0:
        return traffic, None
    scaled = traffic.output_mean * factor
    cap = cap_from_length_share(traffic.output_mean, traffic.length_share, OUTPUT_SIGMA)
    if cap and reach * scaled * math.exp(-OUTPUT_SIGMA * OUTPUT_SIGMA / 2.0) >= cap:
        return traffic, None
    done = w.finished_total / (w.finished_total + w.in_pods)
    return replace(traffic, output_mean=scaled), (
        f"the pods finished {done:.0%} of the requests sent since they started, so the short ones are over-"
        f"represented among those finished: outputs read {traffic.output_mean:.0f} tokens, taken as {scaled:.0f}")

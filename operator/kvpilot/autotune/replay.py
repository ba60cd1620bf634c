"""The traffic the what-if replays: fitted from a window (rate, burstiness, prompt and output means, the share
of outputs cut at max_tokens), rounded so that steady traffic replays the same simulation, and drawn as a seeded
request stream. Pure.

Lengths are lognormal around the fitted means; the outputs are drawn so that, cut at the cap the pods' requests
carry, they average what the pods measured (autotune/capped.py, which also places that cap).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from kvsim import Request
from kvsim.workload import Phase

from kvpilot.autotune.capped import OUTPUT_SIGMA, cap_from_length_share, output_lengths
from kvpilot.autotune.window import KvWindow

SEED = 8
MAX_REQUESTS = 6000  # per simulated run (warm-up and horizon together draw at most twice this)


@dataclass(frozen=True)
class TrafficFit:
    """What the window says about the traffic of the whole fleet (lognormal lengths, outputs as cut at
    ``max_tokens``: autotune/capped.py). ``max_tokens``: the requests' cap, placed from the share of outputs
    that stopped at it (no release exports the cap itself); 0 where unknown. ``arrival_cv``: the inter-arrival
    gaps' coefficient of variation (autotune/burst.py); 1 is Poisson."""

    rate_per_s: float
    prompt_mean: float
    output_mean: float
    max_tokens: int
    arrival_cv: float = 1.0


def fit_traffic(w: KvWindow) -> TrafficFit | None:
    """The fleet's arrival rate and length means from the window; None when the window has no such data."""
    rate = w.arrival_rate * max(1, w.pods)
    if rate <= 0 or w.prompt_mean <= 0 or w.output_mean <= 0:
        return None
    cv = w.arrival_cv if w.arrival_cv is not None and math.isfinite(w.arrival_cv) and w.arrival_cv > 0 else 1.0
    cap = cap_from_length_share(w.output_mean, w.length_share, OUTPUT_SIGMA)
    return TrafficFit(rate, w.prompt_mean, w.output_mean, cap, cv)


def replayed_requests(fit: TrafficFit, duration_s: float) -> list[Request]:
    """``duration_s`` of the fitted traffic as kvsim requests, the same stream for the same fit (seeded): every
    limit the what-if compares is replayed on the very same requests."""
    rng = random.Random(SEED)
    out: list[Request] = []
    t = 0.0
    sigma = OUTPUT_SIGMA
    outputs = output_lengths(fit.output_mean, fit.max_tokens, sigma)  # once cut, the measured mean (capped.py)
    # kvsim's own arrival process (the benchmark's workloads use it): Poisson at cv 1, the very stream this
    # module drew before it fitted burstiness, else gamma gaps with the fitted cv, scaled so that exactly the
    # fitted rate arrives over the run (a few minutes of cv 3 gaps would otherwise offer +/-10% of it by chance).
    phase = Phase(duration_s, "poisson" if fit.arrival_cv == 1.0 else "gamma", fit.rate_per_s, fit.arrival_cv)
    pinned: list[float] = []
    if fit.arrival_cv != 1.0:
        n = min(2 * MAX_REQUESTS, round(fit.rate_per_s * duration_s))
        gaps = [phase.next_gap(rng, fit.rate_per_s) for _ in range(n + 1)]
        # When the request cap binds, the run is shorter than asked: pin the rate over the span n requests
        # take, not over the whole duration (which would stretch the gaps and simulate a lighter load).
        scale = min(duration_s, n / fit.rate_per_s) / sum(gaps)
        pinned = [g * scale for g in gaps]
    while True:
        t += pinned[len(out)] if pinned else phase.next_gap(rng, fit.rate_per_s)
        if t >= duration_s or len(out) >= 2 * MAX_REQUESTS or (pinned and len(out) + 1 >= len(pinned)):
            return out
        prompt = max(1, round(rng.lognormvariate(math.log(fit.prompt_mean) - sigma * sigma / 2, sigma)))
        output, max_tokens = outputs.draw(rng)
        out.append(Request(prompt_tokens=prompt, output_tokens=output, max_tokens=max_tokens, arrival_s=t,
                           request_id=len(out)))


GRID = 0.025  # the fit is rounded to a 2.5% log grid, so a steady traffic hits the cache window after window
CV_GRID = 0.25  # the arrival cv to the nearest quarter: its estimate scatters by ~+/-0.5 at cv 3 anyway
# The cap to a 10% log grid: placed from a few dozen cut requests a window, it scatters by more than 2.5%.
CAP_GRID = 0.1


def cap_bounds(fit: TrafficFit) -> list[TrafficFit]:
    """The fit with its placed cap one CAP_GRID step lower and one higher (about -10% and +10.5%), kept at or above
    the mean output: the cap is placed, not known (capped.cap_from_length_share is within -12% / +4% of the true
    one on the suite's output spreads, and a window's share scatters), so a change the model prefers at the placed
    cap alone is no gain the pods will see (``whatif.verdict``). None where the cap is unknown."""
    if fit.max_tokens <= 0:
        return []
    floor = math.ceil(fit.output_mean)
    lower = max(floor, round(fit.max_tokens * math.exp(-CAP_GRID)))
    upper = round(fit.max_tokens * math.exp(CAP_GRID))
    # A cap at the rounded mean (every output at it) has no room below; the floor would put "lower" above it.
    caps = [cap for cap, side in ((lower, -1), (upper, 1)) if (cap - fit.max_tokens) * side > 0]
    return [replace(fit, max_tokens=cap) for cap in caps]


def quantized(fit: TrafficFit) -> TrafficFit:
    """The fit on a grid (2.5% for the rate and lengths; the cap 10%, as its ratio to the output mean): traffic
    that barely moved replays the same simulation (from the cache). The cap stays at or above the rounded mean,
    where outputs that all stopped at it (a share of 1) put it."""
    def q(x: float, grid: float = GRID) -> float:
        return round(math.exp(round(math.log(x) / grid) * grid), 3)

    cv = max(CV_GRID, round(fit.arrival_cv / CV_GRID) * CV_GRID)
    output = q(fit.output_mean)
    cap = max(round(output), round(output * q(fit.max_tokens / fit.output_mean, CAP_GRID))) if fit.max_tokens > 0 else 0
    return TrafficFit(q(fit.rate_per_s), q(fit.prompt_mean), output, cap, cv)

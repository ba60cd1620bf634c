"""Lengths the what-if draws so that, cut at ``max_tokens`` as the pods cut them, they average what was measured.
Pure.

The what-if replays each window's outputs as lognormal lengths around the measured mean, cut at the requests'
``max_tokens`` (``replay.replayed_requests``). The mean the pods report is of outputs already cut: drawn around
it and then cut again, the replay's outputs average less than the pods' did, by as much as the cut bites. Measured on the
suite's long-output case on an L40S (outputs 600 +/- 450 tokens, ``max_tokens`` 1024; docs/tuner-suite.md,
"Eleventh pass"): the replay's outputs averaged ~10% short, so at 2048, where admission is bound by the KV blocks
GUARANTEED_NO_EVICT reserves (a fixed prompt + 1024 per request), the model served every request of 36.6 req/s
in time where the pods served 89% (32.7 good req/s; 35.6 at 512). The engine model itself was right: fed the
pods' own requests, the fitted engine served 32.5 at 2048 and 35.4 at 512.

So the replay draws around the mean that, once cut, averages the measured one (``uncut_mean``). That needs the
cap, and no TensorRT-LLM release exports ``max_tokens``. The pods do count the requests that stopped at it: their
``request_success_total`` has a ``finished_reason="length"`` series (tensorrt_llm/executor/result.py sets
"length" for FinishReason.LENGTH; metrics/collector.py labels the counter with it, unprefixed up to 1.2 and
``trtllm_``-prefixed in 1.3). The share cut there and the measured mean place both the cap and the uncut mean,
for the spread the what-if draws with (``cap_from_length_share``, closed form). On the suite's five output
distributions (lognormal, spread 0.76-0.90 where the what-if assumes 0.8, every case's cap 1024) the placed cap
is 906-1,068 from 20,000 requests each (1.6-14% cut; tests/unit/test_length_share_cap.py). It assumes one cap
for every request: clients with different caps are read as one cap between theirs.

Where the share is unknown (no Prometheus page: 1.2's TensorRT backend), or nothing was cut (the cap is then
somewhere above every output, and a share of 0 places it nowhere), each replayed request reserves what it will
use (its ``max_tokens`` is its own output, the least a request can reserve under GUARANTEED_NO_EVICT) and the
outputs are drawn around the measured mean, uncut. Before, an unknown cap was taken as the measured mean plus one
token, and the outputs cut there averaged ~0.7x what the pods measured.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist

# The uncut mean is sought up to this multiple of the cap: beyond it the cut outputs are the cap within 0.1%,
# so a measured mean that close to the cap (nearly every output hit it) is drawn as that.
MAX_UNCUT_FACTOR = 64.0
BISECTIONS = 60
# A cap placed from the share cut at it is kept within this multiple of the measured mean: a share of a request
# in thousands puts it deep in a tail the lognormal guess does not know, and past the engine's max_seq_len the
# replayed requests would all be refused.
MAX_CAP_FACTOR = 8.0
OUTPUT_SIGMA = 0.8  # the log-spread the what-if draws outputs with: a typical chat/completion (median ~0.7x mean)


def cut_mean(mean: float, cap: float, sigma: float) -> float:
    """The mean of min(X, cap), X lognormal with mean ``mean`` and log-spread ``sigma``."""
    if cap <= 0 or mean <= 0:
        return 0.0
    if sigma <= 0:
        return min(mean, cap)
    mu = math.log(mean) - sigma * sigma / 2.0
    z = (math.log(cap) - mu) / sigma
    below = mean * _phi(z - sigma)  # E[X; X < cap]
    return below + cap * (1.0 - _phi(z))


def uncut_mean(measured: float, cap: float, sigma: float) -> float:
    """The lognormal mean whose outputs, cut at ``cap``, average ``measured`` (``measured`` itself when nothing
    is cut: no cap, or no spread); the cap's reach when ``measured`` is at or above it."""
    if cap <= 0 or measured <= 0 or sigma <= 0:
        return measured
    if measured >= cap:
        return cap * MAX_UNCUT_FACTOR
    lo, hi = measured, cap * MAX_UNCUT_FACTOR
    if cut_mean(hi, cap, sigma) <= measured:
        return hi
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        if cut_mean(mid, cap, sigma) < measured:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class OutputLengths:
    """How the what-if draws one request's output and its ``max_tokens``: lognormal around ``mean`` with
    log-spread ``sigma``, cut at ``cap`` (0: the cap is unknown, and a request reserves its own output)."""

    mean: float
    cap: int
    sigma: float

    def draw(self, rng: random.Random) -> tuple[int, int]:
        """(output tokens, max_tokens) of one request."""
        spread = self.sigma
        output = max(1, round(rng.lognormvariate(math.log(self.mean) - spread * spread / 2, spread)))
        return (min(output, self.cap), self.cap) if self.cap > 0 else (output, output)


def cap_from_length_share(measured: float, share: float | None, sigma: float) -> int:
    """The max_tokens at which a share ``share`` of lognormal outputs (log-spread ``sigma``) is cut when, cut
    there, they average ``measured``; 0 (unknown) when the share is unknown or nothing was cut. The uncut mean M
    and the cap c solve P(X > c) = share and E[min(X, c)] = measured: with z the standard normal quantile of
    1 - share, c = M exp(sigma z - sigma^2 / 2), and E[min(X, c)] = M (Phi(z - sigma) + share c / M)."""
    if share is None or not math.isfinite(share) or share <= 0 or not math.isfinite(measured) or measured <= 0 \
            or sigma <= 0:
        return 0
    if share >= 1.0:
        return max(1, round(measured))  # every output stopped at the cap: the mean is the cap
    if 1.0 - share >= 1.0:  # a share below the float's resolution: as deep in the tail as the hold allows
        return round(MAX_CAP_FACTOR * measured)
    z = NormalDist().inv_cdf(1.0 - share)
    ratio = math.exp(sigma * z - sigma * sigma / 2.0)  # cap / uncut mean
    uncut = measured / (_phi(z - sigma) + share * ratio)
    return max(round(measured) + 1, min(round(uncut * ratio), round(MAX_CAP_FACTOR * measured)))


def output_lengths(measured: float, cap: int, sigma: float) -> OutputLengths:
    """The outputs to replay for a measured mean (of outputs the pods cut at ``cap``; 0: unknown)."""
    return OutputLengths(uncut_mean(measured, cap, sigma), max(0, cap), sigma)


def _phi(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))

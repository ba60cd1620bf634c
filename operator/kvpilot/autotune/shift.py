"""A traffic mix in motion: the what-if waits for the request lengths to settle before it sizes a change. Pure.

The what-if replays the window's traffic (``replay.fit_traffic``): its arrival rate, counted from arrivals, is
right from the first window of a new load, but its mean prompt and output come from the requests that finished
in the window. Right after the mix shifts, those are still mostly the old traffic's, and a change sized on them
fits neither. Measured on the suite's document Q&A then chat case without a spare GPU (docs/tuner-suite.md,
"Ninth pass"): 15 s after chat arrived the fit read prompts of 800-1,340 tokens (Q&A ~2,000, chat ~140), the raise
it sized stopped at 60-80 where chat wanted 128-512, and a second rolling restart followed. Each restart without
surge halves the fleet's capacity while it rolls; waiting a 15 s window or two costs a few hundred requests.

So a change the what-if would size waits while the lengths of this window and of the last one (status.kvCache.
traffic, written at the previous pass) differ by more than their noise (``shift_factor``), or by half that beside
an arrival rate that moved. A protective change the measurements call for never waits (the policy does not ask),
nor does a rollback; the rules alone (no model) do not read lengths.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kvpilot.autotune.constants import SEVERE_MISSES
from kvpilot.autotune.window import KvWindow

# Consecutive windows whose mean prompt or output differ by shift_factor(n) or more, n the requests of the smaller
# window: the mix is moving. The factor is the noise bound 1 + NOISE_BOUND / sqrt(n), and at least LENGTH_SHIFT (a
# smaller move leaves the what-if's sizing about right). Two windows of the same traffic with lognormal lengths of
# a chat-like spread (sigma 0.8: the mean of a heavy tail) differ by it, in one of the two lengths, in under 1 of
# 1,000 pairs for n of 30 to 200 (tests/unit/test_traffic_shift.py); a wider spread does more often, and a false
# reading only delays a change by one window.
LENGTH_SHIFT = 1.5
NOISE_BOUND = 7.0
MIN_SHIFT_REQUESTS = 30  # fewer requests in either window: their means say too little to tell
# An arrival rate that moved by this factor since the last window (at least MIN_SHIFT_REQUESTS arrivals: 4 standard
# deviations of a Poisson count) leads the lengths, which then need only half the margin to read as a shift. Same
# traffic at a new rate (a ramp) then reads as a shift, by the noise of its lengths, in 4-8% of such windows (for
# 30-200 requests, prompt or output); each costs one window's wait.
RATE_SHIFT = 1.5
# Finished requests a record may stand for (autotune/pooling.py caps it at a minute's, five on bursty arrivals).
MAX_POOLED = 10_000_000


def shift_factor(requests: float) -> float:
    """How far two windows' mean lengths must differ to be two mixes, the smaller holding ``requests``."""
    return max(LENGTH_SHIFT, 1.0 + NOISE_BOUND / math.sqrt(max(1.0, requests)))


@dataclass(frozen=True)
class SeenTraffic:
    """The traffic the last pass recorded (status.kvCache.traffic): requests per second per pod, mean prompt and
    output tokens, all known (``from_status`` gives None otherwise), and the finished requests they stand for (the
    windows pooled while the traffic held, autotune/pooling.py; 0: unknown, the record is not pooled into)."""

    rate_per_pod: float = 0.0
    prompt_mean: float = 0.0
    output_mean: float = 0.0
    age_s: float | None = None  # how long before this decision it was observed (status.kvCache.observedAt)
    requests: float = 0.0
    # The share of the finished requests that stopped at their max_tokens (None: unknown), from which the what-if
    # places the cap (autotune/capped.py); pooled like the lengths (autotune/pooling.py).
    length_share: float | None = None

    @classmethod
    def from_status(cls, requests_per_minute: object, prompt_tokens: object, output_tokens: object,
                    age_s: float | None = None, requests: object = None,
                    stopped_at_max_tokens: object = None) -> SeenTraffic | None:
        """From status fields (user-writable: anything that is not a finite positive number reads as unknown,
        and a share that is not a decimal from 0 to 1 as no share); None when no figure is usable. A count of
        requests beyond MAX_POOLED reads as unknown too: no fleet finishes that many in the minutes a record
        stands for, so it is forged."""
        figures = [_positive(v) for v in (requests_per_minute, prompt_tokens, output_tokens)]
        if not all(figures) or figures[0] / 60.0 <= 0:  # a rate so small that it underflows per second: forged
            return None
        count = _positive(requests)
        return cls(figures[0] / 60.0, figures[1], figures[2], age_s, count if count <= MAX_POOLED else 0.0,
                   _share(stopped_at_max_tokens))


SHARE = re.compile(r"^(0(\.[0-9]{1,6})?|1(\.0{1,6})?)$")  # as the CRD's pattern has it, at most 6 decimals


def _share(value: object) -> float | None:
    """A share written as a decimal string (status.kvCache.traffic.stoppedAtMaxTokens); None unless a decimal
    from 0 to 1 written as the operator writes it."""
    return float(value) if isinstance(value, str) and SHARE.match(value) else None


def _positive(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float: forged
        return 0.0
    return number if math.isfinite(number) and number > 0 else 0.0


# A run of TrafficShifting holds lasts at most this many tuning intervals (one while most requests miss): traffic
# whose mix keeps moving (or lengths spread wider than the noise bound assumes) then gets the what-if's sizing on
# the window as it is, as before.
MAX_SHIFT_WINDOWS = 2
# The last window's traffic is compared only when it is this many windows old at most (an older one, kept in
# status while windows went empty, says nothing of the last window) ...
STALE_WINDOWS = 2.5
# ... and at least this share of a window old: a pass sooner (the live loop also reconciles on events) reads a
# window that overlaps the last one, which looks alike whatever the traffic does. While holding, such a pass holds on.
OVERLAP_SHARE = 0.8


def _windows_to_wait(w: KvWindow) -> int:
    """MAX_SHIFT_WINDOWS, or one while most requests miss an objective: every window of waiting then costs most of
    its traffic. Measured on document Q&A then chat without a spare GPU: the window after the one that caught the
    shift halfway already held the chat lengths (prompt 150-160 tokens), and a second window's wait cost the run
    1-2% (docs/tuner-suite.md, "Ninth pass")."""
    return 1 if w.miss_share >= SEVERE_MISSES else MAX_SHIFT_WINDOWS


def mix_wait(before: SeenTraffic | None, w: KvWindow, holding_for_s: float | None, interval_s: float) -> str | None:
    """Why a change the what-if would size waits for the mix to settle (None: it need not). ``holding_for_s``:
    how long the tuner has held for a shifting mix already (None: it is not holding)."""
    if holding_for_s is not None and holding_for_s >= _windows_to_wait(w) * interval_s:
        return None
    if before is None or before.age_s is None or w.window_seconds <= 0 or before.age_s > STALE_WINDOWS * w.window_seconds:
        return None
    if before.age_s < OVERLAP_SHARE * w.window_seconds:
        return "the mix was shifting a moment ago" if holding_for_s is not None else None
    return lengths_moving(before, w)


def lengths_moving(before: SeenTraffic | None, w: KvWindow) -> str | None:
    """Why the window's lengths are no fit for the what-if yet, else None: both windows hold MIN_SHIFT_REQUESTS
    requests or more, and a mean prompt or output moved since the last window by shift_factor or more, or by
    half that margin while the arrival rate, which leads the lengths, moved by RATE_SHIFT or more (a window that
    caught a shift halfway: measured on document Q&A then chat, the rate rose 3.9x while the lengths of the
    requests finished moved 1.4x, then 9x a window later)."""
    if before is None or w.prompt_mean <= 0 or w.output_mean <= 0 or w.window_seconds <= 0:
        return None
    pods = max(1, w.pods)
    fewer = min(before.rate_per_pod, w.completion_rate) * w.window_seconds * pods
    if fewer < MIN_SHIFT_REQUESTS:
        return None
    rate_moved = _moved(before.rate_per_pod, w.arrival_rate) >= RATE_SHIFT
    factor = shift_factor(fewer) if not rate_moved else 1.0 + (shift_factor(fewer) - 1.0) / 2.0
    for name, old, new in (("prompt", before.prompt_mean, w.prompt_mean), ("output", before.output_mean, w.output_mean)):
        if _moved(old, new) >= factor:
            rate = (f" while the arrival rate moved {before.rate_per_pod:.1f} -> {w.arrival_rate:.1f} req/s per pod"
                    if rate_moved else "")
            return (f"the mean {name} moved {old:.0f} -> {new:.0f} tokens since the last window{rate}: the traffic's "
                    f"mix is shifting, and lengths taken from finished requests still mix the old traffic's")
    return None


def _moved(old: float, new: float) -> float:
    """How many times the larger of two positive figures is the smaller (inf when either is not positive)."""
    return max(old, new) / min(old, new) if min(old, new) > 0 else math.inf

"""The traffic ahead of a shift: where the window's prompts are heading, for a protective lower to be sized on.
Pure.

The what-if reads the traffic's lengths from the requests that *finished* in the window (``replay.fit_traffic``).
After the mix shifts, the old traffic's long-lived requests keep finishing for minutes, so those lengths lag the
traffic that now arrives, and near a cliff the model is blind to the lag. Measured on the suite's chat then
document Q&A case without a spare GPU (docs/tuner-suite.md, "Thirteenth pass"): documents (2,000-token prompts,
8 req/s) arrive at 900 s; the window at 930 s read prompts of 703 tokens, at 945 s 812, and the finished mean
reached 1,949 only at 1,245 s. kvsim's nominal profile, fed 8 req/s of 2,000-token prompts, serves 6.84 good req/s
at 48 and 0.83 at 143; fed 1,556-token prompts, 7.93 at every limit from 48 up. On the window's lengths the
what-if scored every candidate alike, the TPOT lower the pods called for stopped at 143 (0% in time there), and a
second rolling restart followed five minutes later.

So when the measurements call for a TPOT lower while the mix is moving (``shift.lengths_moving``) and the model,
replaying the window's lengths at the limit in force, misses less than REPRODUCED of what the pods missed, the
mean prompt is carried on in the direction it moved: times its move since the last window raised to k, for k in
STEPS, up to twice the last window's move. The first k at which the model misses REPRODUCED of what the pods
missed is the traffic the candidates are ranked on. The mean output is not carried: the outputs of the requests
that finish while the pods fill read short (the short ones finish first, autotune/pooling.filling), and carried
on they fell to 40 tokens on document Q&A (300 offered) on an engine decoding 30% slower than its profile, where
the lower they sized went to 12 instead of 25 (from 64 with a spare GPU: 12.461 req/s against 13.010). Where no
k reproduces the break (its cause is not the prompts), the candidates are ranked on the window's own lengths, as
before. Never for a change the model may veto, nor where the mix is not moving: a steady traffic's lengths are
read as they are.
"""

from __future__ import annotations

from dataclasses import replace

from kvpilot.autotune.gate import model_misses
from kvpilot.autotune.shift import SeenTraffic, lengths_moving
from kvpilot.autotune.whatif import Engine
from kvpilot.autotune.window import KvWindow

REPRODUCED = 0.5  # the model must miss at least this share of what the pods missed to be said to see the break
STEPS = (0.5, 1.0, 1.5, 2.0)  # powers of the last window's move the prompt is carried on by, nearest first


def traffic_ahead(model: Engine, before: SeenTraffic | None, w: KvWindow, traffic: KvWindow,
                  limit: int) -> tuple[KvWindow, str] | None:
    """``traffic`` (the window the what-if replays) with its lengths carried on to where the model shows the
    break the pods show at ``limit``, and a note for the decision's message; None where the mix is not moving,
    the model sees the break already, or no step reproduces it."""
    if before is None or lengths_moving(before, w) is None:
        return None
    missed = w.miss_share
    seen = model_misses(model, traffic, limit)
    if missed <= 0 or seen is None or seen >= REPRODUCED * missed:
        return None
    prompt_move = w.prompt_mean / before.prompt_mean
    for k in STEPS:
        ahead = replace(traffic, prompt_mean=traffic.prompt_mean * prompt_move ** k)
        shown = model_misses(model, ahead, limit)
        if shown is not None and shown >= REPRODUCED * missed:
            return ahead, (f"the mix is moving (prompts {before.prompt_mean:.0f} -> {w.prompt_mean:.0f}, outputs "
                           f"{before.output_mean:.0f} -> {w.output_mean:.0f} tokens) and on the window's lengths "
                           f"the model misses {seen:.0%} at {limit} where the pods missed {missed:.0%}; carried on "
                           f"to prompts of {ahead.prompt_mean:.0f} tokens, it misses {shown:.0%}: the candidates are "
                           f"ranked there")
    return None

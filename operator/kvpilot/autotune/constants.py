"""The autotuner's thresholds, in one place: how clear a signal must be, how large a step, how long a horizon.

Each is a judgement the policy (``policy.py`` and the modules it draws on) applies; the tuner suite
(docs/tuner-suite.md) measures what they do together.
"""

from __future__ import annotations

HYSTERESIS = 0.05  # utilization band around the target where the tuner does not move
MIN_RELATIVE_STEP = 0.25  # smaller raises are not worth a pod restart
MIN_PROTECTIVE_STEP = 0.10  # lowering to protect memory or latency may be finer
MAX_RAISE_FACTOR = 2.0  # without a completion rate to size the step
MIN_RAISE_FACTOR = 1.5  # a raise that fixes misses must be a real step
# The rules raise at most x4 in one change; the what-if's ladder (ladder.candidates) may still offer x8.
MAX_STEP_FACTOR = 4.0
# While the calibrated model disagrees with the pods by more than its bound (autotune/trust.py), raises are sized
# from measurements alone and step at most x1.5 (MIN_RAISE_FACTOR: the smallest raise worth a restart), so a
# harmful one costs little before verification sees it; protective lowers keep their size.
CONSERVATIVE_STEP_FACTOR = 1.5
LITTLE_MARGIN = 1.25  # headroom over the concurrency Little's law asks for
TTFT_MISS_TOLERANCE = 0.02  # fewer TTFT misses than this are noise, not a reason to restart
TPOT_HEADROOM = 0.8  # raise only while p95 TPOT is under 80% of its objective
TPOT_MISS_TOLERANCE = 0.05
PLANNING_HORIZON_SECONDS = 1800.0  # how long a change is assumed to pay off
SEVERE_MISSES = 0.5  # when half the requests miss, acting beats any restart cost
MAX_LOWER_FACTOR = 0.5
MIN_SAMPLES = 3
SATURATION = 0.95  # the batch counts as full when its peak reaches 95% of the limit
REVERSAL_MIN_TPOT_MISSES = 0.20  # a lower right after a raise needs this share of TPOT misses (or pauses)
# A TPOT break with REVERSAL_MIN_TPOT_MISSES or more missing is taken at its window's share, not the pooled one,
# once this many settled windows in a row at the limit in force missed that many (rules._lasting_misses): a swell
# lasts a window or two, a cliff lasts.
LASTING_BREAK_WINDOWS = 3
TRADE_OFF_P95 = 1.1  # a TPOT break with p95 within 10% of the objective (and few misses) may be a trade-off
# Where the settled minutes at the limit in force show the trade-off, a window's p95 up to this many times the
# objective may still be one (signals.tpot_trade_off): on document Q&A (rag-then-chat-a100, prefill 30% slower)
# single windows in a swell read p95 78 ms against 60 ms (1.3x) where the phase missed 1.4% of its requests.
# Beyond it the window is a cliff: a break that lasts is not left to the what-if while the settled minutes catch up.
SETTLED_TRADE_OFF_P95 = 1.5
REVERSAL_MIN_TTFT_MISSES = 0.20  # a raise past where a recent lower started needs this share of TTFT misses
UNDO_MIN_TPOT_MISSES = SEVERE_MISSES  # a lower past where a recent raise started needs this share of TPOT misses
# Requests miss TTFT beside a batch far below the limit (admission waits on KV blocks): a lower to this many times
# the batch that runs gives the unused slots' runtime buffers back to the pool (rules._free_slots).
FREE_SLOTS_HEADROOM = 2.0
# A TPOT break with fewer misses than REVERSAL_MIN_TPOT_MISSES in its window is judged on the misses pooled over
# at least this much settled evidence at the limit in force (verification's baseline), not on the one window.
TPOT_CONFIRM_SECONDS = 60.0
# A window's miss share weighs a KV-pool lower on its own once the fleet finished this many requests in it; fewer,
# and the settled minutes at the limit in force decide (rules._pool_evidence). It is also the least the sparse
# pool of a very low rate needs (rules.settled_misses). A TPOT break's share needs TPOT_WINDOW_REQUESTS.
MIN_WINDOW_REQUESTS = 10
# A TPOT break's window share weighs a lower on its own (acting at once, or counting as lasting) only once the
# fleet finished this many requests in it: the bar verification holds a side's share to (verify.MIN_REQUESTS; a
# unit test keeps the two equal). Fewer, and the settled minutes decide; rules._lasting_misses says why (a burst's
# ten requests miss together, and past SEVERE_MISSES such a share skipped the restart's price).
TPOT_WINDOW_REQUESTS = 40
LOWER_MARGIN = 2.0  # a protective lower must save twice what its restart costs
MIN_CAPACITY_GAIN = 1.10  # a raise must promise at least this much more decode throughput (fitted model)
# A raise while p95 TPOT is already near its objective must win the simulation by this many times its margin:
# the outcome then hinges on the tail of the output lengths, which the fit (means only) does not know
# (docs/tuner-suite.md, "How the tuner decides now", for the case that showed it).
TPOT_NEAR_MARGIN_FACTOR = 2.0

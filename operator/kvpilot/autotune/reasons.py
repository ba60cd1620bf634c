"""Why the tuner decided what it did: one name per outcome, written to status.autotune (recommendation and
history ``reason``) and into the Events and metrics the operator derives from them.

The values are part of the API (users alert and filter on them), so a member is never renamed; the text the
tuner writes is the value itself (a ``StrEnum`` formats as its value).
"""

from __future__ import annotations

from enum import StrEnum


class TunerReason(StrEnum):
    # Preconditions: the tuner only observes.
    ROLLOUT_IN_PROGRESS = "RolloutInProgress"
    OUT_OF_BOUNDS = "OutOfBounds"  # the value in force is outside the bounds: clamped at once
    INSUFFICIENT_DATA = "InsufficientData"
    PARTIAL_SIGNALS = "PartialSignals"
    # The batch is too large (protective lowers), or a lower would not help.
    REQUESTS_PAUSED = "RequestsPaused"
    KV_CACHE_PRESSURE = "KvCachePressure"
    TPOT_OBJECTIVE_BROKEN = "TpotObjectiveBroken"
    LIMIT_NOT_BINDING = "LimitNotBinding"
    NOT_WORTH_A_RESTART = "NotWorthARestart"
    # A TPOT break in one window while the batch at this limit has not settled long enough to tell a
    # transient from a lasting one (rules.py, ``_lasting_misses``), or a mild one (the settled minutes missed
    # under 10%) that the calibrated model reads far worse than the pods do, so no model may judge it
    # (judged.py, ``over_read``), or one window before the settled minutes where the model holds staying put
    # clearly best (judged.py, ``waits_for_settling``).
    TPOT_BREAK_UNCONFIRMED = "TpotBreakUnconfirmed"
    # The KV pool calls for a lower (requests paused, a MaxUtilization pool over target), but too few requests
    # finished to say what it costs them, and there are no settled minutes at this limit yet (``_pool_lower``).
    KV_PRESSURE_UNCONFIRMED = "KvPressureUnconfirmed"
    # The batch is too small (raises, rebuilds), or a raise would not help.
    NO_PRESSURE = "NoPressure"
    RESERVATION_BOUND = "ReservationBound"
    AT_TARGET = "AtTarget"
    TPOT_NEAR_OBJECTIVE = "TpotNearObjective"
    QUEUE_WITH_HEADROOM = "QueueWithHeadroom"
    CEILING_TOO_LOW = "CeilingTooLow"
    REBUILD_NOT_WORTH_IT = "RebuildNotWorthIt"
    CHANGE_TOO_SMALL = "ChangeTooSmall"
    # The guarantees (guarantees.py).
    WOULD_OSCILLATE = "WouldOscillate"
    RECENT_RAISE = "RecentRaise"
    NO_CAPACITY_GAIN = "NoCapacityGain"
    # What is measured overrules what is predicted (rollback.py): a change that served measurably worse is
    # rolled back; a change into a direction verification barred waits out the planning horizon; a change in the
    # direction of one still being verified waits for its verdict.
    ROLLED_BACK = "RolledBack"
    BARRED_BY_VERIFICATION = "BarredByVerification"
    AWAITING_VERIFICATION = "AwaitingVerification"
    # Timing and the what-if simulation.
    COOLDOWN = "Cooldown"
    NO_PREDICTED_GAIN = "NoPredictedGain"
    WHAT_IF_BUDGET_SPENT = "WhatIfBudgetSpent"
    # The traffic's mix is shifting: the request lengths the what-if would size a change on still mix the old
    # traffic's (autotune/shift.py); the change waits a window or two.
    TRAFFIC_SHIFTING = "TrafficShifting"


# Lowers that protect memory or latency: they skip the cooldown (after two intervals) and need no simulation
# budget to go ahead.
PROTECTIVE_REASONS = (TunerReason.REQUESTS_PAUSED, TunerReason.KV_CACHE_PRESSURE, TunerReason.TPOT_OBJECTIVE_BROKEN)

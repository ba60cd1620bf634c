"""What one tuning decision returns: the action, the value to run with, and why."""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.api.status import Action
from kvpilot.autotune.reasons import TunerReason


@dataclass(frozen=True)
class Decision:
    action: Action
    target: int  # the runtime max_batch_size to run with (== current for Hold)
    reason: TunerReason
    message: str
    ceiling_request: int | None = None  # for Rebuild: the engine ceiling to build
    # A hold because the what-if found no candidate worth a restart, a verdict that stands a while: status records
    # when it declined, and the simulation reruns only RECHECK_SECONDS later (False on every other decision,
    # including a decline by a young model's error alone, which reruns at the next proposal).
    recheck_later: bool = False
    # A hold that waits for a shifting mix with a TPOT lower pending (policy._break_in_transit): status keeps the
    # traffic record from before the shift (desired/tuning.kept_through_shift), so the lower after the wait is
    # sized on the traffic ahead.
    keeps_traffic: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", Action(self.action))  # "Raise" from a test or a log reads as Raise
        object.__setattr__(self, "reason", TunerReason(self.reason))

    @property
    def changes(self) -> bool:
        return self.action != Action.HOLD

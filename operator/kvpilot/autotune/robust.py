"""Minimax regret: which option survives the model being wrong (issue 18).

The engine model is fitted at the limit in force and extrapolates to every other. Where options clear the bar in
the model, the what-if (``whatif.choose``) replays them, staying put included, on an engine slower than the model
(``whatif.slower_engine``) and keeps the options whose worst regret over the two engines is least. A pure function
of the goodputs each engine gives each option.
"""

from __future__ import annotations

from collections.abc import Mapping


def least_regret(candidates: list[int], engines: list[Mapping[int, float]], tolerance: float) -> list[int]:
    """The candidates whose worst regret over ``engines`` (each a candidate's goodput on one engine; the regret is
    1 - goodput / the best candidate's goodput on that engine) is within ``tolerance`` of the least worst regret:
    minimax regret, ties kept, in the order given."""
    def regret(c: int) -> float:
        worst = 0.0
        for goodput in engines:
            top = max(goodput[k] for k in candidates)
            worst = max(worst, 1.0 - goodput[c] / top if top > 0 else 0.0)
        return worst

    regrets = {c: regret(c) for c in candidates}
    least = min(regrets.values())
    return [c for c in candidates if regrets[c] <= least + tolerance]

"""Where the model may judge a lower, and where it misreads the limit in force.

The what-if ranks candidates on the traffic it replays; the pods measure the limit in force. These checks set
one against the other before the model's word counts: a mild TPOT break is the calibrated model's to judge where
it reproduces the break (``model_judges``); one it over-reads waits (``over_read``); and a lower only the model
asks for is declined where it reads the limit in force far worse than the settled minutes served it, or worse by
more than the lower gains (``over_read_gain``); a break read on one window before any settled minutes waits for
them where the fitted model holds staying put clearly best (``unsettled_break``, ``waits_for_settling``). Pure:
each reads the tuner's input and one memoized simulation (``gate.model_misses``), or the what-if's verdict.
"""

from __future__ import annotations

import math

from kvpilot.autotune.constants import SEVERE_MISSES, TPOT_CONFIRM_SECONDS
from kvpilot.autotune.decision import Decision
from kvpilot.autotune.gate import model_misses
from kvpilot.autotune.inputs import TunerInput
from kvpilot.autotune.reasons import TunerReason
from kvpilot.autotune.rules import settled_misses, young_batch
from kvpilot.autotune.whatif import MARGIN, WhatIf
from kvpilot.autotune.whatif import Engine as WhatIfEngine
from kvpilot.autotune.window import KvWindow

# A TPOT break that misses fewer than this share of the requests over the settled minutes is one the calibrated
# model may judge (``model_judges``); at this share or more the lower is made whatever any model says.
MILD_BREAK = 0.10
REPRODUCED = MILD_BREAK / 2  # the model's miss share at most this below the settled one, to judge (``model_judges``)
OVER_READ = MILD_BREAK  # the model's miss share this far above the settled one: the mild break waits (``over_read``)


def model_judges(inp: TunerInput, w: KvWindow, decision: Decision, model: WhatIfEngine) -> str | None:
    """Why the calibrated model may veto this protective lower (None: it may not). A TPOT break that missed fewer
    than MILD_BREAK of the requests over the settled minutes at this limit (``rules.settled_misses``) is no cliff,
    and a model fitted to these pods (trusted: its step latency within the bound of theirs) knows whether a
    smaller batch fixes it: prefill chunks of long prompts interleaved with the decode steps break TPOT at any
    batch size. Measured on document Q&A served 20% faster than its profile (rag-then-chat-a100.all-fast from
    2048, docs/tuner-suite.md "Tenth pass"): 2048 missed 2.1% of the phase, single windows 19-29% and the settled
    minutes 6%; static 64 served 19 more of the phase's 7,200 requests than static 2048, and the lower to 60 the
    rules made left the pods at 60 when chat arrived. The datasheet never judges a break (issue 18: at 512 it saw
    no gain where the pods missed every request), nor does any model a break of MILD_BREAK or more, paused
    requests or KV pressure, nor a model blind to the break:
    staying put on the traffic it replays (``w``), it must miss within REPRODUCED of the share the settled minutes
    missed; one that over-reads it by OVER_READ or more judges nothing, and the break waits (``over_read``,
    checked first). Within, not as much:
    the settled minutes are a swell-prone sample (on the document Q&A they read 2.3-6.0% where the phase missed
    2.1%, and the model 1.3-2.4%). On the overloaded case with a 22 ms TPOT
    objective the model served every request at 2048 where the pods missed 7-8% over the settled minute; its veto
    held 2048 (26.75 req/s), where the lower it may not veto now serves 27.57."""
    reading = _mild_reading(inp, w, decision, model)
    if reading is None:
        return None
    settled, seconds, seen = reading
    if settled - seen >= REPRODUCED:
        return None
    return (f"a mild break ({settled:.1%} missed over {seconds:.0f}s; the model fitted to the pods misses "
            f"{seen:.1%} staying put), which the model judges")


def over_read(inp: TunerInput, w: KvWindow, decision: Decision, model: WhatIfEngine) -> str | None:
    """Why this protective lower waits (None: it need not): a mild break (under MILD_BREAK missed over the settled
    minutes) that the calibrated model, staying put on the traffic it replays, reads OVER_READ or more worse than
    the settled minutes did. Where a calibrated model exists, a mild break is its to judge (``model_judges``);
    this one cannot judge it, nor size a lower. The break waits (``TpotBreakUnconfirmed``) until the settled
    minutes miss MILD_BREAK or more, when the lower is made and no model may veto it, or until a model reproduces
    it. This holds a protective lower back, which only a calibrated model's presence does, and only for a time: a
    break that lasts at 20-50% of each window's requests is lowered 30-75 s later than before. Without a
    calibrated model (the datasheet, a fit not trusted, the budget spent) the rules' lower goes ahead as before.
    Measured on document Q&A served 20% faster than its profile (rag-then-chat-a100.all-fast from 2048, PyTorch,
    spare GPU, docs/tuner-suite.md "Twenty-third pass" and "Thirty-third pass"): one window's swell of long
    prompts missed 30%, the settled minutes 6.2%, the model 37.8% staying put. Judging the break the model chose
    29 (0.909x static 2048); the rules' own lower, to 58, left the pods at 58 when chat arrived (0.954x). Waiting,
    the run stays at 2048 (1.000x), and the other runs where this fired moved by -0.1% to +0.9%."""
    reading = _mild_reading(inp, w, decision, model)
    if reading is None:
        return None
    settled, seconds, seen = reading
    if seen - settled < OVER_READ:
        return None
    return (f"the model fitted to the pods misses {seen:.1%} staying put where the settled minutes missed "
            f"{settled:.1%} over {seconds:.0f}s: it does not reproduce this break, so it neither judges nor "
            f"sizes a lower, and a mild break no model judges waits until the settled minutes miss "
            f"{MILD_BREAK:.0%} or more, or a model reproduces it")


def over_read_gain(inp: TunerInput, w: KvWindow, decision: Decision, model: WhatIfEngine,
                   gain: float | None = None) -> str | None:
    """Why the model's gain from a TPOT lower it judges (a trade-off or a mild break, no protective one) is no
    evidence (None: it may be; and for any other lower, such as one for free batch slots, where it was not
    measured). Staying put on the traffic it replays (``w``), the model (fitted or not) misses more of the requests
    than the settled minutes at this limit missed (``rules.settled_misses``), by OVER_READ or more, or by more than
    ``gain`` (``WhatIf.gain``: the share of the requests the lower is predicted to win). It then ranks a swell, not
    the traffic: the window it replays (a burst of long prompts) makes the limit in force look worse than the pods
    have served it, and a gain smaller than that misreading is the misreading. The mirror of ``over_read`` (a
    protective lower on a mild break waits), for a lower only the model asks for: it is declined and the
    simulation reruns RECHECK_SECONDS later.

    Measured (docs/tuner-suite.md "Thirty-fifth pass", "Thirty-sixth pass"), both PyTorch with a spare GPU:
    * tight-tpot-overload.decode0.7 from 64 (22 ms TPOT objective, decoding 30% off its profile): at 1,425 s a
      window of 365-token prompts (299 before) replayed at 64 missed 50% where the settled 135 s missed 32%; the
      model chose 40 (15.17 against 12.86 good req/s staying put), the pods served 15.7 good req/s at 40 where
      they had served 19.2 at 64, and the rollback 270 s later left the run at 0.970x static 64;
    * rag-then-chat-a100.all-fast from 64 (document Q&A, then chat, on an engine 20% faster everywhere): at 510 s
      the settled 139 s at 64 missed 4.0% (a mild break the model judges), the model 10.5%; it chose 32 for a
      gain of 4.4% of the requests (8.07 against 7.69 good req/s of 8.6), verification found +3% within an 11%
      noise bound, and chat arrived at 900 s to a batch of 32: 0.933x the oracle, where the instant reference
      reaches 0.985x."""
    settled = settled_misses(inp) if decision.reason == TunerReason.TPOT_OBJECTIVE_BROKEN else None
    seen = model_misses(model, w, inp.current) if settled is not None else None
    if settled is None or seen is None:
        return None
    # ``seen`` and ``gain`` read the same replayed traffic (``quantized(fit_traffic(w))``, one rate); ``seen`` is
    # the memoized run staying put that the verdict made where their run budgets agree (a lower's few candidates),
    # else another draw of the same simulation.
    over = seen - settled[0]
    misread = (f"the model misses {seen:.1%} staying put on the traffic it replays, where the settled minutes at "
               f"{inp.current} missed {settled[0]:.1%} over {settled[1]:.0f}s")
    if gain is not None and over > max(gain, 0.0):
        return (f"{misread}: its gain from a lower ({gain:.1%} of the requests) is within what it over-reads, "
                f"no evidence")
    if over >= OVER_READ:
        return f"{misread}: it ranks a swell, so its gain from a lower is no evidence"
    return None


def unsettled_break(inp: TunerInput, w: KvWindow, decision: Decision) -> str | None:
    """Why a protective lower for a TPOT break may wait for the settled minutes (None: it may not), if the model
    then holds staying put clearly best (``waits_for_settling``): the break is read on this window's own share
    alone (no settled minutes at this limit yet, ``rules.settled_misses``; for a thin window the rules may have
    sized it on the sparse pool, the gate reads the window's share still), fewer than SEVERE_MISSES of its
    requests missed TPOT, and the batch at this limit is young (``rules.young_batch``). A window of 20-50% missing
    decides at once where nothing else weighs (``rules._lasting_misses``); a minute of settled traffic tells a
    cold start's swell from a lasting break."""
    if decision.reason != TunerReason.TPOT_OBJECTIVE_BROKEN or settled_misses(inp) is not None:
        return None
    share = w.tpot_miss_fraction
    if share is None or share >= SEVERE_MISSES or not young_batch(inp):
        return None
    base = inp.history.verification.baseline
    return (f"one window's share ({share:.0%} missing TPOT) is no lasting break before the batch at "
            f"{inp.current} has settled ({base.side.seconds:.0f}s of settled traffic; a lasting break is told "
            f"from a transient on {TPOT_CONFIRM_SECONDS:.0f}s): waiting")


def waits_for_settling(unsettled: str | None, verdict: WhatIf, calibrated: bool, error: float) -> str | None:
    """Why the protective lower of an ``unsettled_break`` waits (None: it goes ahead as the rules size it): a
    model fitted to these pods and trusted (``calibrated``; the datasheet never judges a break, and reads an error
    of 0) declined every lower, and staying put scores above the best of them by more than the model's error and
    the what-if's MARGIN (``WhatIf.lead``), a verdict and not a tie. It delays, never vetoes: once the settled
    minutes exist they weigh the break as without this wait (MILD_BREAK or more missed over them is lowered
    whatever any model says; a milder break or a trade-off is the model's to judge), and past the young batch's
    time the window's own share decides as before.
    Measured on the suite's overloaded case with a 22 ms TPOT objective, served by PyTorch slower in everything
    with a spare GPU (tight-tpot-overload.all-slow from 64, docs/tuner-suite.md "Thirty-fifth pass"): at 75 s,
    15 s past the warm-up, a window missed TPOT for 29% of its requests; the model scored staying at 64 at 19.85
    good req/s and the best lower, 51, at 17.90 (a lead of 10%, its error 6%); the lower went ahead, TTFT misses at
    51 ran 24-44% for the rest of the run, no way back to 64 was open within the planning horizon: 0.953x static
    64. Without the lead it misfired: on the TensorRT backend (that case, from 64; long-output-a100.prefill0.7 from
    2048) the model's lead was 2% and none, the lower the window called for was a gain, and waiting cost 1.5% and
    5.8%."""
    if unsettled is None or verdict.best is not None or not calibrated or not math.isfinite(error):
        return None
    bar = max(error, MARGIN)
    if verdict.lead <= bar:
        return None
    return (f"staying put scores {verdict.lead:.0%} above every lower the fitted model tries, past its error "
            f"and margin ({bar:.0%}), and {unsettled}")


def _mild_reading(inp: TunerInput, w: KvWindow, decision: Decision,
                  model: WhatIfEngine) -> tuple[float, float, float] | None:
    """(share missed over the settled minutes, their seconds, the calibrated model's share missed staying put on
    ``w``) for a TPOT-break lower whose settled share is a mild break (under MILD_BREAK); None otherwise. The
    model's share is one memoized simulation (``gate.model_misses``)."""
    if decision.reason != TunerReason.TPOT_OBJECTIVE_BROKEN or not inp.what_if.calibrated:
        return None
    settled = settled_misses(inp)
    if settled is None or settled[0] >= MILD_BREAK:
        return None
    seen = model_misses(model, w, inp.current)
    return None if seen is None else (settled[0], settled[1], seen)

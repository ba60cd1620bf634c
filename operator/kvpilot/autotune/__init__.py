"""The pure autotuner. ``policy.decide`` is the entry point; it reads ``inputs`` (its input), returns a
``decision.Decision`` with a ``reasons.TunerReason``, and draws on ``constants`` (thresholds), ``signals`` (what
the window says), ``costs`` (what a restart costs), ``rules`` (what to propose) and ``guarantees`` (what no
change may do). It checks a proposed change with the what-if on kvsim (``whatif.py``, behind the gate in
``gate.py``), which replays traffic on a fleet of simulated replicas (``fleet.py``, also the benchmark's: the
operator must not depend on ``bench``). Its input window (``window.KvWindow``) is summarized from the pods'
samples by ``summarize`` (the arrival burstiness by ``burst``): pure maths, which the live sampler
(``kvpilot.observe``) and the benchmark both call.

The bookkeeping of a decision in status (the value in force, its source, the history) lives in
``desired/batching.py``, next to the rest of the status the plan writes."""

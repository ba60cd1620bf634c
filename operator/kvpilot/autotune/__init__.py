"""The pure autotuner. ``policy.decide`` is the entry point; it draws on ``decision`` (its input and output
types), ``constants`` (thresholds), ``signals`` (what the window says), ``costs`` (what a restart costs),
``rules`` (what to propose) and ``guarantees`` (what no change may do), and checks a proposed change with the
what-if on kvsim (``whatif.py``), which replays traffic on a fleet of simulated replicas (``fleet.py``, also the
benchmark's: the operator must not depend on ``bench``).

The bookkeeping of a decision in status (the value in force, its source, the history) lives in
``desired/batching.py``, next to the rest of the status the plan writes."""

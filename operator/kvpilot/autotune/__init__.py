"""Pure autotune policy (``policy.py``) and its what-if check on kvsim (``whatif.py``), which replays traffic on
a fleet of simulated replicas (``fleet.py``, also the benchmark's: the operator must not depend on ``bench``).

The bookkeeping of a decision in status (the value in force, its source, the history) lives in
``desired/batching.py``, next to the rest of the status the plan writes."""

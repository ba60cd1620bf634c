"""`kvpilot bench tuner`: the autotuner's observe and decide code driven against kvsim in simulated time."""

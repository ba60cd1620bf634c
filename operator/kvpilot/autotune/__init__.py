"""Pure autotune policy and the bookkeeping of its decisions in status."""

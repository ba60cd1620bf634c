"""Pure functions: (spec, observed state, now) -> the child objects, the status and the events.

Nothing here reads a clock, the environment or the network; the handlers pass all of it in. That makes
every decision reproducible in a unit test and printable by ``kvpilot render``.
"""

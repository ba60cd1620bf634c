"""The operator's run-time sizes that more than one module defaults: one value each, named once.

``kvpilot run``'s flags, the kopf memo and the classes that use them (``EngineLoops``, ``Api``) all default to
these, so the operator started by hand, by the chart or by a test gets the same sizes. A light module (no
imports): the CLI reads it without loading the operator.
"""

from __future__ import annotations

CONCURRENT_RECONCILES = 32  # reconcile passes at once (workqueue.PrioritySlots); changes go before resyncs
API_POOL_SIZE = 32  # threads, and kept-alive HTTP connections, for API-server calls (k8s/api.py)
CONCURRENT_SCRAPES = 64  # serving pods scraped at once, over every engine

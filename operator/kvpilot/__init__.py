"""kvpilot: builds TensorRT-LLM engines, serves them, and retunes max_batch_size from the KV-cache pool.

Layering (enforced by tests/unit/test_layering.py):
``api``, ``trtllm``, ``desired`` and ``autotune`` are pure; ``observe`` and ``k8s`` do I/O; ``handlers`` is the
thin kopf layer that wires them together.
"""

__version__ = "0.1.0"

GROUP = "serving.kvpilot.io"
VERSION = "v1alpha1"
KIND = "InferenceEngine"
PLURAL = "inferenceengines"
SINGULAR = "inferenceengine"
SHORT_NAME = "ie"
API_VERSION = f"{GROUP}/{VERSION}"

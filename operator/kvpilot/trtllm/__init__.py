"""The TensorRT-LLM contract — the one place in kvpilot that knows TensorRT-LLM.

It renders the real commands (download, checkpoint conversion or quantization, ``trtllm-build``,
``trtllm-serve``) and the LLM-API YAML for the serving image's release surface (``surface.py``,
``options/releases.yaml``: 1.2.0, 1.2.1, 1.3.x), and parses what ``trtllm-serve`` reports (``/metrics`` iteration
stats, ``/prometheus/metrics``) as untrusted input. Every rendered flag is checked against the real parsers'
option lists kept in ``options/`` (see ``options.py``).
"""

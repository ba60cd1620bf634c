"""The TensorRT-LLM contract — the one place in kvpilot that knows TensorRT-LLM.

It renders the real commands (download, checkpoint conversion or quantization, ``trtllm-build``,
``trtllm-serve``) and the LLM-API YAML for TensorRT-LLM 1.2, and parses what ``trtllm-serve`` reports
(``/metrics`` iteration stats, ``/prometheus/metrics``). Every rendered flag is checked against the real
parsers' option lists kept in ``options/`` (see ``options.py``).
"""

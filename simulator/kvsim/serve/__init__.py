"""``kvsim trtllm-serve``: TensorRT-LLM 1.2's OpenAI-compatible server on the simulated engine (aiohttp)."""

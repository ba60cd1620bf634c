"""TensorRT-LLM's file formats and command lines, simulated: checkpoints, trtllm-build, engine directories."""

TRTLLM_VERSION = "1.2.0"

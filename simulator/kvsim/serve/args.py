"""trtllm-serve 1.2's command line (a click command in tensorrt_llm/commands/serve.py @00209af1), re-declared.

Parsed with argparse but reported like click: an unknown option prints ``Error: No such option: --x`` and exits
2. ``trtllm-serve MODEL`` and ``trtllm-serve serve MODEL`` both work, as with the real entry point. The
``--backend`` choices are the played release's (``KVSIM_TRTLLM_RELEASE``): from 1.3.0rc21 ``tensorrt`` is not
one, and click refuses it with exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from typing import NoReturn

from ..trtllm.releases import ENV as RELEASE_ENV
from ..trtllm.releases import resolve as resolve_release

LOG_LEVELS = ["internal_error", "error", "warning", "info", "verbose", "debug", "trace"]


class ClickStyleParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments: "):
            message = "No such option: " + message.split(": ", 1)[1]
        elif message.startswith("argument --backend: "):
            message = message.split(": ", 1)[1]
        elif "the following arguments are required: MODEL" in message:
            message = "Missing argument 'MODEL'."
        sys.stderr.write("Usage: trtllm-serve serve [OPTIONS] MODEL\nTry 'trtllm-serve serve --help' for help.\n\n"
                         f"Error: {message}\n")
        sys.exit(2)


ALL_BACKENDS = ("pytorch", "tensorrt", "_autodeploy")


def backend_choice(choices: tuple[str, ...] = ALL_BACKENDS) -> Callable[[str], str]:
    def check(value: str) -> str:
        value = {"trt": "tensorrt"}.get(value, value) if "tensorrt" in choices else value
        if value not in choices:
            listed = ", ".join(f"'{c}'" for c in choices)
            raise argparse.ArgumentTypeError(f"Invalid value for '--backend': {value!r} is not one of {listed}.")
        return value

    return check


def release_backends(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The played release's --backend choices (all three when the release is not valid: resolve() says why)."""
    try:
        return resolve_release(environ.get(RELEASE_ENV)).backends
    except ValueError:
        return ALL_BACKENDS


def build_parser(backends: tuple[str, ...] = ALL_BACKENDS) -> argparse.ArgumentParser:
    p = ClickStyleParser(prog="trtllm-serve serve", add_help=True, allow_abbrev=False,
                         description="Running an OpenAI API compatible server (simulated by kvsim). "
                                     "MODEL: model name | HF checkpoint path | TensorRT engine path")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--custom_tokenizer", default=None)
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--backend", type=backend_choice(backends), default="pytorch")
    p.add_argument("--custom_module_dirs", action="append", default=[])
    p.add_argument("--log_level", choices=LOG_LEVELS, default="info")
    p.add_argument("--max_beam_width", type=int, default=1)
    p.add_argument("--max_batch_size", type=int, default=2048)
    p.add_argument("--max_num_tokens", type=int, default=8192)
    p.add_argument("--max_seq_len", type=int, default=None)
    p.add_argument("--tensor_parallel_size", "--tp_size", dest="tensor_parallel_size", type=int, default=1)
    p.add_argument("--pipeline_parallel_size", "--pp_size", dest="pipeline_parallel_size", type=int, default=1)
    p.add_argument("--context_parallel_size", "--cp_size", dest="context_parallel_size", type=int, default=1)
    p.add_argument("--moe_expert_parallel_size", "--ep_size", dest="moe_expert_parallel_size", type=int, default=None)
    p.add_argument("--moe_cluster_parallel_size", "--cluster_size", dest="moe_cluster_parallel_size", type=int,
                   default=None)
    p.add_argument("--gpus_per_node", type=int, default=None)
    p.add_argument("--free_gpu_memory_fraction", "--kv_cache_free_gpu_memory_fraction",
                   dest="free_gpu_memory_fraction", type=float, default=0.9)
    p.add_argument("--num_postprocess_workers", type=int, default=0)
    p.add_argument("--trust_remote_code", action="store_true")
    p.add_argument("--revision", default=None)
    p.add_argument("--config", "--extra_llm_api_options", dest="extra_llm_api_options", default=None)
    p.add_argument("--reasoning_parser", default=None)
    p.add_argument("--tool_parser", default=None)
    p.add_argument("--metadata_server_config_file", default=None)
    p.add_argument("--server_role", default=None)
    p.add_argument("--fail_fast_on_attention_window_too_large", action="store_true")
    p.add_argument("--otlp_traces_endpoint", default=None)
    p.add_argument("--disagg_cluster_uri", default=None)
    p.add_argument("--enable_chunked_prefill", action="store_true")
    p.add_argument("--media_io_kwargs", default=None)
    p.add_argument("--chat_template", default=None)
    return p


def parse(argv: list[str], environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    if argv and argv[0] == "serve":
        argv = argv[1:]
    return build_parser(release_backends(os.environ if environ is None else environ)).parse_args(argv)

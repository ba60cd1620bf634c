"""``kvsim trtllm-serve MODEL [OPTIONS]``: resolve settings, load (wait), then serve until SIGTERM/SIGINT."""

from __future__ import annotations

import os
import socket
import sys
import time

from ..perturb import PerturbationError
from . import warmup
from .args import parse
from .settings import ServeError, ServeUsageError, resolve

LIMIT_ERRORS = ("is greater than build_config.max_batch_size", "is greater than build_config.max_num_tokens")
# The operator renders terminationGracePeriodSeconds 125 = a 5 s preStop delay + 120 s to drain: SIGTERM
# arrives after the delay, and in-flight requests get up to 110 s, well before the SIGKILL.
GRACEFUL_SHUTDOWN_SECONDS = 110.0
# A connection must deliver its request headers within this time (also the idle keep-alive timeout, like
# uvicorn's timeout_keep_alive): slow or silent clients cannot hold sockets open forever.
HEADER_TIMEOUT_SECONDS = 10.0


def _log(message: str) -> None:
    print(f"[TensorRT-LLM][INFO] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    try:
        settings = resolve(args)
    except PerturbationError as exc:  # a usage error in the environment: one line, click's exit code 2
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        return 2
    except ServeUsageError as exc:  # as click reports a bad option value
        sys.stderr.write("Usage: trtllm-serve serve [OPTIONS] MODEL\nTry 'trtllm-serve serve --help' for help.\n\n"
                         f"Error: {exc}\n")
        return 2
    except ServeError as exc:
        message = str(exc)
        if any(marker in message for marker in LIMIT_ERRORS):
            cls = "TrtLlmArgs" if args.backend == "tensorrt" else "TorchLlmArgs"
            print(f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {cls}\n"
                  f"  Value error, {message} [type=value_error, input_type=dict]", file=sys.stderr, flush=True)
        elif message.startswith("AttributeError: "):  # raised inside the server's startup, not a usage error
            print(f"Traceback (most recent call last):\n  ...\n{message}", file=sys.stderr, flush=True)
        else:
            print(f"Error: {message}", file=sys.stderr, flush=True)
        return 1
    sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as exc:
        print(f"RuntimeError: Failed to bind socket to {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 1
    cfg = settings.engine
    from ..memory import engine_graphs, plan_for

    plan, graphs = plan_for(cfg), engine_graphs(cfg)
    for warning in settings.warnings:
        print(f"[TensorRT-LLM][WARNING] {warning}", flush=True)
    _log(f"kvsim plays TensorRT-LLM {settings.version} (KVSIM_TRTLLM_RELEASE)")
    _log(f"kvsim simulated backend: profile {settings.profile_name} ({cfg.resolved_profile.name}), backend {settings.backend}, "
         f"speedup x{settings.speedup:g}")
    if not settings.perturbation.is_identity:
        _log(f"kvsim perturbed engine (KVSIM_PERTURB): {settings.perturbation.to_text()}")
    try:  # an HF id is downloaded, the model loaded, the PyTorch kernels autotuned (serve/warmup.py)
        warmup.start(settings, os.environ, _log)
    except warmup.AutotuneCacheError as exc:
        print(f"[TensorRT-LLM][ERROR] {exc}", file=sys.stderr, flush=True)
        return 1
    if graphs is not None:  # the PyTorch warm-up captures the graphs before the pool is carved (simulated time)
        _log(f"kvsim CUDA graphs for batch sizes {list(graphs.sizes)} (padding {graphs.enable_padding}): "
             f"{graphs.memory_bytes(cfg.resolved_profile) / 2**30:.2f} GiB, {graphs.capture_s:g} s to capture "
             f"(simulated, x{settings.speedup:g})")
        time.sleep(graphs.capture_s / settings.speedup)
    _log(f"Number of blocks in KV cache primary pool: {plan.num_blocks}")
    _log(f"Number of tokens per block: {cfg.tokens_per_block}.")
    _log(f"[MemUsageChange] Allocated {plan.kv_pool_bytes / 2**30:.2f} GiB for max tokens in paged KV cache "
         f"({plan.kv_tokens}).")
    _log(f"max_batch_size {cfg.max_batch_size} (engine {cfg.build_max_batch_size}), max_num_tokens "
         f"{cfg.max_num_tokens}, policy {cfg.capacity_policy.value}, dynamic batch tuning "
         f"{'on' if cfg.enable_batch_size_tuning else 'off'}")
    from aiohttp import web

    from .app import build_app

    app = build_app(settings)
    print(f"INFO:     Started server process [{os.getpid()}]", flush=True)
    print(f"INFO:     Uvicorn running on http://{settings.host}:{settings.port} (Press CTRL+C to quit)", flush=True)
    # Like uvicorn under trtllm-serve: on SIGTERM stop accepting, let in-flight requests finish (bounded well
    # inside a pod's termination grace period), then exit.
    web.run_app(app, sock=sock, print=None, access_log=None, shutdown_timeout=GRACEFUL_SHUTDOWN_SECONDS,
                keepalive_timeout=HEADER_TIMEOUT_SECONDS)
    return 0

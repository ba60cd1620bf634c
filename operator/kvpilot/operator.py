"""Starts kopf with kvpilot's handlers, the metrics server and the liveness endpoint."""

from __future__ import annotations

import argparse
import logging
import sys

import kopf
from prometheus_client import start_http_server

from kvpilot.api.metrics_url import MetricsPin
from kvpilot.desired.settings import Settings
from kvpilot.handlers import engine as engine_handlers
from kvpilot.logjson import JsonFormatter


def run_operator(args: argparse.Namespace) -> int:
    if args.log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    if args.metrics_port:
        start_http_server(args.metrics_port)
    try:
        pins = tuple(MetricsPin.parse(text) for text in args.resolve)
    except ValueError as exc:
        sys.stderr.write(f"kvpilot run: {exc}\n")
        return 2
    settings = Settings(kvsim_image=args.kvsim_image, metrics_pins=pins)
    namespaces = list(args.namespace)
    kopf.run(
        standalone=True,  # one replica; no peering objects to create or RBAC for them
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None,
        memo=engine_handlers.memo_for(settings, args.resync_seconds, args.concurrent_reconciles, args.api_pool_size,
                                      namespaces, getattr(args, "gpu_capacity", True)),
    )
    return 0

"""``kvpilot``: run the operator, render what it would create, print the CRD, benchmark the tuner."""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from kvpilot import __version__
from kvpilot.api.crd import render_crd_yaml, spec_openapi
from kvpilot.api.models import InferenceEngine, ObjectRef, parse_spec
from kvpilot.api.validate import InvalidEngineError, validate_manifest
from kvpilot.desired.fingerprint import fingerprint_inputs
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import Settings, plan
from kvpilot.desired.pod_parts import image_for

DEFAULT_KVSIM_IMAGE = Settings().kvsim_image


class _BlockStyleDumper(yaml.SafeDumper):
    """Multi-line strings (the build script) as readable ``|`` blocks."""


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockStyleDumper.add_representer(str, _str_presenter)


def load_engines(path: str) -> list[InferenceEngine]:
    """Parse, default and validate every InferenceEngine in a file ('-' for stdin)."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    engines = []
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        defaulted, errors = validate_manifest(doc, spec_openapi())
        name = ((doc.get("metadata") or {}).get("name") if isinstance(doc, dict) else None) or "<unnamed>"
        if errors:
            raise InvalidEngineError(name, errors)
        meta = defaulted["metadata"]
        ref = ObjectRef(name=meta["name"], namespace=meta.get("namespace") or "default", uid="<uid>", generation=1)
        engines.append(InferenceEngine(ref, parse_spec(defaulted["spec"])))
    return engines


def render(engines: list[InferenceEngine], settings: Settings, include_status: bool) -> str:
    """What the operator creates first for each engine: its children and the build Job."""
    docs: list[dict[str, Any]] = []
    now = datetime.now(timezone.utc)
    for engine in engines:
        p = plan(engine, Observed(claim_phase="Bound"), settings, now)
        docs += [d for d in p.apply if d["kind"] == "PersistentVolumeClaim"]
        if p.build_job:
            docs.append(p.build_job)
        # Before the build finishes nothing serves; show the serving objects as they will be once it has.
        built = Observed(claim_phase="Bound", engine_index={p.fingerprint: {"fingerprint": p.fingerprint}})
        served = plan(engine, built, settings, now)
        docs += [d for d in served.apply if d["kind"] != "PersistentVolumeClaim"]
        if include_status:
            docs.append({"kind": "Fingerprint", "fingerprint": p.fingerprint,
                         "inputs": fingerprint_inputs(engine.spec, image_for(engine.spec, settings.kvsim_image,
                                                      settings.default_image), engine.spec.build.max_batch_size)})
    return yaml.dump_all(docs, Dumper=_BlockStyleDumper, sort_keys=False, width=120)


def cmd_render(args: argparse.Namespace) -> int:
    try:
        engines = load_engines(args.filename)
    except InvalidEngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, yaml.YAMLError) as exc:
        print(f"error: cannot read {args.filename}: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render(engines, Settings(kvsim_image=args.kvsim_image), args.show_fingerprint))
    return 0


def cmd_crd(_args: argparse.Namespace) -> int:
    sys.stdout.write(render_crd_yaml())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from kvpilot.operator import run_operator  # imports kopf; keep `render` light

    return run_operator(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from kvpilot.bench.cli import run_bench  # imports kvsim

    return run_bench(args)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpilot",
        description="Build TensorRT-LLM engines, serve them, and retune max_batch_size from the KV-cache pool.",
    )
    parser.add_argument("--version", action="version", version=f"kvpilot {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="Run the operator against the current kubeconfig (or in-cluster config).")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="Watch every namespace (default).")
    scope.add_argument("-n", "--namespace", action="append", default=[], help="Watch this namespace (repeatable).")
    run.add_argument("--metrics-port", type=int, default=8080, help="Port of /metrics (0 disables it).")
    run.add_argument("--health-port", type=int, default=8081, help="Port of the /healthz liveness endpoint (0 disables).")
    run.add_argument("--kvsim-image", default=DEFAULT_KVSIM_IMAGE, help="Image of the simulated backend.")
    run.add_argument("--resync-seconds", type=float, default=30.0, help="Reconcile at least this often.")
    run.add_argument("--concurrent-reconciles", type=_positive_int, default=16,
                     help="Reconciles running at once; engines with pending changes go before resyncs.")
    run.add_argument("--api-pool-size", type=_positive_int, default=16,
                     help="Threads (and HTTP connections) for API-server calls.")
    run.add_argument("--log-format", choices=("plain", "json"), default="plain", help="Log output format.")
    run.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    run.set_defaults(func=cmd_run)

    rend = sub.add_parser("render", help="Print the objects the operator would create, without a cluster.")
    rend.add_argument("-f", "--filename", required=True, help="InferenceEngine manifest(s) ('-' for stdin).")
    rend.add_argument("--kvsim-image", default=DEFAULT_KVSIM_IMAGE, help="Image of the simulated backend.")
    rend.add_argument("--show-fingerprint", action="store_true", help="Also print the fingerprint and its inputs.")
    rend.set_defaults(func=cmd_render)

    crd = sub.add_parser("crd", help="Print the InferenceEngine CustomResourceDefinition.")
    crd.set_defaults(func=cmd_crd)

    bench = sub.add_parser("bench", help="Benchmarks (see `kvpilot bench tuner --help`).")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    from kvpilot.bench.args import add_tuner_arguments

    add_tuner_arguments(bench_sub.add_parser("tuner", help="Autotuned vs static max_batch_size on kvsim."))
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

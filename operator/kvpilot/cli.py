"""``kvpilot``: run the operator, render what it would create, print the CRD, benchmark the tuner."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from datetime import datetime, timezone
from typing import Any

import yaml

from kvpilot import __version__, defaults
from kvpilot.api.crd import render_crd_yaml, spec_openapi
from kvpilot.api.manifest_file import MAX_BYTES, ManifestFileError, decode, documents
from kvpilot.api.models import InferenceEngine, ObjectRef, parse_spec
from kvpilot.api.validate import InvalidEngineError, validate_manifest
from kvpilot.desired.fingerprint import fingerprint_inputs
from kvpilot.desired.observed import Observed
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.desired.pod_parts import image_for

DEFAULT_KVSIM_IMAGE = Settings().kvsim_image


class _BlockStyleDumper(yaml.SafeDumper):
    """Multi-line strings (the build script) as readable ``|`` blocks."""


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockStyleDumper.add_representer(str, _str_presenter)


def read_text(path: str) -> tuple[str, str]:
    """The file's text ('-' for stdin) and how errors name it; bounded and UTF-8, as manifest_file requires."""
    if path == "-":
        return decode(sys.stdin.buffer.read(MAX_BYTES + 1), "<stdin>"), "<stdin>"
    with open(path, "rb") as f:
        return decode(f.read(MAX_BYTES + 1), path), path


def load_engines(path: str) -> list[InferenceEngine]:
    """Parse, default and validate every InferenceEngine in a file ('-' for stdin).

    Raises ManifestFileError (unreadable YAML), InvalidEngineError (a manifest the API server would refuse)
    or OSError; each names the document.
    """
    text, source = read_text(path)
    engines = []
    for number, doc in documents(text, source):
        defaulted, errors = validate_manifest(doc, spec_openapi())
        if errors:
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            shown = name[:80] if isinstance(name, str) and name else "<unnamed>"
            raise InvalidEngineError(shown, errors, where=f"{source}: document {number}")
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
    except (InvalidEngineError, ManifestFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot read {args.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render(engines, Settings(kvsim_image=args.kvsim_image), args.show_fingerprint))
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from kvpilot.desired.cache_jobs import CacheJobError, ls_job, prune_job

    try:
        if args.cache == "ls":
            job = ls_job(args.claim, args.namespace, args.image)
        else:
            if not args.keep and not args.all:
                raise CacheJobError("name the engines to keep with --keep <fingerprint> (repeatable), or pass --all")
            job = prune_job(args.claim, args.namespace, tuple(args.keep), args.min_age_minutes, args.dry_run,
                            args.downloads, args.image)
    except CacheJobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.dump(job, Dumper=_BlockStyleDumper, sort_keys=False, width=120))
    return 0


def add_cache_parser(sub: Any) -> None:
    cache = sub.add_parser(
        "cache", help="Print a Job that lists or prunes the engines on a cache claim (see docs/engine-cache.md).",
        description="Render a one-off Job that lists (ls) or deletes (prune) published engines on an engine-cache "
        "claim. Nothing is applied: pipe it to `kubectl apply -f -` and read `kubectl logs job/<name>`.")
    cache_sub = cache.add_subparsers(dest="cache", required=True)
    for name, text in (("ls", "List every engine on the claim with its size and manifest."),
                       ("prune", "Delete every engine on the claim except those kept.")):
        p = cache_sub.add_parser(name, help=text, description=text)
        p.add_argument("--claim", required=True, help="The engine-cache PersistentVolumeClaim.")
        p.add_argument("-n", "--namespace", default="default", help="Namespace of the claim (default: default).")
        p.add_argument("--image", default="busybox:1.37", help="Image with sh, find and du (default: busybox).")
        if name == "prune":
            p.add_argument("--keep", action="append", default=[], metavar="FINGERPRINT",
                           help="A fingerprint to keep (repeatable): e.g. every status.engine.fingerprint in use.")
            p.add_argument("--all", action="store_true", help="Keep nothing (required when no --keep is given).")
            p.add_argument("--min-age-minutes", type=int, default=60,
                           help="Never delete an engine published more recently than this (default 60).")
            p.add_argument("--downloads", action="store_true",
                           help="Also delete downloaded checkpoints (.models); the next build downloads again.")
            p.add_argument("--dry-run", action="store_true", help="Only print what would be deleted.")
    cache.set_defaults(func=cmd_cache)


def cmd_crd(_args: argparse.Namespace) -> int:
    sys.stdout.write(render_crd_yaml())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from kvpilot.operator import run_operator  # imports kopf; keep `render` light

    return run_operator(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from kvpilot.bench.cli import run_bench  # imports kvsim

    return run_bench(args)


def cmd_no_bench(args: argparse.Namespace) -> int:
    print("kvpilot bench: the benchmark is not installed here (the operator image leaves it out); run it from "
          "a source checkout (make venv) or after `pip install 'kvpilot[bench]'`", file=sys.stderr)
    return 2


def cmd_doctor_trtllm(args: argparse.Namespace) -> int:
    """Compare a TensorRT-LLM image's probe output with kvpilot's release table (no cluster, no GPU)."""
    import json

    from kvpilot.trtllm.contract import report
    from kvpilot.trtllm.probe import probe_source

    if args.print_probe:
        sys.stdout.write(probe_source(full=True))
        return 0
    if not args.probe:
        sys.stderr.write("kvpilot doctor trtllm: give --probe FILE (or '-'), as hack/trtllm-contract-check.sh IMAGE "
                         "does after running the probe inside IMAGE\n")
        return 2
    try:
        text = sys.stdin.read() if args.probe == "-" else open(args.probe, encoding="utf-8").read()
        try:
            probe = json.loads(text)
        except ValueError:  # the probe prints one JSON line last; anything the image logged comes before it
            probe = json.loads(text.strip().splitlines()[-1]) if text.strip() else None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        sys.stderr.write(f"kvpilot doctor trtllm: --probe {args.probe}: not the probe's JSON output: {exc}\n")
        return 2
    if not isinstance(probe, dict):
        sys.stderr.write(f"kvpilot doctor trtllm: --probe {args.probe}: expected one JSON object (the probe's last line)\n")
        return 2
    out, ok = report(probe, args.image or "")
    sys.stdout.write(out)
    return 0 if ok else 1


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
    run.add_argument("--resolve", action="append", default=[], metavar="HOST:PORT:ADDRESS",
                     help="Pin an autotune.metrics.url host to an address, as curl's --resolve does (repeatable); "
                          "a pinned address is trusted even if loopback or link-local.")
    run.add_argument("--concurrent-reconciles", type=_positive_int, default=defaults.CONCURRENT_RECONCILES,
                     help="Reconciles running at once; engines with pending changes go before resyncs "
                          "(default %(default)s).")
    run.add_argument("--api-pool-size", type=_positive_int, default=defaults.API_POOL_SIZE,
                     help="Threads (and HTTP connections) for API-server calls (a pass sends its writes at once; "
                          "default %(default)s).")
    run.add_argument("--no-gpu-capacity", dest="gpu_capacity", action="store_false",
                     help="Do not watch Nodes and the pods of every namespace (needs cluster-wide list/watch); "
                          "serving.rollout.strategy Auto then never surges.")
    run.add_argument("--log-format", choices=("plain", "json"), default="plain", help="Log output format.")
    run.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    run.set_defaults(func=cmd_run)

    rend = sub.add_parser("render", help="Print the objects the operator would create, without a cluster.")
    rend.add_argument("-f", "--filename", required=True, help="InferenceEngine manifest(s) ('-' for stdin).")
    rend.add_argument("--kvsim-image", default=DEFAULT_KVSIM_IMAGE, help="Image of the simulated backend.")
    rend.add_argument("--show-fingerprint", action="store_true", help="Also print the fingerprint and its inputs.")
    rend.set_defaults(func=cmd_render)

    add_cache_parser(sub)
    doctor = sub.add_parser("doctor", help="Checks of the environment (see `kvpilot doctor trtllm --help`).")
    doctor_sub = doctor.add_subparsers(dest="doctor", required=True)
    trt = doctor_sub.add_parser(
        "trtllm", help="Diff a TensorRT-LLM image's surface (probe output) against kvpilot's release table.",
        description="Run inside the image: hack/trtllm-contract-check.sh IMAGE. By hand: "
                    "docker run --rm --entrypoint python3 IMAGE -c \"$(kvpilot doctor trtllm --print-probe)\" "
                    "> probe.json; kvpilot doctor trtllm IMAGE --probe probe.json. Exit 1 when the image differs.")
    trt.add_argument("image", nargs="?", help="The image the probe ran in (its tag names the assumed release).")
    trt.add_argument("--probe", help="The probe's JSON output ('-' for stdin).")
    trt.add_argument("--print-probe", action="store_true", help="Print the probe (Python) to run inside the image.")
    trt.set_defaults(func=cmd_doctor_trtllm)

    crd = sub.add_parser("crd", help="Print the InferenceEngine CustomResourceDefinition.")
    crd.set_defaults(func=cmd_crd)

    bench = sub.add_parser("bench", help="Benchmarks (see `kvpilot bench tuner --help`).")
    if importlib.util.find_spec("kvpilot.bench") is None:  # the operator image ships without it (Dockerfile)
        bench.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        bench.set_defaults(func=cmd_no_bench)
        return parser
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

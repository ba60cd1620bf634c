"""The ``kvsim`` command.

    kvsim run --workload chat --profile llama-3.1-8b-fp8-h100 [engine options] [--json] [--out DIR]
    kvsim sweep --workload chat --param max_batch_size=32,64,128 [--param tokens_per_block=16,32] [--out DIR]
    kvsim bench-throughput --profile P --isl N --osl M [--json]
    kvsim calibrate [--fit]                 errors against NVIDIA's table (and the fit that produced them)
    kvsim profiles                          profiles and their default KV pools
    kvsim workloads                         bundled workloads
    kvsim claims --out docs/kvsim           the three claims: figures (SVG) and numbers (JSON, Markdown)
    kvsim checkpoint --profile P --output_dir DIR [--tp_size N --pp_size M]
    kvsim trtllm-build ARGS                 TensorRT-LLM 1.2's trtllm-build, simulated
    kvsim trtllm-serve MODEL ARGS           TensorRT-LLM 1.2's trtllm-serve, simulated
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .config import CapacityPolicy, EngineConfig, KvCacheType
from .profiles import PROFILES, get_profile

DEFAULT_SLO_TTFT_MS = 2000.0
DEFAULT_SLO_TPOT_MS = 50.0


def add_engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--profile", default="llama-3.1-8b-fp8-h100", help="<model>-<dtype>-<gpu>[-tpN]")
    g.add_argument("--build-max-batch-size", type=int, default=2048)
    g.add_argument("--build-max-num-tokens", type=int, default=8192)
    g.add_argument("--max-seq-len", type=int, default=None)
    g.add_argument("--max-input-len", type=int, default=None)
    g.add_argument("--tokens-per-block", type=int, default=32)
    g.add_argument("--kv-cache-type", choices=[k.value for k in KvCacheType], default="paged")
    g.add_argument("--max-batch-size", type=int, default=None, help="runtime value (default: the build value)")
    g.add_argument("--max-num-tokens", type=int, default=None)
    g.add_argument("--policy", default="GUARANTEED_NO_EVICT", choices=[c.value for c in CapacityPolicy])
    g.add_argument("--kv-fraction", type=float, default=0.9, help="free_gpu_memory_fraction")
    g.add_argument("--kv-max-tokens", type=int, default=None)
    g.add_argument("--no-block-reuse", action="store_true")
    g.add_argument("--chunked-context", action="store_true")
    g.add_argument("--tuner", action="store_true", help="TensorRT-LLM's in-engine dynamic batch size tuner")
    g.add_argument("--max-num-tokens-tuning", action="store_true")
    g.add_argument("--perturb", default="", metavar="KEY=F,...", help=PERTURB_HELP)


PERTURB_HELP = ("multiply the profile's calibration and GPU memory (as KVSIM_PERTURB does for trtllm-serve): "
                "decode, prefill (>1 faster), overhead, per_seq (>1 slower), memory (>1 more); factors in [0.25, 4]")


def _profile(args: argparse.Namespace):
    from .perturb import Perturbation

    return Perturbation.parse(args.perturb, "--perturb").apply(get_profile(args.profile))


def engine_config(args: argparse.Namespace) -> EngineConfig:
    build_bs = max(args.build_max_batch_size, args.max_batch_size or 0)
    build_nt = max(args.build_max_num_tokens, args.max_num_tokens or 0)
    return EngineConfig(
        profile=_profile(args), build_max_batch_size=build_bs, build_max_num_tokens=build_nt,
        max_seq_len=args.max_seq_len, max_input_len=args.max_input_len, tokens_per_block=args.tokens_per_block,
        kv_cache_type=KvCacheType(args.kv_cache_type), max_batch_size=args.max_batch_size,
        max_num_tokens=args.max_num_tokens, capacity_policy=CapacityPolicy(args.policy),
        free_gpu_memory_fraction=args.kv_fraction, kv_max_tokens=args.kv_max_tokens,
        enable_block_reuse=not args.no_block_reuse, enable_chunked_context=args.chunked_context,
        enable_batch_size_tuning=args.tuner, enable_max_num_tokens_tuning=args.max_num_tokens_tuning)


def add_workload_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload and report")
    g.add_argument("--workload", default="chat", help="bundled name or YAML path")
    g.add_argument("--duration", type=float, default=None, help="seconds of traffic (default: the workload's)")
    g.add_argument("--rate-scale", type=float, default=1.0, help="multiply every arrival rate")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--horizon", type=float, default=None, help="stop simulating at this time (s)")
    g.add_argument("--slo-ttft-ms", type=float, default=DEFAULT_SLO_TTFT_MS)
    g.add_argument("--slo-tpot-ms", type=float, default=DEFAULT_SLO_TPOT_MS)
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g.add_argument("--out", type=Path, default=None, help="write JSON and SVG plots into this folder")


def _requests(args: argparse.Namespace):
    from .workload import load_workload

    return load_workload(args.workload).requests(args.duration, args.rate_scale, args.seed)


def cmd_run(args: argparse.Namespace) -> int:
    from .runner import run_workload

    config = engine_config(args)
    result = run_workload(config, _requests(args), horizon_s=args.horizon)
    summary = result.summary(args.slo_ttft_ms, args.slo_tpot_ms, args.duration)
    doc = {"workload": args.workload, "profile": config.resolved_profile.name, "config": _config_json(result.config),
           "summary": summary, "timeline": [p.as_dict() for p in result.timeline]}
    if args.out:
        from .plots import plot_timeline

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "run.json").write_text(json.dumps(doc, indent=1))
        plot_timeline(result.timeline, args.out / "timeline.svg", f"{args.workload} on {config.resolved_profile.name}")
    if args.json:
        doc.pop("timeline")
        print(json.dumps(doc, indent=1))
    else:
        print(format_summary(summary))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from .runner import sweep

    grid: dict[str, list[Any]] = {}
    fields = EngineConfig.__dataclass_fields__
    for item in args.param:
        name, _, values = item.partition("=")
        name = name.replace("-", "_")
        if name not in fields or not values:
            raise ValueError(f"--param must be FIELD=V1,V2 with FIELD an EngineConfig field; got {item!r}")
        grid[name] = [_parse_value(v) for v in values.split(",")]
        kind = str(fields[name].type)
        if ("int" in kind or "float" in kind) and "str" not in kind:
            wrong = [v for v in grid[name] if isinstance(v, (str, bool))]
            if wrong:
                raise ValueError(f"--param {name} takes numbers ({kind}); got {wrong[0]!r}")
    rows = sweep(engine_config(args), _requests(args), grid, args.slo_ttft_ms, args.slo_tpot_ms, args.horizon)
    if args.out:
        from .plots import plot_sweep

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sweep.json").write_text(json.dumps(rows, indent=1))
        names = list(grid)
        plot_sweep(rows, names[0], [("goodputRequestsPerSecond", "goodput (req/s)"), ("ttftMs.p99", "p99 TTFT (ms)"),
                                    ("tpotMs.p99", "p99 TPOT (ms)")], args.out / "sweep.svg",
                   series=names[1] if len(names) > 1 else None, title=f"{args.workload} on {args.profile}")
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for row in rows:
            s = row["summary"]
            print(f"{row['params']}: goodput {s['goodputRequestsPerSecond']:.2f} req/s, out {s['outputTokensPerSecond']:.0f}"
                  f" tok/s, TTFT p99 {s['ttftMs']['p99']:.0f} ms, TPOT p99 {s['tpotMs']['p99']:.1f} ms, pauses {s['pauses']}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import bench_throughput

    result = bench_throughput(_profile(args), args.isl, args.osl, args.num_requests, args.kv_fraction,
                              args.max_batch_size, args.max_num_tokens, CapacityPolicy(args.policy),
                              not args.disable_chunked_context)
    if args.json:
        print(json.dumps(result.as_json(), indent=1))
    else:
        print(f"Total Output Throughput (tokens/sec): {result.output_tokens_per_s:.1f}")
        print(f"Request Throughput (req/sec):         {result.request_per_s:.3f}")
        print(f"engine: max_batch_size {result.max_batch_size}, max_num_tokens {result.max_num_tokens}, "
              f"{result.kv_blocks} KV blocks; {result.num_requests} requests, peak concurrency {result.max_concurrency}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibration import H100_8B_FP8, HELD_OUT, evaluate, fit, format_rows

    calibration = None
    if args.fit:
        calibration, score = fit(log=lambda m: print(m, file=sys.stderr))
        print(f"fitted: {calibration} (objective {score:.4f})")
    print(format_rows(evaluate("llama-3.1-8b-fp8-h100", H100_8B_FP8, calibration)))
    if args.held_out:
        for profile, table in HELD_OUT.items():
            print("\nheld out:\n" + format_rows(evaluate(profile, table, calibration)))
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from .memory import plan_memory

    print(f"{'profile':<30} {'GPUs':>4} {'weights/GPU':>11} {'KV B/token':>10} {'blocks@32':>9} {'KV tokens':>10}")
    for name, p in PROFILES.items():
        plan = plan_memory(p, 2048, 8192, 32, 0.9)
        print(f"{name:<30} {p.num_gpus:>4} {p.weights_resident_bytes / 1e9:>9.1f}GB {p.kv_bytes_per_token:>10.0f} "
              f"{plan.num_blocks:>9} {plan.kv_tokens:>10}")
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    from .workload import bundled_workloads, load_workload

    for name in bundled_workloads():
        w = load_workload(name)
        rate = sum(p.rate_per_s * p.duration_s for p in w.phases) / w.duration_s
        print(f"{name:<12} {w.duration_s:>6.0f} s, {rate:.2f} req/s mean, {len(w.phases)} phase(s), maxTokens {w.max_tokens}")
    return 0


def cmd_claims(args: argparse.Namespace) -> int:
    from .claims import write_claims

    write_claims(args.out, quick=args.quick)
    return 0


def format_summary(s: dict) -> str:
    return "\n".join([
        f"requests {s['requests']} (finished {s['finished']}, rejected {s['rejected']}, unfinished {s['unfinished']})",
        f"throughput {s['outputTokensPerSecond']:.1f} output tok/s, {s['requestsPerSecond']:.3f} req/s",
        f"goodput {s['goodputRequestsPerSecond']:.3f} req/s (SLO attainment {s['sloAttainment'] * 100:.1f}%, "
        f"TTFT <= {s['slo']['ttftMs']} ms, TPOT <= {s['slo']['tpotMs']} ms)",
        "TTFT ms  " + _dist(s["ttftMs"]), "TPOT ms  " + _dist(s["tpotMs"]), "E2E ms   " + _dist(s["e2eMs"]),
        f"KV utilization mean {s['kvUtilization']['mean'] * 100:.1f}% max {s['kvUtilization']['max'] * 100:.1f}% "
        f"of {s['kvBlocks']} blocks; paused requests {s['pausedRequests']} ({s['pauses']} pauses)",
        f"simulated {s['simulatedS']:.0f} s in {s['cpuS']:.2f} CPU-s ({s['iterations']} iterations)",
    ])


def _dist(d: dict) -> str:
    return " ".join(f"{k} {v:.1f}" for k, v in d.items())


def _config_json(config: EngineConfig) -> dict:
    out = {}
    for name in EngineConfig.__dataclass_fields__:
        value = getattr(config, name)
        if name == "cuda_graphs":
            value = None if value is None else {"batchSizes": list(value.batch_sizes), "enablePadding": value.enable_padding}
        out[name] = value.name if name == "profile" else getattr(value, "value", value)
    return out


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvsim", description="Simulated TensorRT-LLM engine (in-flight "
                                     "batching, paged KV cache), calibrated to NVIDIA's published throughput.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="simulate a workload")
    add_engine_options(p)
    add_workload_options(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("sweep", help="simulate a workload over a grid of engine settings")
    add_engine_options(p)
    add_workload_options(p)
    p.add_argument("--param", action="append", required=True, help="FIELD=V1,V2,... (EngineConfig field)")
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("bench-throughput", help="saturated throughput like trtllm-bench")
    p.add_argument("--profile", default="llama-3.1-8b-fp8-h100")
    p.add_argument("--isl", type=int, required=True)
    p.add_argument("--osl", type=int, required=True)
    p.add_argument("--num-requests", type=int, default=None, help="default: NVIDIA's count for the ISL/OSL pair")
    p.add_argument("--kv-fraction", type=float, default=0.95)
    p.add_argument("--max-batch-size", type=int, default=None, help="default: trtllm-bench's heuristic")
    p.add_argument("--max-num-tokens", type=int, default=None)
    p.add_argument("--policy", default="GUARANTEED_NO_EVICT", choices=[c.value for c in CapacityPolicy])
    p.add_argument("--disable-chunked-context", action="store_true")
    p.add_argument("--perturb", default="", metavar="KEY=F,...", help=PERTURB_HELP)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("calibrate", help="errors against NVIDIA's published H100 table")
    p.add_argument("--fit", action="store_true", help="re-run the parameter fit first (minutes)")
    p.add_argument("--held-out", action="store_true", help="also the H200 and 70B rows")
    p.set_defaults(func=cmd_calibrate)
    sub.add_parser("profiles", help="list profiles").set_defaults(func=cmd_profiles)
    sub.add_parser("workloads", help="list bundled workloads").set_defaults(func=cmd_workloads)
    p = sub.add_parser("claims", help="measure the three claims into a docs folder")
    p.add_argument("--out", type=Path, default=Path("docs/kvsim"))
    p.add_argument("--quick", action="store_true", help="shorter runs (for tests)")
    p.set_defaults(func=cmd_claims)
    p = sub.add_parser("checkpoint", help="write a TensorRT-LLM checkpoint config (no weights) for a profile",
                       add_help=False)
    p.set_defaults(func=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "trtllm-build":
        from .trtllm.build import main as build_main

        return build_main(argv[1:])
    if argv and argv[0] == "trtllm-serve":
        try:  # the serve extra (the library needs only PyYAML)
            import aiohttp  # noqa: F401
            import prometheus_client  # noqa: F401
        except ImportError as exc:
            print(f"kvsim trtllm-serve needs the serve extra ({exc.name} is missing): "
                  "pip install './simulator[serve]' from the kvpilot repository", file=sys.stderr)
            return 1
        from .serve.cli import main as serve_main

        return serve_main(argv[1:])
    if argv and argv[0] == "prepare":  # the PyTorch prepare Job, simulated (kvsim/trtllm/prepare.py)
        return __import__("kvsim.trtllm.prepare", fromlist=["main"]).main(argv[1:])
    if argv and argv[0] == "checkpoint":
        from .trtllm.checkpoint import main as checkpoint_main

        return checkpoint_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except OSError as exc:  # --out: a folder that cannot be created or written
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kvsim {args.command}: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except (ValueError, KeyError) as exc:
        # A KeyError's str() is its repr (quoted): print the message itself.
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"kvsim {args.command}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

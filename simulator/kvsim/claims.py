"""The blog's three claims, measured on the simulator: ``kvsim claims --out docs/kvsim``.

1. In-flight batching vs static batching: goodput and tail latency against offered load (chat traffic), and
   saturated throughput.
2. Paged blocks vs contiguous reservation of max_seq_len per request: concurrency the pool admits, and how much of
   the memory taken holds token states (fragmentation), at saturation.
3. Block size: internal fragmentation (the partly filled last block) against per-block overhead (each block's
   chunk is fetched separately by attention), with throughput peaking in between.
Each writes a JSON record and an SVG figure; ``claims.md`` tabulates the numbers.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from .config import CapacityPolicy, EngineConfig, KvCacheType
from .request import Request
from .runner import run_workload
from .workload import load_workload

SLO_TTFT_MS, SLO_TPOT_MS = 2000.0, 50.0


def saturated(requests: list[Request]) -> list[Request]:
    """The same requests, all queued at t=0 (an infinite-rate client, like trtllm-bench)."""
    return [replace(r, arrival_s=0.0) for r in requests]


def _efficiency(timeline, tokens_per_block: int) -> dict:
    busy = [p for p in timeline if p.used_blocks]
    allocated = sum(p.used_blocks * tokens_per_block for p in busy)
    reserved = sum(p.reserved_blocks * tokens_per_block for p in busy)
    held = sum(p.kv_tokens for p in busy)
    return {"tokenStatesPerAllocated": held / allocated if allocated else 0.0,
            "tokenStatesPerReserved": held / reserved if reserved else 0.0,
            "meanRunning": sum(p.num_running for p in busy) / len(busy) if busy else 0.0,
            "peakRunning": max((p.num_running for p in busy), default=0)}


def claim_static_vs_inflight(quick: bool) -> dict:
    profile = "llama-3.1-8b-fp8-h100"
    duration = 120.0 if quick else 600.0
    rates = [2, 8, 20, 40] if quick else [2, 5, 10, 15, 20, 25, 30, 35, 40]
    workload = load_workload("chat")
    base = EngineConfig(profile=profile, build_max_batch_size=64, build_max_num_tokens=65536, max_batch_size=64)
    variants = {
        "in-flight (GUARANTEED_NO_EVICT)": replace(base, max_num_tokens=8192),
        "static batching (STATIC_BATCH)": replace(base, capacity_policy=CapacityPolicy.STATIC_BATCH, max_num_tokens=65536),
    }
    curves: dict[str, list[dict]] = {name: [] for name in variants}
    for rate in rates:
        requests = workload.requests(duration_s=duration, rate_scale=rate / 5.0)
        for name, config in variants.items():
            s = run_workload(config, requests, timeline_interval_s=None).summary(SLO_TTFT_MS, SLO_TPOT_MS, duration)
            curves[name].append({"offeredRps": rate, "goodputRps": s["goodputRequestsPerSecond"],
                                 "throughputTokS": s["outputTokensPerSecond"], "ttftP99Ms": s["ttftMs"]["p99"],
                                 "tpotP99Ms": s["tpotMs"]["p99"], "sloAttainment": s["sloAttainment"]})
    burst = saturated(workload.requests(duration_s=60 if quick else 400, rate_scale=2.0))
    sat = {}
    for name, config in variants.items():
        s = run_workload(config, burst, timeline_interval_s=None).summary()
        sat[name] = {"requests": len(burst), "throughputTokS": s["outputTokensPerSecond"],
                     "requestsPerS": s["requestsPerSecond"]}
    best = {name: max(c["goodputRps"] for c in curve) for name, curve in curves.items()}
    return {"profile": profile, "workload": "chat", "durationS": duration, "maxBatchSize": 64,
            "slo": {"ttftMs": SLO_TTFT_MS, "tpotMs": SLO_TPOT_MS}, "curves": curves, "saturated": sat,
            "bestGoodputRps": best}


def claim_contiguous_vs_paged(quick: bool) -> dict:
    profile = "llama-3.1-8b-bf16-a100"
    max_seq_len = 8192
    base = EngineConfig(profile=profile, build_max_batch_size=1024, max_seq_len=max_seq_len, enable_block_reuse=False)
    variants = {
        "contiguous, max_seq_len reserved": replace(base, kv_cache_type=KvCacheType.CONTINUOUS),
        "paged, GUARANTEED_NO_EVICT": base,
        "paged, MAX_UTILIZATION": replace(base, capacity_policy=CapacityPolicy.MAX_UTILIZATION),
    }
    workloads = {"chat": (120 if quick else 600, 2.0), "sharegpt": (30 if quick else 150, 1.0)}
    out: dict[str, dict] = {}
    for workload, (duration, scale) in workloads.items():
        w = load_workload(workload)
        requests = saturated(w.requests(duration_s=duration, rate_scale=scale))
        out[workload] = {"requests": len(requests), "maxTokens": w.max_tokens, "variants": {}}
        for name, config in variants.items():
            result = run_workload(config, requests, timeline_interval_s=0.5)
            s = result.summary()
            eff = _efficiency(result.timeline, config.tokens_per_block)
            out[workload]["variants"][name] = {**eff, "throughputTokS": s["outputTokensPerSecond"],
                                               "kvBlocks": s["kvBlocks"], "kvTokens": s["kvTokens"],
                                               "pauses": s["pauses"], "durationS": s["durationS"]}
    return {"profile": profile, "maxSeqLen": max_seq_len, "maxBatchSize": 1024, "workloads": out}


def claim_block_size(quick: bool) -> dict:
    """Two pools on one profile: a small one that binds (fragmentation costs concurrency) and the full one."""
    profile = "llama-3.1-8b-fp8-h100"
    sizes = [4, 16, 64, 256] if quick else [2, 4, 8, 16, 32, 64, 128, 256]
    requests = saturated(load_workload("sharegpt").requests(duration_s=30 if quick else 60))
    scenarios = {"pool binds (16384 tokens)": 16384, "full pool (KV fraction 0.9)": None}
    out = {}
    for label, pool in scenarios.items():
        rows = []
        for tpb in sizes:
            config = EngineConfig(profile=profile, tokens_per_block=tpb, capacity_policy=CapacityPolicy.MAX_UTILIZATION,
                                  kv_max_tokens=pool, max_seq_len=4096, enable_block_reuse=False)
            result = run_workload(config, requests, timeline_interval_s=0.1)
            s = result.summary()
            eff = _efficiency(result.timeline, tpb)
            rows.append({"tokensPerBlock": tpb, "throughputTokS": s["outputTokensPerSecond"],
                         "internalFragmentation": 1.0 - eff["tokenStatesPerAllocated"],
                         "meanRunning": eff["meanRunning"], "tpotMeanMs": s["tpotMs"]["mean"],
                         "kvBlocks": s["kvBlocks"], "pauses": s["pauses"],
                         "kvSecondsPerToken": result.engine.model.kv_s_per_token})
        base_read = min(r["kvSecondsPerToken"] for r in rows)
        best = max(r["throughputTokS"] for r in rows)
        for r in rows:
            r["kvReadTimeRelative"] = r.pop("kvSecondsPerToken") / base_read
            r["throughputRelative"] = r["throughputTokS"] / best
        out[label] = {"poolTokens": pool, "rows": rows,
                      "bestTokensPerBlock": max(rows, key=lambda r: r["throughputTokS"])["tokensPerBlock"]}
    return {"profile": profile, "workload": "sharegpt (all requests at t=0)", "requests": len(requests),
            "policy": "MAX_UTILIZATION", "scenarios": out}


def plot_claims(data: dict, out: Path) -> None:
    from .plots import _pyplot, save_svg

    plt = _pyplot()
    c1 = data["claim1"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for name, curve in c1["curves"].items():
        x = [p["offeredRps"] for p in curve]
        axes[0].plot(x, [p["goodputRps"] for p in curve], marker="o", label=name)
        axes[1].plot(x, [p["ttftP99Ms"] / 1e3 for p in curve], marker="o", label=name)
    axes[0].plot(x, x, linestyle=":", color="grey", label="offered load")
    axes[0].set(xlabel="offered load (req/s)", ylabel="goodput (req/s meeting SLOs)",
                title="TTFT <= 2 s and TPOT <= 50 ms")
    axes[1].set(xlabel="offered load (req/s)", ylabel="p99 TTFT (s)", yscale="log", title="tail latency")
    axes[0].legend(fontsize=7)
    save_svg(fig, out / "claim1_static_vs_inflight.svg")

    c2 = data["claim2"]["workloads"]
    workloads = list(c2)
    names = list(c2[workloads[0]]["variants"])
    colors = ["#c44", "#48c", "#4a4"]
    labels = ["contiguous (max_seq_len)", "paged, no-evict", "paged, max-utilization"]
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.3))
    width = 0.27
    for i, name in enumerate(names):
        xs = [j + (i - 1) * width for j in range(len(workloads))]
        v = [c2[w]["variants"][name] for w in workloads]
        axes[0].bar(xs, [x["meanRunning"] for x in v], width, color=colors[i], label=labels[i])
        axes[1].bar(xs, [100 * x["tokenStatesPerReserved"] for x in v], width, color=colors[i])
        axes[2].bar(xs, [x["throughputTokS"] for x in v], width, color=colors[i])
    for ax, title, ylabel in zip(axes, ["concurrency the pool admits", "taken KV memory holding tokens",
                                        "saturated throughput"],
                                 ["mean running requests", "% of reserved memory", "output tokens/s"]):
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set(title=title, ylabel=ylabel)
    axes[1].set_ylim(0, 100)
    axes[0].legend(fontsize=7)
    save_svg(fig, out / "claim2_contiguous_vs_paged.svg")

    c3 = data["claim3"]["scenarios"]
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.3))
    for (label, scenario), color in zip(c3.items(), ["#c44", "#48c"]):
        rows = scenario["rows"]
        x = [r["tokensPerBlock"] for r in rows]
        axes[0].plot(x, [100 * r["internalFragmentation"] for r in rows], marker="o", color=color, label=label)
        axes[2].plot(x, [r["throughputRelative"] for r in rows], marker="o", color=color, label=label)
    axes[1].plot(x, [r["kvReadTimeRelative"] for r in rows], marker="o", color="#555")
    axes[0].set(ylabel="% of allocated token slots empty", title="internal fragmentation")
    axes[1].set(ylabel="KV read time per token (relative)", title="per-block overhead (modelled)")
    axes[2].set(ylabel="throughput / best", title="net: saturated output throughput")
    for ax in axes:
        ax.set(xscale="log", xlabel="tokens_per_block")
        ax.set_xticks(x, [str(v) for v in x])
    axes[0].legend(fontsize=7)
    save_svg(fig, out / "claim3_block_size.svg")


def claims_markdown(data: dict) -> str:
    c1, c2, c3 = data["claim1"], data["claim2"], data["claim3"]
    lines = ["# kvsim: the three claims, measured (generated by `kvsim claims`)", "",
             f"## 1. In-flight vs static batching ({c1['profile']}, {c1['workload']}, max_batch_size "
             f"{c1['maxBatchSize']}, {c1['durationS']:.0f} s per point)", "",
             "| offered req/s | " + " | ".join(f"{n}: goodput req/s, p99 TTFT s" for n in c1["curves"]) + " |",
             "|---|" + "---|" * len(c1["curves"])]
    names = list(c1["curves"])
    for i, point in enumerate(c1["curves"][names[0]]):
        cells = [f"{c1['curves'][n][i]['goodputRps']:.2f}, {c1['curves'][n][i]['ttftP99Ms'] / 1e3:.2f}" for n in names]
        lines.append(f"| {point['offeredRps']} | " + " | ".join(cells) + " |")
    lines += ["", "Saturated (every request queued at t=0): " + "; ".join(
        f"{n}: {v['throughputTokS']:.0f} output tok/s" for n, v in c1["saturated"].items()), "",
        f"## 2. Contiguous reservation vs paged blocks ({c2['profile']}, every request queued at t=0, "
        f"max_seq_len {c2['maxSeqLen']}, max_batch_size {c2['maxBatchSize']})", "",
        "| workload | variant | mean / peak running | tokens held / memory taken (reserved) | "
        "tokens held / allocated | output tok/s | pauses |", "|---|---|---|---|---|---|---|"]
    for workload, group in c2["workloads"].items():
        for n, v in group["variants"].items():
            lines.append(f"| {workload} ({group['requests']} req, maxTokens {group['maxTokens']}) | {n} | "
                         f"{v['meanRunning']:.0f} / {v['peakRunning']} | {100 * v['tokenStatesPerReserved']:.1f}% | "
                         f"{100 * v['tokenStatesPerAllocated']:.1f}% | {v['throughputTokS']:.0f} | {v['pauses']} |")
    lines += ["", f"## 3. Block size ({c3['profile']}, {c3['requests']} sharegpt-like requests at t=0, "
              f"{c3['policy']})", "",
              "| pool | tokens_per_block | internal fragmentation | KV read time (rel.) | mean running | "
              "TPOT mean ms | output tok/s | pauses |", "|---|---|---|---|---|---|---|---|"]
    for label, scenario in c3["scenarios"].items():
        for r in scenario["rows"]:
            lines.append(f"| {label} | {r['tokensPerBlock']} | {100 * r['internalFragmentation']:.1f}% | "
                         f"{r['kvReadTimeRelative']:.2f} | {r['meanRunning']:.0f} | {r['tpotMeanMs']:.1f} | "
                         f"{r['throughputTokS']:.0f} | {r['pauses']} |")
    lines += [""] + [f"Best block size, {label}: {sc['bestTokensPerBlock']} tokens." for label, sc in
                     c3["scenarios"].items()] + [""]
    return "\n".join(lines)


def write_claims(out: Path, quick: bool = False) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"claim1": claim_static_vs_inflight(quick), "claim2": claim_contiguous_vs_paged(quick),
            "claim3": claim_block_size(quick)}
    (out / "claims.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "claims.md").write_text(claims_markdown(data))
    plot_claims(data, out)
    print(claims_markdown(data))
    return data

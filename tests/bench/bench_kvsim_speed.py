"""How fast kvsim simulates: CPU-seconds for one hour of the chat workload, and requests per CPU-second by load.

Target (issue 4): one hour of the conversation workload at 5 req/s on llama-3.1-8b-fp8-h100 in <= 10 CPU-s.
Run: ``python -m tests.bench.bench_kvsim_speed`` (prints figures; asserts nothing about time).
"""

from __future__ import annotations

import time

from kvsim import EngineConfig
from kvsim.runner import run_workload
from kvsim.workload import load_workload

PROFILE = "llama-3.1-8b-fp8-h100"


def measure(workload: str, rate_scale: float, duration_s: float, **config) -> dict:
    requests = load_workload(workload).requests(duration_s=duration_s, rate_scale=rate_scale)
    started = time.process_time()
    result = run_workload(EngineConfig(profile=PROFILE, **config), requests)
    cpu = time.process_time() - started
    s = result.summary()
    return {"workload": workload, "rate": len(requests) / duration_s, "requests": len(requests), "cpu_s": cpu,
            "requests_per_cpu_s": len(requests) / cpu, "sim_s_per_cpu_s": result.engine.now / cpu,
            "iterations": result.engine.iteration, "p99_ttft_ms": s["ttftMs"]["p99"]}


def main() -> None:
    print("kvsim speed (CPU-seconds by time.process_time, one core)")
    headline = measure("chat", 1.0, 3600.0)
    print(f"  chat, 1 h at 5 req/s on {PROFILE}: {headline['cpu_s']:.2f} CPU-s for {headline['requests']} requests "
          f"({headline['iterations']} engine iterations) -- target <= 10 CPU-s")
    print(f"  {'workload':<10} {'req/s':>7} {'requests':>9} {'CPU-s':>7} {'req/CPU-s':>10} {'sim-s/CPU-s':>11} "
          f"{'p99 TTFT ms':>12}")
    for workload, scale, duration, config in [
        ("chat", 1.0, 1800.0, {}), ("chat", 4.0, 1800.0, {}), ("chat", 7.0, 600.0, {"max_batch_size": 512}),
        ("chat", 7.0, 600.0, {"capacity_policy": "MAX_UTILIZATION", "max_batch_size": 512}),
        ("code", 1.0, 3600.0, {}), ("sharegpt", 1.0, 1800.0, {"enable_batch_size_tuning": True}),
    ]:
        m = measure(workload, scale, duration, **config)
        label = workload + ("/MU" if config.get("capacity_policy") else "")
        print(f"  {label:<10} {m['rate']:>7.1f} {m['requests']:>9} {m['cpu_s']:>7.2f} {m['requests_per_cpu_s']:>10.0f} "
              f"{m['sim_s_per_cpu_s']:>11.0f} {m['p99_ttft_ms']:>12.0f}")


if __name__ == "__main__":
    main()

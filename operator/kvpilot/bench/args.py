"""Arguments of ``kvpilot bench tuner`` (kept apart so `--help` needs no simulator import)."""

from __future__ import annotations

import argparse


def add_tuner_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", action="store_true",
                   help="Run the benchmark suite (every case: static sweep, oracle, hindsight, tuner) and print "
                        "one table (with --json: one JSON object). The single-workload flags are then ignored.")
    p.add_argument("--case", action="append", default=None,
                   help="With --suite: run only this case (repeatable).")
    p.add_argument("--no-spare-gpu", action="store_true",
                   help="With --suite: a cluster with no free GPU of the pods' product, so every rollout is "
                        "maxSurge 0 / maxUnavailable 1 (capacity drops while a pod restarts).")
    p.add_argument("--perturbed", action="store_true",
                   help="With --suite: also run every case on each perturbed engine (the served engine is not the "
                        "profile the tuner's what-if starts from; see docs/tuner-suite.md). About 13x the CPU of "
                        "the nominal suite: see --jobs.")
    p.add_argument("--perturbation", action="append", default=None, metavar="NAME",
                   help="With --suite: run only on this served engine (repeatable; 'nominal' for the profile "
                        "itself, or a perturbation name such as decode0.7 or all-slow).")
    p.add_argument("--backend", choices=("tensorrt", "pytorch"), default="tensorrt",
                   help="With --suite: the TensorRT-LLM backend the pods run (kvsim plays it): tensorrt (a built "
                        "engine; TensorRT-LLM's default there has the in-engine batch tuner) or pytorch (no engine, "
                        "CUDA graphs, no in-engine tuner; rows named CASE.pytorch).")
    p.add_argument("--canary", choices=("Auto", "Always", "Off"), default="Off",
                   help="With --suite: the tuner's autotune.canary (default: the product's, Off). A change it "
                        "proposes for a gain is tried on one pod beside the others first, then promoted or rolled "
                        "back: Auto where the rollout cannot restart every pod at once (--no-spare-gpu), Always on "
                        "every such change; Off: every change rolls to every pod and is verified after it "
                        "(docs/live-tuner.md, 'Canary retunes').")
    p.add_argument("--jobs", type=int, default=1,
                   help="With --suite: rows run in this many processes at once (the figures do not depend on it).")
    p.add_argument("--bounds", metavar="FILE", default=None,
                   help="With --suite: reuse the tuner-independent figures (static sweep, TensorRT-LLM's default, "
                        "oracle, hindsight, reactive and instant bounds) of the rows in FILE (a --json result or a "
                        "--partial file of the same kvsim); only the tuned runs run (a third of the CPU).")
    p.add_argument("--partial", metavar="FILE", default=None,
                   help="With --suite: append each row to FILE (one JSON line) as soon as it is done.")
    p.add_argument("--resume", action="store_true",
                   help="With --partial: keep the rows FILE already holds (same case, served engine, spare GPU, "
                        "backend and canary) instead of running them again, so a long scan that was stopped goes "
                        "on where it stopped. Only for files written by the same code: rows are not checked "
                        "against it.")
    p.add_argument("--workload", help="kvsim workload: a bundled name (chat, code) or a YAML path.")
    p.add_argument("--profile", help="kvsim profile, e.g. llama-3.1-8b-fp8-h100.")
    p.add_argument("--slo-ttft-ms", type=float, help="Time-to-first-token objective (ms).")
    p.add_argument("--slo-tpot-ms", type=float, help="Time-per-output-token objective (ms).")
    p.add_argument("--replicas", type=int, default=2, help="Serving replicas behind a least-loaded balancer.")
    p.add_argument("--restart-seconds", type=float, default=90.0, help="Cost of one replica restart (s).")
    p.add_argument("--ceiling", type=int, default=2048, help="Engine ceiling (build max_batch_size) for the tuner.")
    p.add_argument("--rate-scale", type=float, default=1.0, help="Multiply the workload's arrival rates.")
    p.add_argument("--duration-seconds", type=float, default=None, help="Cut the workload after this long.")
    p.add_argument("--json", action="store_true", help="Print one JSON object with every result.")

"""Time-series plots of the suite's tuned runs (``python -m kvpilot.bench.plots suite.json docs/tuner-suite``).

One SVG per case, what a platform engineer looks at before turning on ``mode: Auto``: offered load and the
limit in force, KV-pool utilization, p95 TTFT and TPOT against the objectives, SLO attainment per tuning
interval, every applied change as a vertical marker (red: a rollback), each verification's verdict on the
attainment panel (a triangle: kept; a cross: rolled back) and each canary as a shaded span. Needs the ``bench``
extra (matplotlib).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvpilot.bench.suite_file import SuiteFileError, load_suite_rows


def plot_case(row: dict[str, Any], out: Path, slo: tuple[float, float] | None = None, run: str = "autotuned") -> Path:
    """Draw the tuned run ``run`` of ``row`` (checked by ``suite_file``) into ``out/<case>.svg`` (``autotuned``,
    from 64) or ``out/<case>.from2048.svg``."""
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit("kvpilot bench plots need matplotlib, the bench extra: pip install '.[bench]'") from exc

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: small files
    import matplotlib.pyplot as plt

    tuned = row[run]
    series = tuned.get("series") or []
    t = [p["t"] / 60 for p in series]
    fig, axes = plt.subplots(4, 1, figsize=(8, 8), sharex=True)
    ax = axes[0]
    ax.plot(t, [p["offered"] for p in series], color="tab:gray", label="offered load (req/s)")
    ax.set_ylabel("req/s")
    twin = ax.twinx()
    twin.step(t, [p["limit"] for p in series], where="post", color="tab:blue", linestyle=":",
              label="max_batch_size set")
    twin.step(t, [max(p["inForce"]) if p.get("inForce") else None for p in series], where="post",
              color="tab:blue", label="in force (largest serving pod)")
    twin.plot(t, [p.get("active") for p in series], color="tab:cyan", linewidth=0.8, label="mean batch per pod")
    twin.set_ylabel("max_batch_size")
    ax.legend(loc="upper left", fontsize=7)
    twin.legend(loc="upper right", fontsize=7)
    axes[1].plot(t, [_pct(p["kv"]) for p in series], color="tab:green")
    axes[1].set_ylabel("KV pool peak %")
    axes[1].set_ylim(0, 105)
    axes[2].plot(t, [p["ttftP95"] for p in series], color="tab:orange", label="p95 TTFT (ms)")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("TTFT ms")
    tw2 = axes[2].twinx()
    tw2.plot(t, [p["tpotP95"] for p in series], color="tab:purple", label="p95 TPOT (ms)")
    tw2.set_ylabel("TPOT ms")
    if slo:
        axes[2].axhline(slo[0], color="tab:orange", linestyle=":", linewidth=1)
        tw2.axhline(slo[1], color="tab:purple", linestyle=":", linewidth=1)
    axes[2].legend(loc="upper left", fontsize=7)
    tw2.legend(loc="upper right", fontsize=7)
    axes[3].plot(t, [_pct(p["attainment"]) for p in series], color="tab:red")
    axes[3].set_ylabel("SLO met %")
    axes[3].set_ylim(0, 105)
    axes[3].set_xlabel("minutes")
    _marks(axes, tuned)
    start = "from 2048" if run == "autotunedFrom2048" else "from 64"
    fig.suptitle(f"{row['case']} ({row['profile']}): autotuned {start} {tuned['goodput']:.2f} req/s good, "
                 f"x{row['ratios']['overOracle' if run == 'autotuned' else 'from2048OverOracle']:.2f} oracle static, "
                 f"{tuned['changes']} changes", fontsize=9)
    fig.tight_layout()
    path = out / f"{row['case']}{'' if run == 'autotuned' else '.from2048'}.svg"
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)
    return path


def _marks(axes: Any, tuned: dict[str, Any]) -> None:
    """Applied changes (black dashed; a rollback red), verification verdicts on the attainment panel, canaries
    as shaded spans."""
    for change in tuned["history"]:
        back = change.get("rollback", False)
        for a in axes:
            a.axvline(change["atSeconds"] / 60, color="tab:red" if back else "black", linestyle="--", linewidth=0.8)
        axes[0].annotate(f"{'rollback ' if back else ''}->{change['to']}", (change["atSeconds"] / 60, 0), fontsize=7,
                         xycoords=("data", "axes fraction"))
    for mark in tuned.get("verifications", []):
        kept = mark.get("outcome") == "Keep"
        axes[3].plot([mark["atSeconds"] / 60], [4], marker="^" if kept else "x", color="tab:green" if kept
                     else "tab:red", markersize=7, linestyle="none")
    for canary in tuned.get("canaries", []):
        end = canary.get("endSeconds")
        for a in axes:
            a.axvspan(canary["startSeconds"] / 60, (end if end is not None else canary["startSeconds"]) / 60,
                      color="tab:orange", alpha=0.15, linewidth=0)


def _pct(value: float | None) -> float | None:
    return None if value is None else 100 * value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kvpilot.bench.plots",
        description="Draw one SVG per case of a tuner-suite result: offered load and the limit in force, KV-pool "
                    "utilization, p95 TTFT/TPOT against the objectives, SLO attainment, and each applied change. "
                    "Needs the bench extra (matplotlib).")
    parser.add_argument("suite", type=Path, metavar="SUITE.json",
                        help="the JSON object printed by `kvpilot bench tuner --suite --json`")
    parser.add_argument("out", type=Path, metavar="OUTPUT_DIR", help="folder for the SVG files (created if missing)")
    parser.add_argument("--case", action="append", default=None, metavar="ROW",
                        help="draw only this row (repeatable; a row is a case, or case.perturbation)")
    parser.add_argument("--from-2048", action="store_true",
                        help="also draw each row's run started from 2048 (ROW.from2048.svg)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rows = load_suite_rows(args.suite)
    except SuiteFileError as exc:
        print(f"kvpilot bench plots: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"kvpilot bench plots: cannot create the output folder {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    from kvpilot.bench.cases import CASES

    slos = {c.name: (c.ttft_ms, c.tpot_ms) for c in CASES}
    for row in rows:
        if args.case and row["case"] not in args.case:
            continue
        base = row.get("baseCase")
        slo = slos.get(base if isinstance(base, str) else row["case"])
        print(plot_case(row, out, slo))
        if args.from_2048 and row.get("autotunedFrom2048") is not None:
            print(plot_case(row, out, slo, "autotunedFrom2048"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

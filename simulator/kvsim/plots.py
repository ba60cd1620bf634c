"""SVG figures (never raster): run timelines and sweep curves. Needs matplotlib (the ``plots`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("plots need matplotlib, the plots extra: pip install './simulator[plots]' from the kvpilot repository") from exc
    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "kvsim", "font.size": 9,
                                "figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3})
    import matplotlib.pyplot as plt

    return plt


def save_svg(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    _pyplot().close(fig)
    return path


def plot_timeline(timeline: Sequence[Any], path: str | Path, title: str = "") -> Path:
    """KV-pool use (allocated and reserved), request counts and pauses over simulated time."""
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(7, 6.5), sharex=True)
    t = [p.t_s for p in timeline]
    axes[0].plot(t, [p.used_blocks / p.max_blocks for p in timeline], label="allocated (usedNumBlocks / max)")
    axes[0].plot(t, [min(1.0, p.reserved_blocks / p.max_blocks) for p in timeline], label="reserved (no-evict)",
                 linestyle="--")
    axes[0].set_ylabel("KV pool fraction")
    axes[0].set_ylim(0, 1.05)
    axes[0].legend(loc="upper right")
    axes[1].plot(t, [p.num_running for p in timeline], label="running")
    axes[1].plot(t, [p.num_waiting_for_capacity for p in timeline], label="waiting for KV capacity")
    axes[1].plot(t, [p.num_queued for p in timeline], label="queued (beyond max_batch_size)")
    axes[1].plot(t, [p.max_batch_size_runtime for p in timeline], label="max_batch_size (runtime)", linestyle=":")
    axes[1].set_ylabel("requests")
    axes[1].legend(loc="upper right")
    axes[2].plot(t, [p.paused_total for p in timeline], label="paused (cumulative)")
    axes[2].set_ylabel("pauses")
    axes[2].set_xlabel("simulated time (s)")
    axes[2].legend(loc="upper left")
    if title:
        axes[0].set_title(title)
    return save_svg(fig, path)


def plot_sweep(rows: Sequence[dict], x: str, metrics: Sequence[tuple[str, str]], path: str | Path,
               series: str | None = None, title: str = "", logx: bool = False) -> Path:
    """One panel per (summary path, label) in ``metrics`` against parameter ``x``, one line per ``series``."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(metrics), 1, figsize=(6.5, 2.4 * len(metrics)), sharex=True, squeeze=False)
    groups: dict[Any, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["params"].get(series) if series else None, []).append(row)
    for ax, (metric, label) in zip(axes[:, 0], metrics):
        for key, group in groups.items():
            group = sorted(group, key=lambda r: r["params"][x])
            ax.plot([r["params"][x] for r in group], [_dig(r["summary"], metric) for r in group], marker="o",
                    label=f"{series}={key}" if series else None)
        ax.set_ylabel(label)
        if logx:
            ax.set_xscale("log", base=2)
        if series:
            ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel(x)
    if title:
        axes[0, 0].set_title(title)
    return save_svg(fig, path)


def _dig(doc: dict, dotted: str) -> float:
    for part in dotted.split("."):
        doc = doc[part]
    return float(doc)  # type: ignore[arg-type]

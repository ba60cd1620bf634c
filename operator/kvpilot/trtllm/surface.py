"""Release surfaces: what a TensorRT-LLM serving image accepts and exposes, per release (``options/releases.yaml``).

Why a table: a key one release's strict LLM-API schema accepts crash-loops another (``return_perf_metrics`` on
1.2's TensorRT backend, NVIDIA/TensorRT-LLM#9678), and metric names change between releases. Rendering and
signal reading both ask the surface instead of assuming one release. The release comes from, in order: what
the build Job recorded about the image (``probe``), the image tag, else a conservative surface: ``newer`` (PyTorch
only) for a version above every row, ``conservative`` for any other the table lacks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from kvpilot.api.release_tags import PYTORCH_ONLY_TAG_REGEX, PYTORCH_ONLY_VERSION_REGEX

__all__ = ["CONSERVATIVE", "NEWER", "PYTORCH_ONLY_TAG_REGEX", "PYTORCH_ONLY_VERSION_REGEX", "Surface"]

CONSERVATIVE = "conservative"
NEWER = "newer"  # a version above every row: TensorRT-LLM removed the TensorRT backend after 1.3.0rc20
# Every name a Prometheus reading accepts, whatever the release: the unprefixed 1.2 collector's and the
# trtllm_-prefixed later ones (PR #11243). Logical name -> spellings, preferred first.
_LOGICAL_HISTOGRAMS = ("ttft", "tpot", "e2e", "queue")


@dataclass(frozen=True)
class Surface:
    """One release's contract as kvpilot uses it."""

    release: str
    sources: tuple[str, ...]
    trt_has_perf_metrics_max_requests: bool
    pytorch_only_keys: frozenset[str]
    scheduler_config_keys: frozenset[str]
    not_keys: frozenset[str]
    prometheus_names: dict[str, str] = field(default_factory=dict)  # logical -> exported name
    prometheus_gauges: dict[str, str] = field(default_factory=dict)
    endpoint_needs_return_perf_metrics: bool = True
    runtime_limit_above_engine: str = "reject"  # "clamp" (1.2+: warn and override) or "reject" (1.1)
    iteration_stats_fields: tuple[str, ...] = ()
    tensorrt_backend: str = "unknown"  # available | deprecated | removed | unknown (options/releases.yaml)
    cuda_graph_keys: frozenset[str] = frozenset()  # CudaGraphConfig fields (PyTorch backend)
    autotuner_cache_env: str | None = None  # where the PyTorch kernel autotuner reads and writes its cache

    @property
    def tensorrt_removed(self) -> bool:
        """The release has no TensorRT backend: no trtllm-build, no ``--backend tensorrt``."""
        return self.tensorrt_backend == "removed"

    def renders_return_perf_metrics(self, backend: str) -> bool:
        """Whether ``return_perf_metrics: true`` is safe: on TensorRT only where TrtLlmArgs has the field the
        server reads alongside it (issue #9678); the PyTorch backend's args always had it."""
        return backend == "pytorch" or self.trt_has_perf_metrics_max_requests

    def accepts_key(self, backend: str, dotted: str) -> bool:
        """Whether the LLM-API YAML key (``a.b`` for nested ones) is accepted for ``backend``."""
        if dotted in self.not_keys or (backend == "tensorrt" and self.tensorrt_removed):
            return False
        if dotted.startswith("cuda_graph_config."):
            return backend == "pytorch" and dotted.split(".")[1] in self.cuda_graph_keys
        if dotted.startswith("scheduler_config."):
            return dotted.split(".")[1] in self.scheduler_config_keys
        top = dotted.split(".")[0]
        if top == "perf_metrics_max_requests" and backend == "tensorrt":
            return self.trt_has_perf_metrics_max_requests
        return not (backend == "tensorrt" and top in self.pytorch_only_keys)


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    text = resources.files("kvpilot.trtllm").joinpath("options", "releases.yaml").read_text()
    table: dict[str, Any] = yaml.safe_load(text)
    return table


def releases() -> tuple[str, ...]:
    """The release lines in the table, oldest first."""
    return tuple(_table()["releases"])


@lru_cache(maxsize=None)
def get(release: str) -> Surface:
    """The surface of a release line in the table, ``NEWER``'s, or the conservative one (``CONSERVATIVE`` or
    a name the table lacks)."""
    table = _table()
    row = table["releases"].get(release)
    if row is None:
        return _newer() if release == NEWER else _conservative()
    api, prom = row["llm_api"], row["prometheus"]
    return Surface(
        release=release,
        sources=tuple(row["sources"]),
        trt_has_perf_metrics_max_requests=bool(api["trt_llm_args_has_perf_metrics_max_requests"]),
        pytorch_only_keys=frozenset(api["pytorch_only"]),
        scheduler_config_keys=frozenset(api["scheduler_config"]),
        not_keys=frozenset(api.get("not_keys") or ()),
        prometheus_names=dict(prom["names"]),
        prometheus_gauges=dict(prom.get("gauges") or {}),
        endpoint_needs_return_perf_metrics=bool(prom["endpoint_needs_return_perf_metrics"]),
        runtime_limit_above_engine=row["behaviours"]["runtime_limit_above_engine"],
        iteration_stats_fields=tuple(row["iteration_stats"]),
        tensorrt_backend=str(row["tensorrt_backend"]),
        cuda_graph_keys=frozenset(api.get("cuda_graph_config") or ()),
        autotuner_cache_env=row.get("autotuner_cache_env"),
    )


def _conservative() -> Surface:
    """The intersection of the releases that still have the TensorRT backend (an image whose tag names no release
    may have it; its build Job's probe refuses one that does not): render nothing any of them rejects, read every
    known spelling. A PyTorch engine renders only keys the PyTorch-only releases accept too."""
    rows = [s for s in (get(r) for r in releases()) if not s.tensorrt_removed]
    return _intersection(CONSERVATIVE, rows, "the releases with the TensorRT backend")


def _newer() -> Surface:
    """A release above every row: the intersection of the PyTorch-only rows, with no TensorRT backend."""
    rows = [s for s in (get(r) for r in releases()) if s.tensorrt_removed]
    return _intersection(NEWER, rows, "the PyTorch-only releases")


def _intersection(name: str, rows: list[Surface], which: str) -> Surface:
    base = _table()[name]
    return Surface(
        release=name,
        sources=(f"the intersection of {which} in options/releases.yaml",),
        trt_has_perf_metrics_max_requests=bool(base["trt_llm_args_has_perf_metrics_max_requests"]),
        pytorch_only_keys=frozenset().union(*(s.pytorch_only_keys for s in rows)),
        scheduler_config_keys=frozenset.intersection(*(s.scheduler_config_keys for s in rows)),
        not_keys=frozenset().union(*(s.not_keys for s in rows)),
        prometheus_names={},
        prometheus_gauges={},
        endpoint_needs_return_perf_metrics=True,
        runtime_limit_above_engine=base["runtime_limit_above_engine"],
        iteration_stats_fields=tuple(sorted(set.intersection(*(set(s.iteration_stats_fields) for s in rows)))),
        tensorrt_backend=str(base["tensorrt_backend"]),
        cuda_graph_keys=frozenset.intersection(*(s.cuda_graph_keys for s in rows)),
        autotuner_cache_env=_common({s.autotuner_cache_env for s in rows}),
    )


def _common(values: set[str | None]) -> str | None:
    """The one value every row agrees on, else None (a conservative surface assumes nothing)."""
    return next(iter(values)) if len(values) == 1 else None


def metric_spellings() -> dict[str, tuple[str, ...]]:
    """Logical metric -> every exported name any release uses (both spellings), for tolerant reading."""
    out: dict[str, list[str]] = {}
    for r in releases():
        s = get(r)
        for logical, name in {**s.prometheus_names, **s.prometheus_gauges}.items():
            spellings = out.setdefault(logical, [])
            for candidate in (name, name.removeprefix("trtllm_"), "trtllm_" + name.removeprefix("trtllm_")):
                if candidate not in spellings:
                    spellings.append(candidate)
    return {k: tuple(v) for k, v in out.items()}


_TAG = re.compile(r"^v?(?P<major>\d+)\.(?P<minor>\d+)(?:\.(?P<patch>\d+))?(?:\.?rc(?P<rc>\d+))?"
                  r"(?:\.post\d+)?(?:[-+].*)?$")
_BOUND = re.compile(r"^(?P<major>\d+)\.(?P<minor>\d+)\.(?:(?P<any>x)|(?P<patch>\d+)(?:rc(?P<rc>\d+))?)$")
FINAL = 10**9  # a final release sorts after its release candidates; "1.3.x" after every 1.3 release

VersionKey = tuple[int, int, int, int]


def version_key(version: str) -> VersionKey | None:
    """A sortable key of a TensorRT-LLM version (``1.3.0rc22``, ``1.3.0rc22.post1``, ``1.2.1``, ``1.4``), None
    when it is not one."""
    m = _TAG.match(version.strip())
    if not m:
        return None
    patch = int(m["patch"]) if m["patch"] is not None else 0
    rc = int(m["rc"]) if m["rc"] is not None else FINAL
    return int(m["major"]), int(m["minor"]), patch, rc


def _bound(text: str) -> VersionKey:
    m = _BOUND.match(str(text))
    if not m:
        raise ValueError(f"options/releases.yaml: bad version bound {text!r} (want 1.3.0rc5, 1.2.1 or 1.3.x)")
    if m["any"]:
        return int(m["major"]), int(m["minor"]), FINAL, FINAL
    return int(m["major"]), int(m["minor"]), int(m["patch"]), int(m["rc"]) if m["rc"] is not None else FINAL


@lru_cache(maxsize=1)
def _ranges() -> tuple[tuple[str, VersionKey, VersionKey], ...]:
    rows = _table()["releases"]
    return tuple((name, _bound(row["versions"]["from"]), _bound(row["versions"]["to"])) for name, row in rows.items())


def release_of_version(version: str) -> str:
    """A TensorRT-LLM version string (``1.2.0``, ``1.2.0rc2``, ``1.3.0rc7``, ``1.3.0rc22``, ``1.4.0rc1``) -> its
    row; ``NEWER`` above every row; else ``CONSERVATIVE`` (no row surely applies)."""
    key = version_key(version)
    if key is None:
        return CONSERVATIVE
    for name, low, high in _ranges():
        if low <= key <= high:
            return name
    return NEWER if key > max(high for _, _, high in _ranges()) else CONSERVATIVE


def release_of_image(image: str) -> str:
    """The release an image's tag names (``nvcr.io/nvidia/tensorrt-llm/release:1.2.0``), else conservative.
    A digest-pinned or ``latest`` image names none."""
    if "@" in image:
        image = image.split("@", 1)[0]
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return CONSERVATIVE
    return release_of_version(last.rsplit(":", 1)[1])


def release_of_probe(probe: dict[str, Any] | None) -> str | None:
    """The release the build Job recorded (``trtllm.version`` in the engine manifest), None when absent."""
    if not isinstance(probe, dict) or not isinstance(probe.get("version"), str):
        return None
    return release_of_version(probe["version"])


def effective(image: str, probe: dict[str, Any] | None = None) -> tuple[Surface, str | None]:
    """The surface to render and read with, and a mismatch message (None when the image is what its tag says).

    What the build Job recorded about the image wins over the tag: the recorded version picks the row, and a
    recorded ``TrtLlmArgs`` field list overrides the row's ``perf_metrics_max_requests`` fact, so a rebuilt or
    patched image is served as it really is. A mismatch is reported (a condition), never a crash loop."""
    probe = probe if isinstance(probe, dict) else None
    assumed = release_of_image(image)
    recorded = release_of_probe(probe)
    surface = get(recorded if recorded is not None else assumed)
    message = None
    if recorded is not None and recorded != assumed:
        message = (f"image {image} is tagged as TensorRT-LLM release {assumed} but reports version "
                   f"{(probe or {}).get('version')!s} (surface {recorded}); serving renders from the recorded surface")
    has_field = (probe or {}).get("trtLlmArgsHasPerfMetricsMaxRequests")
    if isinstance(has_field, bool) and has_field != surface.trt_has_perf_metrics_max_requests:
        from dataclasses import replace

        surface = replace(surface, trt_has_perf_metrics_max_requests=has_field)
        message = (message + "; " if message else f"image {image}: ") + (
            f"TrtLlmArgs {'has' if has_field else 'lacks'} perf_metrics_max_requests, unlike release "
            f"{recorded or assumed} in kvpilot's table; serving renders from the recorded surface")
    return surface, message


def clean_record(record: Any) -> dict[str, Any] | None:
    """The probe's record as status may hold it: known keys only, typed and cut to the CRD's bounds (the record
    comes from inside an image, and a status the API server refuses would stall the engine's updates)."""
    if not isinstance(record, dict):
        return None
    out: dict[str, Any] = {}
    for key, limit in (("version", 64), ("collectorPrefix", 32), ("probeError", 512)):
        if isinstance(record.get(key), str):
            out[key] = record[key][:limit]
    if isinstance(record.get("trtLlmArgsHasPerfMetricsMaxRequests"), bool):
        out["trtLlmArgsHasPerfMetricsMaxRequests"] = record["trtLlmArgsHasPerfMetricsMaxRequests"]
    names = record.get("collectorNames")
    if isinstance(names, list):
        out["collectorNames"] = [n[:128] for n in names if isinstance(n, str)][:64]
    return out or None

"""Compare what an image reports (the probe's JSON, ``probe.py --full``) with kvpilot's release table.

``hack/trtllm-contract-check.sh IMAGE`` runs the probe inside the image (no GPU) and pipes it to
``kvpilot doctor trtllm``, which prints the facts, the differences, and the row to contribute. Pure: it takes the
probe's dict and returns findings, so it is unit-tested on recorded outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from kvpilot.trtllm import options as option_lists
from kvpilot.trtllm import surface as surfaces

# Top-level LLM-API keys kvpilot renders (serve.py): each must be a field of the backend's args class.
RENDERED_TRT = ("max_batch_size", "max_num_tokens", "enable_chunked_prefill", "kv_cache_config", "scheduler_config")
RENDERED_TORCH = RENDERED_TRT + ("return_perf_metrics", "enable_iter_perf_stats", "max_seq_len", "cuda_graph_config")
# Serve flags kvpilot renders (serve_command): each must be an option of the image's trtllm-serve.
RENDERED_SERVE_FLAGS = ("--tokenizer", "--backend", "--host", "--port", "--max_batch_size", "--max_num_tokens",
                        "--kv_cache_free_gpu_memory_fraction", "--tp_size", "--pp_size", "--extra_llm_api_options",
                        "--max_seq_len", "--revision")


@dataclass(frozen=True)
class Finding:
    ok: bool
    topic: str
    message: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'DIFF'} {self.topic}: {self.message}"


def _strings(probe: dict[str, Any], key: str) -> set[str] | None:
    value = probe.get(key)
    if not isinstance(value, list):
        return None
    return {v for v in value if isinstance(v, str)}


def compare(probe: dict[str, Any], image: str = "") -> tuple[str, list[Finding]]:
    """(the release row the image maps to, findings). A fact the probe could not read is a finding too."""
    version = probe.get("version") if isinstance(probe.get("version"), str) else None
    release = surfaces.release_of_version(version) if version else surfaces.release_of_image(image)
    row = surfaces.get(release)
    out = _version_findings(probe, image, version, release)
    out += _tensorrt_findings(probe, row)
    out += _perf_metrics_findings(probe, row)
    out += _args_findings(probe, row)
    out += _scheduler_findings(probe, row)
    out += _serve_findings(probe)
    out += _collector_findings(probe, row)
    return release, out


def _version_findings(probe: dict[str, Any], image: str, version: str | None, release: str) -> list[Finding]:
    """The version the image reports, the row it maps to, and whether its tag names the same release."""
    out: list[Finding] = []
    tag = surfaces.release_of_image(image) if image else None
    if version is None:
        out.append(Finding(False, "version", f"the probe could not read tensorrt_llm.__version__ "
                                             f"({probe.get('probeError', 'no error given')})"))
    elif release in (surfaces.CONSERVATIVE, surfaces.NEWER):
        which = "the PyTorch-only conservative" if release == surfaces.NEWER else "the conservative"
        out.append(Finding(False, "version", f"{version} has no row in options/releases.yaml: kvpilot serves it with "
                                             f"{which} surface; contribute the row printed below"))
    else:
        out.append(Finding(True, "version", f"{version} -> row {release}"))
    if tag is not None and version is not None and tag != release:
        out.append(Finding(False, "image tag", f"{image} names release {tag}, the image reports {version}"))
    return out


def _perf_metrics_findings(probe: dict[str, Any], row: surfaces.Surface) -> list[Finding]:
    """Whether TrtLlmArgs has perf_metrics_max_requests (return_perf_metrics is safe on TensorRT only then)."""
    has = probe.get("trtLlmArgsHasPerfMetricsMaxRequests")
    if row.tensorrt_removed:
        return []  # TrtLlmArgs is gone with the TensorRT backend (docs/source/legacy/tensorrt-backend-removal.md)
    if not isinstance(has, bool):
        return [Finding(False, "TrtLlmArgs.perf_metrics_max_requests", "not read by the probe")]
    agree = has == row.trt_has_perf_metrics_max_requests
    effect = "return_perf_metrics is safe on TensorRT" if has else \
        "return_perf_metrics crash-loops the TensorRT backend (NVIDIA/TensorRT-LLM#9678)"
    return [Finding(agree, "TrtLlmArgs.perf_metrics_max_requests",
                    f"{'present' if has else 'absent'} ({effect}); the table says "
                    f"{'present' if row.trt_has_perf_metrics_max_requests else 'absent'}")]


def _args_findings(probe: dict[str, Any], row: surfaces.Surface) -> list[Finding]:
    """Each backend's LLM-API args class has every key kvpilot renders for it."""
    out: list[Finding] = []
    for key, rendered, cls in (("trtLlmArgsFields", RENDERED_TRT, "TrtLlmArgs"),
                               ("torchLlmArgsFields", RENDERED_TORCH, "TorchLlmArgs")):
        if cls == "TrtLlmArgs" and row.tensorrt_removed:
            continue
        fields = _strings(probe, key)
        if fields is None:
            out.append(Finding(False, cls, "fields not read by the probe"))
            continue
        missing = sorted(set(rendered) - fields)
        out.append(Finding(not missing, cls, f"lacks rendered keys {missing}" if missing else
                           f"{len(fields)} fields; has every key kvpilot renders"))
        if cls == "TrtLlmArgs":
            torch_only = sorted((row.pytorch_only_keys - {"perf_metrics_max_requests"}) & fields)
            if torch_only:
                out.append(Finding(False, cls, f"has keys the table lists as PyTorch-only: {torch_only}"))
    return out


def _scheduler_findings(probe: dict[str, Any], row: surfaces.Surface) -> list[Finding]:
    """SchedulerConfig's fields against the table's (a field the table lacks is one kvpilot never renders)."""
    sched = _strings(probe, "schedulerConfigFields")
    if sched is None:
        return []
    extra, missing = sorted(sched - row.scheduler_config_keys), sorted(row.scheduler_config_keys - sched)
    same = not extra and not missing
    return [Finding(same, "SchedulerConfig", "as in the table" if same else
                    f"image has {extra} beyond the table, lacks {missing}")]


def _serve_findings(probe: dict[str, Any]) -> list[Finding]:
    """trtllm-serve has every flag kvpilot renders; options beyond the recorded list are reported, not failed."""
    serve = _strings(probe, "serveOptions")
    if serve is None:
        return [Finding(False, "trtllm-serve", "options not read by the probe")]
    missing = sorted(f for f in RENDERED_SERVE_FLAGS if f not in serve)
    spec = option_lists.load("trtllm-serve")
    known = set(spec.options) | set(spec.aliases)
    new = sorted(serve - known - {"--help"})
    out = [Finding(not missing, "trtllm-serve", f"lacks rendered flags {missing}" if missing else
                   "has every flag kvpilot renders")]
    if new:
        out.append(Finding(True, "trtllm-serve", f"options not in options/trtllm_serve.yaml: {new}"))
    return out


def _collector_findings(probe: dict[str, Any], row: surfaces.Surface) -> list[Finding]:
    """The Prometheus collector's metric names against the row's."""
    names = _strings(probe, "collectorNames")
    prefix = probe.get("collectorPrefix")
    if names is None or not isinstance(prefix, str):
        return [Finding(False, "collector", "metric names not read by the probe")]
    expected = {**row.prometheus_names, **row.prometheus_gauges}
    absent = sorted(n for n in expected.values() if n not in names)
    beyond = sorted(names - set(expected.values()))
    same = not absent and not beyond
    return [Finding(same, "collector", f"prefix {prefix!r}; " + ("as in the table" if same else
                                                                 f"table names absent {absent}, image names beyond "
                                                                 f"the table {beyond}"))]


def _tensorrt_findings(probe: dict[str, Any], row: surfaces.Surface) -> list[Finding]:
    """Whether the image has trtllm-build, against the row's tensorrt_backend (the fact refusals rest on)."""
    present = probe.get("trtllmBuild")
    if not isinstance(present, bool) or row.tensorrt_backend == "unknown":
        return []
    expected = not row.tensorrt_removed
    return [Finding(present == expected, "TensorRT backend",
                    f"trtllm-build {'present' if present else 'absent'}; the table says the TensorRT backend is "
                    f"{row.tensorrt_backend}")]


def suggested_row(probe: dict[str, Any]) -> str:
    """The facts a contributor copies into options/releases.yaml (then adds sources and behaviours)."""
    names = sorted(_strings(probe, "collectorNames") or ())
    sched = sorted(_strings(probe, "schedulerConfigFields") or ())
    trt, torch = _strings(probe, "trtLlmArgsFields") or set(), _strings(probe, "torchLlmArgsFields") or set()
    row = {
        str(probe.get("version", "?")): {
            "sources": ["hack/trtllm-contract-check.sh on <image@digest>, <date>"],
            "llm_api": {
                "pytorch_only": sorted(torch - trt),
                "trt_llm_args_has_perf_metrics_max_requests": probe.get("trtLlmArgsHasPerfMetricsMaxRequests"),
                "scheduler_config": sched,
            },
            "prometheus": {"prefix": probe.get("collectorPrefix"), "names_seen": names},
        }
    }
    return yaml.safe_dump(row, sort_keys=False)


def report(probe: dict[str, Any], image: str = "") -> tuple[str, bool]:
    """The printed report and whether the image matches its row."""
    import textwrap

    release, findings = compare(probe, image)

    def listing(title: str, key: str) -> list[str]:
        values = sorted(_strings(probe, key) or ())
        body = textwrap.wrap(", ".join(values), 100, initial_indent="    ", subsequent_indent="    ") or ["    -"]
        return [f"  {title} ({len(values)}):", *body]

    lines = [f"TensorRT-LLM contract check{' of ' + image if image else ''}",
             f"  version: {probe.get('version', '?')}  (table row: {release})",
             f"  TrtLlmArgs has perf_metrics_max_requests: {probe.get('trtLlmArgsHasPerfMetricsMaxRequests', '?')}",
             f"  collector prefix: {probe.get('collectorPrefix', '?')!r}",
             *listing("collector metric names", "collectorNames"),
             *listing("TrtLlmArgs fields", "trtLlmArgsFields"),
             *listing("TorchLlmArgs fields", "torchLlmArgsFields"),
             *listing("SchedulerConfig fields", "schedulerConfigFields"),
             *listing("trtllm-serve options", "serveOptions"), ""]
    lines += [f.line() for f in findings]
    ok = all(f.ok for f in findings)
    if not ok:
        lines += ["", "Row to contribute (docs/trtllm-releases.md):", suggested_row(probe)]
    return "\n".join(lines) + "\n", ok

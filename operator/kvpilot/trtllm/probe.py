"""What the serving image really is: a probe the build Job runs in that image (it already runs there), recorded
into the engine manifest under ``trtllm``, and the same probe printed in full by ``hack/trtllm-contract-check.sh``.

Why: the image tag is a claim; the release surface (``options/releases.yaml``) is what kvpilot renders and reads
by. The probe reads ``tensorrt_llm.__version__``, whether ``TrtLlmArgs`` has ``perf_metrics_max_requests`` (the
field whose absence crash-loops ``return_perf_metrics`` on 1.2's TensorRT backend, NVIDIA/TensorRT-LLM#9678) and
the collector's metric names. It needs no GPU, never fails the build, and prints one JSON object.
"""

from __future__ import annotations

import shlex

from kvpilot.trtllm.surface import metric_spellings

# Runs inside the image with its python3: standard library and tensorrt_llm only. Each fact is read on its own,
# so one failure (an import that needs a driver) leaves the others.
PROBE_PY = r'''
import json, os
out, errors = {}, []
try:
    import tensorrt_llm
    out["version"] = str(tensorrt_llm.__version__)
    root = os.path.dirname(tensorrt_llm.__file__)
except Exception as exc:
    errors.append("tensorrt_llm: %s" % exc)
    root = None
try:
    from tensorrt_llm.llmapi.llm_args import TrtLlmArgs
    out["trtLlmArgsHasPerfMetricsMaxRequests"] = "perf_metrics_max_requests" in TrtLlmArgs.model_fields
except Exception as exc:
    errors.append("llm_args: %s" % exc)
try:
    text = open(os.path.join(root, "metrics", "collector.py")).read()
    out["collectorPrefix"] = "trtllm_" if "trtllm_" in text else ""
    out["collectorNames"] = [out["collectorPrefix"] + n for n in KNOWN if n.replace("_total", "") in text]
except Exception as exc:
    errors.append("collector: %s" % exc)
FULL
if errors:
    out["probeError"] = "; ".join(errors)[:500]
print(json.dumps(out, sort_keys=True))
'''

# The contract check adds what a person compares against the table: every args field and serve option.
PROBE_FULL = r'''
try:
    from tensorrt_llm.llmapi.llm_args import TrtLlmArgs, TorchLlmArgs, SchedulerConfig
    out["trtLlmArgsFields"] = sorted(TrtLlmArgs.model_fields)
    out["torchLlmArgsFields"] = sorted(TorchLlmArgs.model_fields)
    out["schedulerConfigFields"] = sorted(SchedulerConfig.model_fields)
except Exception as exc:
    errors.append("llm_args fields: %s" % exc)
try:
    from tensorrt_llm.commands.serve import main as group
    cmd = group.commands.get("serve", group) if hasattr(group, "commands") else group
    out["serveOptions"] = sorted(o for p in cmd.params for o in getattr(p, "opts", []) if o.startswith("--"))
except Exception as exc:
    errors.append("serve options: %s" % exc)
'''


def probe_source(full: bool = False) -> str:
    """The probe with the metric names kvpilot reads filled in (unprefixed: a prefixed name contains it)."""
    names = sorted({n.removeprefix("trtllm_") for spellings in metric_spellings().values() for n in spellings})
    return PROBE_PY.replace("KNOWN", repr(names)).replace("FULL\n", PROBE_FULL.lstrip("\n") if full else "")


def record_lines(manifest_path: str) -> list[str]:
    """Bash lines for the build script: merge the probe into the staged manifest. Best effort by design: a
    probe that cannot run leaves the manifest as it was (serving then assumes the release the tag names)."""
    merge = (
        "import json,sys\n"
        "p=sys.argv[1]\n"
        "m=json.load(open(p))\n"
        "probe=json.loads(sys.stdin.read() or '{}')\n"
        "m['trtllm']=probe if isinstance(probe, dict) else {}\n"
        "open(p,'w').write(json.dumps(m,sort_keys=True)+'\\n')\n"
    )
    return [
        "echo '+ probe the TensorRT-LLM release surface'",
        f"python3 -c {shlex.quote(probe_source())} | python3 -c {shlex.quote(merge)} {manifest_path} "
        "|| echo 'kvpilot: could not probe the image (serving assumes the release its tag names)'",
    ]

"""What the serving image really is: a probe the build Job runs in that image (it already runs there), recorded
into the engine manifest under ``trtllm``, and the same probe printed in full by ``hack/trtllm-contract-check.sh``.

Why: the image tag is a claim; the release surface (``options/releases.yaml``) is what kvpilot renders and reads
by. The probe reads ``tensorrt_llm.__version__``, whether ``TrtLlmArgs`` has ``perf_metrics_max_requests`` (the
field whose absence crash-loops ``return_perf_metrics`` on 1.2's TensorRT backend, NVIDIA/TensorRT-LLM#9678) and
the collector's metric names. It needs no GPU, never fails the build, and prints one JSON object.
"""

from __future__ import annotations

import shlex

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.api.release_tags import PYTORCH_ONLY_VERSION_REGEX
from kvpilot.trtllm.backend import way_forward
from kvpilot.trtllm.surface import metric_spellings

# The build Job's exit status when the image has no TensorRT backend: the Job's podFailurePolicy fails the Job at
# once on it (no retry can help), and the termination message says why, starting with REFUSED_MARKER.
REFUSED_EXIT_CODE = 42
REFUSED_MARKER = "kvpilot: refused before anything ran: "
MAX_REFUSAL_CHARS = 1000

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
import shutil
out["trtllmBuild"] = shutil.which("trtllm-build") is not None
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


# Runs first in a TensorRT build, inside the image: where only the image can tell (a digest, `latest`, a custom
# tag), it refuses a release without the TensorRT backend before any download. Standard library and tensorrt_llm.
REFUSE_PY = r'''
import re, shutil, sys
regex, image, forward, code = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
try:
    import tensorrt_llm
    version = str(tensorrt_llm.__version__)
except Exception:
    version = None
removed = version is not None and re.match(regex, version) is not None
if removed or shutil.which("trtllm-build") is None:
    why = ("is TensorRT-LLM %s, a release without the TensorRT backend" % version if removed else
           "has no trtllm-build on its PATH (TensorRT-LLM %s)" % (version or "of unknown version"))
    message = ("MARKERimage %s %s (TensorRT-LLM removed trtllm-build and "
               "--backend tensorrt after 1.3.0rc20): %s" % (image, why, forward))
    sys.stderr.write(message + "\n")
    try:
        open("/dev/termination-log", "w").write(message)
    except OSError:
        pass
    sys.exit(code)
print("kvpilot: image %s has the TensorRT backend (TensorRT-LLM %s)" % (image, version or "version unread"))
'''


def refuse_lines(image: str, spec: InferenceEngineSpec) -> list[str]:
    """Bash lines that stop a TensorRT build on an image without the TensorRT backend (exit REFUSED_EXIT_CODE)."""
    args = " ".join(shlex.quote(a) for a in (PYTORCH_ONLY_VERSION_REGEX, image, way_forward(spec),
                                               str(REFUSED_EXIT_CODE)))
    script = REFUSE_PY.replace("MARKER", REFUSED_MARKER)
    return ["echo '+ check that the image has the TensorRT backend'", f"python3 -c {shlex.quote(script)} {args}"]


def refusal_in(message: str | None) -> str | None:
    """The build Job's refusal (REFUSE_PY's line, from the failed pod's termination message) in a failed build's
    message, None when the build failed for another reason. The message comes from a pod: bounded, first line only."""
    if not message or REFUSED_MARKER not in message:
        return None
    line = message[message.index(REFUSED_MARKER):].splitlines()[0]
    return line[:MAX_REFUSAL_CHARS]

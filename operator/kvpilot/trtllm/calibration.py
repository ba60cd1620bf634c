"""The calibration set quantize.py reads, checked before the build spends hours on it.

TensorRT-LLM's ``get_calib_dataloader`` (tensorrt_llm/quantization/quantize_by_modelopt.py, index id 1063601771;
shared reference trtllm.md §9) loads:
- any path or name containing ``cnn_dailymail`` as ``load_dataset(path, name="3.0.0", split="train")["article"]``:
  a local copy must be the cnn_dailymail dataset repository with its ``3.0.0`` config (``3.0.0/train-*.parquet``,
  as on the Hub's abisee/cnn_dailymail);
- any other local directory as ``load_dataset(dir, split="train")["text"]``: a train split with a ``text`` column.
A ``pvc://`` dataset is mounted at /calibration; the check runs in the build Job before any download or
conversion, and fails with the layout that must hold instead of a traceback hours later.
"""

from __future__ import annotations

import shlex

from kvpilot.api.models import InferenceEngineSpec
from kvpilot.trtllm.build import calibrates, calibration_dataset

CHECK_PY = r'''
import os, sys
path = sys.argv[1]
def fail(message):
    sys.stderr.write("kvpilot: calibration set %s (spec.build.calibration.dataset): %s\n" % (path, message))
    sys.exit(3)
if not os.path.isdir(path):
    fail("is not a directory on the claim")
def has_train(root):
    return any(f.startswith("train") for _, _, files in os.walk(root) for f in files)
if "cnn_dailymail" in path:
    config = os.path.join(path, "3.0.0")
    if not (os.path.isdir(config) and has_train(config)):
        fail("quantize.py loads it as load_dataset(path, name='3.0.0', split='train')['article'], so it must hold "
             "the cnn_dailymail dataset repository with its 3.0.0 config (3.0.0/train-*.parquet)")
elif not has_train(path):
    fail("a local dataset directory is loaded as load_dataset(dir, split='train')['text']: it needs a train split "
         "(a file named train*, e.g. train.jsonl or data/train-00000-of-00001.parquet) with a 'text' column")
print("kvpilot: calibration set %s has the layout quantize.py reads" % path)
'''


def preflight_lines(spec: InferenceEngineSpec) -> list[str]:
    """Bash lines that check a local calibration set's layout; none when the build does not calibrate from one."""
    if not calibrates(spec):
        return []
    if not spec.build.calibration.dataset.startswith("pvc://"):
        return []  # a Hub name: quantize.py downloads it (needs network and, for cnn_dailymail, nothing else)
    return [f"python3 -c {shlex.quote(CHECK_PY)} {shlex.quote(calibration_dataset(spec))}"]

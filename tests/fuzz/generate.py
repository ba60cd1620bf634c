"""Writes the hostile-manifest corpus (tests/fuzz/manifests/) deterministically: `python -m tests.fuzz.generate`.

The corpus is committed, so a failure names a file anyone can rerun with `kvpilot render -f`. Three families:
``str-*`` puts each hostile string in each string field (shell metacharacters, option-like values, traversal,
newlines, control and bidi characters, over-long values); ``type-*`` puts wrong types in typed fields;
``file-*`` attacks the YAML reader itself (aliases, nesting, encodings, duplicate keys, several documents).
Shell payloads `touch kvpilot-pwned`, a path relative to the directory a test runs the build script in.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.cases.engines import base

OUT = Path(__file__).parent / "manifests"
MARKER = "kvpilot-pwned"

PAYLOADS = [
    f"$(touch {MARKER})", f"`touch {MARKER}`", f"x;touch {MARKER};", f"x' ; touch {MARKER} ; '",
    f'x" ; touch {MARKER} ; "', f"x && touch {MARKER}", f"x | touch {MARKER}", f"x\ntouch {MARKER}",
    f"$STAGE$(touch {MARKER})", f"$(touch${{IFS}}{MARKER})", "--help", "-rf", "../../../etc/passwd", "..",
    "a b", "", " ", "main\n", "x" * 1100, "\u202etxt.exe", "\uff46\uff55\uff4c\uff4c", "tab\there", "${HOME}",
    "*", "\\", "%s%n%x", "null", "\x7f\x1b[31m",
]
# Fields whose value reaches the build script or a command line: every payload, in several wrappings.
SCRIPT_FIELDS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("source-pvc", "spec.model.source", "pvc://models/llama/{}", {}),
    ("source-pvc-claim", "spec.model.source", "pvc://{}", {}),
    ("source-hf", "spec.model.source", "hf://org/{}", {}),
    ("source-s3", "spec.model.source", "s3://bucket/{}", {}),
    ("revision", "spec.model.revision", "{}", {}),
    ("dataset", "spec.build.calibration.dataset", "{}", {"spec.build.quantization": "fp8"}),
    ("dataset-pvc", "spec.build.calibration.dataset", "pvc://datasets/{}", {"spec.build.quantization": "fp8"}),
    ("image", "spec.runtime.image", "{}", {}),
    ("env-value", "spec.runtime.env", "{}", {}),
]
# Fields that become names, labels or enum values in child objects: a rotating share of the payloads.
OTHER_FIELDS = [
    "metadata.name", "metadata.namespace", "spec.model.architecture", "spec.model.credentialsSecretRef.name",
    "spec.runtime.backend", "spec.runtime.simulation.profile", "spec.build.dtype", "spec.build.quantization",
    "spec.build.kvCacheDtype", "spec.build.kvCache.type", "spec.batching.mode", "spec.batching.schedulerPolicy",
    "spec.serving.gpuProduct", "spec.serving.priorityClassName", "spec.serving.nodeSelector",
    "spec.serving.nodeSelector.value", "spec.serving.tolerations", "spec.serving.tolerations.value",
    "spec.engineCache.claimName", "spec.engineCache.storageClassName", "spec.engineCache.size",
    "spec.engineCache.accessMode", "spec.autotune.mode", "spec.autotune.metrics.source", "spec.autotune.metrics.url",
    "spec.runtime.env.name", "spec.build.resources.requests",
]
TYPED_FIELDS = [
    "spec.build.maxBatchSize", "spec.batching.maxBatchSize", "spec.build.kvCache.tokensPerBlock",
    "spec.serving.replicas", "spec.autotune.intervalSeconds", "spec.build.multipleProfiles", "spec.model",
    "spec.serving.tolerations", "spec.runtime.env", "spec.engineCache.size",
]
WRONG_VALUES: list[Any] = ["64", 64.5, True, None, [64], {"a": 1}, 2**70, -(2**63), float("inf")]


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return out


def _special(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Fields that are lists or maps get the payload where a user would type it."""
    if path == "spec.runtime.env":
        return _set(doc, path, [{"name": "X", "value": value}])
    if path == "spec.runtime.env.name":
        return _set(doc, "spec.runtime.env", [{"name": value, "value": "v"}])
    if path == "spec.serving.nodeSelector":
        return _set(doc, path, {value: "v"})
    if path == "spec.serving.nodeSelector.value":
        return _set(doc, "spec.serving.nodeSelector", {"zone": value})
    if path == "spec.serving.tolerations":
        return _set(doc, path, [{"key": value, "operator": "Exists"}])
    if path == "spec.serving.tolerations.value":
        return _set(doc, "spec.serving.tolerations", [{"key": "k", "operator": "Equal", "value": value}])
    if path == "spec.build.resources.requests":
        return _set(doc, path, {value: "1"})
    if path == "spec.autotune.metrics.url":
        return _set(doc, "spec.autotune.metrics", {"source": "Prometheus", "url": value})
    return _set(doc, path, value)


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=False, width=4096)


def corpus() -> dict[str, bytes]:
    """File name -> content; the same every run."""
    out: dict[str, bytes] = {}
    tensorrt = base("fuzz", "tensorrt")
    for tag, path, wrap, extra in SCRIPT_FIELDS:
        for i, payload in enumerate(PAYLOADS):
            doc = tensorrt
            for k, v in extra.items():
                doc = _set(doc, k, v)
            out[f"str-{tag}-{i:02d}.yaml"] = _dump(_special(doc, path, wrap.format(payload))).encode()
    simulated = base("fuzz", "simulated")
    for j, path in enumerate(OTHER_FIELDS):
        for k in range(5):
            i = (j * 5 + k) % len(PAYLOADS)
            tag = path.removeprefix("spec.").replace(".", "-")
            out[f"str-{tag}-{i:02d}.yaml"] = _dump(_special(simulated, path, PAYLOADS[i])).encode()
    for path in TYPED_FIELDS:
        for i, value in enumerate(WRONG_VALUES):
            tag = path.removeprefix("spec.").replace(".", "-")
            out[f"type-{tag}-{i}.yaml"] = _dump(_set(simulated, path, value)).encode()
    out.update(_file_attacks(_dump(simulated)))
    return out


def _file_attacks(valid: str) -> dict[str, bytes]:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9))
    spec_bomb = valid.replace("spec:\n", "x: &x [1, 1, 1, 1, 1, 1, 1, 1]\nspec:\n  env: [*x, *x, *x]\n", 1)
    files = {
        "file-empty.yaml": "",
        "file-comments-only.yaml": "# nothing here\n",
        "file-only-separators.yaml": "---\n---\n...\n",
        "file-alias-bomb.yaml": bomb,
        "file-alias-in-spec.yaml": spec_bomb,
        "file-merge-key.yaml": valid.replace("spec:\n", "spec:\n  <<: {replicas: 1}\n", 1),
        "file-deep-flow.yaml": "spec: " + "[" * 5000 + "]" * 5000 + "\n",
        "file-deep-map.yaml": "spec: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
        "file-deep-block.yaml": "".join("  " * i + f"k{i}:\n" for i in range(300)) + "  " * 300 + "v\n",
        "file-duplicate-top.yaml": valid + "kind: InferenceEngine\n",
        "file-duplicate-nested.yaml": valid.replace("spec:\n", "spec:\n  runtime: {}\n", 1),
        "file-metadata-list.yaml": valid.replace("metadata:\n  name: fuzz", "metadata:\n- name\n- fuzz"),
        "file-metadata-scalar.yaml": valid.replace("metadata:\n  name: fuzz", "metadata: fuzz"),
        "file-spec-list.yaml": "apiVersion: serving.kvpilot.io/v1alpha1\nkind: InferenceEngine\n"
                               "metadata: {name: x}\nspec: [1, 2]\n",
        "file-scalar.yaml": "just a string\n",
        "file-list.yaml": "- a\n- b\n",
        "file-number.yaml": "42\n",
        "file-second-invalid.yaml": valid + "---\n" + valid.replace("name: fuzz", "name: Bad_Name"),
        "file-second-unparsable.yaml": valid + "---\nspec: [\n",
        "file-many-documents.yaml": "---\na: 1\n" * 1200,
        "file-python-tag.yaml": "!!python/object/apply:os.system ['touch kvpilot-pwned']\n",
        "file-custom-tag.yaml": valid.replace("spec:\n", "spec: !custom\n", 1),
        "file-timestamp-name.yaml": valid.replace("name: fuzz", "name: 2026-12-01"),
        "file-int-name.yaml": valid.replace("name: fuzz", "name: 12345"),
        "file-null-name.yaml": valid.replace("name: fuzz", "name: ~"),
        "file-bool-keys.yaml": valid.replace("spec:\n", "spec:\n  yes: no\n", 1),
        "file-unhashable-key.yaml": "? [a, b]\n: 1\n",
        "file-tabs.yaml": valid.replace("  ", "\t"),
        "file-crlf.yaml": valid.replace("\n", "\r\n"),
        "file-huge-value.yaml": valid.replace("name: fuzz", "name: " + "x" * 20_000),
        "file-long-key.yaml": valid.replace("spec:\n", "spec:\n  " + "k" * 20_000 + ": 1\n", 1),
    }
    out = {k: v.encode() for k, v in files.items()}
    out["file-binary.yaml"] = bytes(range(256)) * 8
    out["file-latin1.yaml"] = valid.replace("name: fuzz", "name: caf\u00e9").encode("latin-1")
    out["file-utf16.yaml"] = valid.encode("utf-16")
    out["file-bom.yaml"] = b"\xef\xbb\xbf" + valid.encode()
    out["file-nul.yaml"] = valid.encode() + b"x: \x00\n"
    out["file-truncated-utf8.yaml"] = valid.encode() + b"x: \xe2\x82\n"
    return out


def main() -> int:
    OUT.mkdir(exist_ok=True)
    files = corpus()
    for old in OUT.glob("*.yaml"):
        if old.name not in files:
            old.unlink()
    for name, content in files.items():
        (OUT / name).write_bytes(content)
    print(f"wrote {len(files)} manifests to {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

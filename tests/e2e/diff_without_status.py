"""A ``KUBECTL_EXTERNAL_DIFF`` program that compares what a GitOps pipeline compares: the objects without their
``status``, as Argo CD does by default for custom resources (``resource.compareoptions``
``ignoreResourceStatusField``). ``kubectl diff --server-side`` reads the live object, then dry-runs the apply; an
operator's status write between the two reads (the live pool's active requests, a window's figures) shows as a
difference nobody's manifest made, and the pipeline would not see one.

Usage (what kubectl runs): ``python diff_without_status.py LIVE_DIR MERGED_DIR``; prints a unified diff of what
differs and exits 1, or exits 0 when the objects match.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import yaml


def _without_status(path: Path) -> str:
    doc = yaml.safe_load(path.read_text()) if path.exists() else None
    if isinstance(doc, dict):
        doc.pop("status", None)
    return yaml.safe_dump(doc, sort_keys=True)


def main(live: Path, merged: Path) -> int:
    """Print how the objects in ``merged`` differ from ``live`` (status aside); 1 when they do, else 0."""
    differ = 0
    for name in sorted({p.name for p in live.iterdir()} | {p.name for p in merged.iterdir()}):
        before, after = _without_status(live / name), _without_status(merged / name)
        if before != after:
            differ = 1
            sys.stdout.writelines(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                                       f"live/{name}", f"merged/{name}"))
    return differ


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: diff_without_status.py LIVE_DIR MERGED_DIR")
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))

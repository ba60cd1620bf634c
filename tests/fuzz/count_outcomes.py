"""Counts what the corpus does to a kvpilot tree: `PYTHONPATH=<tree>/operator:. python -m tests.fuzz.count_outcomes`.

Unlike the test, it keeps going after a failure, so it can measure an older tree (the figures in
docs/hardening.md were taken with it before and after the issue-13 fixes).
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from collections import Counter
from pathlib import Path

from kvpilot.cli import load_engines, main
from kvpilot.desired.fingerprint import compute_fingerprint
from kvpilot.desired.settings import Settings
from kvpilot.desired.pod_parts import image_for
from tests.fuzz.generate import MARKER, OUT
from tests.unit import script_sandbox as SB


def count() -> Counter[str]:
    c: Counter[str] = Counter()
    for f in sorted(OUT.glob("*.yaml")):
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                rc = main(["render", "-f", str(f)])
        except BaseException as exc:  # noqa: BLE001 — counting tracebacks is the point
            c["traceback"] += 1
            print(f"traceback {f.name}: {type(exc).__name__}", file=sys.stderr)
            continue
        c["rejected" if rc else "accepted"] += 1
        if rc:
            continue
        s = Settings()
        for e in load_engines(str(f)):
            if not e.spec.builds_engine:
                continue
            img = image_for(e.spec, s.kvsim_image, s.default_image)
            fp = compute_fingerprint(e.spec, img, e.spec.build.max_batch_size)
            with tempfile.TemporaryDirectory() as d:
                sb = SB.make_sandbox(Path(d))
                script = SB.render(sb, e.spec, fp, image=img)
                if SB.syntax_ok(script).returncode:
                    c["bash -n fails"] += 1
                result = SB.run(sb, script)
                if (sb.root / MARKER).exists():
                    c["injection"] += 1
                    print(f"injection {f.name}", file=sys.stderr)
                elif result.returncode:
                    c["script fails"] += 1
                elif SB.recorded_argvs(sb) != SB.expected_argvs(sb, e.spec, fp):
                    c["argv altered"] += 1
    return c


if __name__ == "__main__":
    print(dict(count()))

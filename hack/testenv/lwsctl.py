"""Run the real LeaderWorkerSet controller (sigs.k8s.io/lws) on the local cluster, webhooks included.

cluster-up.sh calls it; the controller itself runs as a local process (like the control plane), under its
own ServiceAccount's token, with LWS's own certificate management (cert-controller's rotator) left on.

How the API server reaches the webhooks. LWS's webhook configurations name the Service
``lws-webhook-service.lws-system`` and the rotator issues a serving certificate for exactly
``lws-webhook-service.lws-system.svc`` and writes its CA into the configurations' caBundle. Without
``--enable-aggregator-routing`` kube-apiserver resolves a webhook Service by its ClusterIP, and for a Service
of type ExternalName by its externalName (k8s.io/apiserver@v0.36.3 pkg/util/proxy/proxy.go ResolveCluster),
dialling ``<externalName>:<the webhook's service.port>`` while still verifying the certificate against
``<name>.<namespace>.svc`` (pkg/util/webhook/client.go). So the Service becomes ExternalName ``127.0.0.1``
(a valid DNS-1123 subdomain) and every webhook's ``service.port`` the free port the controller binds on
127.0.0.1. Nothing is turned off: both webhooks run, TLS is verified with LWS's own CA.

The ClusterIP route is closed here (no kube-proxy), and the aggregator-routing one too: it resolves through
EndpointSlices, whose validation refuses loopback addresses (pkg/apis/discovery/validation).

The one thing a kubelet would do for the Deployment that a local process lacks is the Secret volume: the
rotator writes the certificate into Secret ``lws-webhook-server-cert`` and then waits for the files to
appear in its cert directory (cert-controller v0.16.0 rotator.go ensureCertsMounted). ``sync-certs``
copies them once; the rotator's certificates are valid for ten years, so no rotation happens while a local
cluster lives.

    python -m hack.testenv.lwsctl manifests --source M --webhook-port P > out.yaml
    python -m hack.testenv.lwsctl config --webhook-port P --health-port H --cert-dir D > config.yaml
    python -m hack.testenv.lwsctl sync-certs --kubectl K --kubeconfig C --cert-dir D [--timeout S]
    python -m hack.testenv.lwsctl check --kubectl K --kubeconfig C [--timeout S]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

NAMESPACE = "lws-system"
WEBHOOK_SERVICE = "lws-webhook-service"
CERT_SECRET = "lws-webhook-server-cert"
SERVICE_ACCOUNT = "lws-controller-manager"
CERT_FILES = ("ca.crt", "tls.crt", "tls.key")
WEBHOOK_HOST = "127.0.0.1"
# Kinds of the kustomize rendering cluster-up installs; the Deployment (and its ConfigMap) is replaced by the
# local process, the metrics Service selects nothing that runs.
KEPT_KINDS = {
    "CustomResourceDefinition", "Namespace", "ServiceAccount", "Role", "ClusterRole", "RoleBinding",
    "ClusterRoleBinding", "Secret", "Service", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
}


def _point_client_config(client_config: dict[str, Any], port: int) -> None:
    service = client_config.get("service")
    if isinstance(service, dict) and service.get("name") == WEBHOOK_SERVICE:
        service["port"] = port


def local_manifests(docs: Iterable[dict[str, Any] | None], webhook_port: int) -> list[dict[str, Any]]:
    """LWS's own manifests, made to work against a controller on 127.0.0.1:``webhook_port``."""
    out: list[dict[str, Any]] = []
    for doc in docs:
        if not doc or doc.get("kind") not in KEPT_KINDS:
            continue
        kind, name = doc["kind"], doc.get("metadata", {}).get("name")
        if kind == "Service":
            if name != WEBHOOK_SERVICE:
                continue
            doc["spec"] = {"type": "ExternalName", "externalName": WEBHOOK_HOST}
        elif kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for hook in doc.get("webhooks") or []:
                _point_client_config(hook.get("clientConfig") or {}, webhook_port)
        elif kind == "CustomResourceDefinition":
            webhook = ((doc.get("spec") or {}).get("conversion") or {}).get("webhook") or {}
            _point_client_config(webhook.get("clientConfig") or {}, webhook_port)
        out.append(doc)
    return out


def controller_config(webhook_port: int, health_port: int, cert_dir: str) -> dict[str, Any]:
    """The controller's Configuration (config.lws.x-k8s.io/v1alpha1): LWS's defaults from its own ConfigMap
    (internal certificates on), one replica so no leader election, every listener on loopback."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True},
        "webhook": {"host": WEBHOOK_HOST, "port": webhook_port, "certDir": cert_dir},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},  # "0" turns the metrics server off (controller-runtime)
    }


def cert_files(secret: dict[str, Any]) -> dict[str, bytes] | None:
    """The rotator's files from its Secret, or None while it has not written them all yet."""
    data = secret.get("data") or {}
    if not all(data.get(name) for name in CERT_FILES):
        return None
    return {name: base64.b64decode(data[name]) for name in CERT_FILES}


def write_cert_files(cert_dir: Path, files: dict[str, bytes]) -> None:
    cert_dir.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():  # the key before the certificate: the watcher reloads on tls.crt
        tmp = cert_dir / f".{name}.tmp"
        tmp.write_bytes(content)
        tmp.chmod(0o600)
        os.replace(tmp, cert_dir / name)


def _kubectl(kubectl: str, kubeconfig: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([kubectl, f"--kubeconfig={kubeconfig}", *args], input=stdin, capture_output=True,
                          text=True, timeout=60, check=False)


def sync_certs(kubectl: str, kubeconfig: str, cert_dir: Path, timeout_s: float) -> float:
    """Wait until the rotator filled its Secret, then write the files; returns the seconds waited."""
    start = time.monotonic()
    while True:
        done = _kubectl(kubectl, kubeconfig, "get", "secret", CERT_SECRET, "-n", NAMESPACE, "-o", "json")
        files = cert_files(json.loads(done.stdout)) if done.returncode == 0 else None
        if files:
            write_cert_files(cert_dir, files)
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise SystemExit(f"Secret {NAMESPACE}/{CERT_SECRET} got no certificate within {timeout_s:.0f}s "
                             f"(is lws-controller running? {done.stderr.strip()[-300:]})")
        time.sleep(0.5)


def probe_object(name: str, **rollout: int) -> dict[str, Any]:
    """A minimal LeaderWorkerSet for a server-side dry run (nothing is stored)."""
    obj: dict[str, Any] = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {"containers": [
            {"name": "c", "image": "registry.invalid/probe:1"}]}}}},
    }
    if rollout:
        obj["spec"]["rolloutStrategy"] = {"type": "RollingUpdate", "rollingUpdateConfiguration": rollout}
    return obj


def webhooks_answer(kubectl: str, kubeconfig: str) -> tuple[bool, str]:
    """Both webhooks work: the mutating one defaults networkConfig.subdomainPolicy (no CRD default does),
    the validating one refuses maxUnavailable 0 with maxSurge 0."""
    ok = _kubectl(kubectl, kubeconfig, "create", "--dry-run=server", "-o", "json", "-f", "-",
                  stdin=json.dumps(probe_object("lws-probe")))
    if ok.returncode != 0:
        return False, ok.stderr.strip()
    policy = ((json.loads(ok.stdout).get("spec") or {}).get("networkConfig") or {}).get("subdomainPolicy")
    if policy != "Shared":
        return False, f"the mutating webhook did not default spec.networkConfig.subdomainPolicy (got {policy!r})"
    bad = _kubectl(kubectl, kubeconfig, "create", "--dry-run=server", "-f", "-",
                   stdin=json.dumps(probe_object("lws-probe-bad", maxUnavailable=0, maxSurge=0)))
    if bad.returncode == 0 or "must not be 0 when `maxSurge` is 0" not in bad.stderr:
        return False, f"the validating webhook accepted maxUnavailable=0 with maxSurge=0: {bad.stderr.strip()}"
    return True, "defaulted and validated"


def check(kubectl: str, kubeconfig: str, timeout_s: float) -> float:
    start, last = time.monotonic(), ""
    while time.monotonic() - start < timeout_s:
        ok, last = webhooks_answer(kubectl, kubeconfig)
        if ok:
            return time.monotonic() - start
        time.sleep(0.5)
    raise SystemExit(f"the LeaderWorkerSet webhooks did not answer within {timeout_s:.0f}s: {last[-500:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lwsctl", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifests", help="filter and point LWS's kustomize output at the local controller")
    m.add_argument("--source", required=True)
    m.add_argument("--webhook-port", type=int, required=True)
    c = sub.add_parser("config", help="print the controller's Configuration file")
    c.add_argument("--webhook-port", type=int, required=True)
    c.add_argument("--health-port", type=int, required=True)
    c.add_argument("--cert-dir", required=True)
    for name, what in (("sync-certs", "copy the rotator's certificate into the cert dir"),
                       ("check", "wait until both webhooks answer")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--kubectl", required=True)
        p.add_argument("--kubeconfig", required=True)
        p.add_argument("--timeout", type=float, default=180)
        if name == "sync-certs":
            p.add_argument("--cert-dir", required=True)
    args = parser.parse_args(argv)
    if args.cmd == "manifests":  # 2.8 MB of CRD schemas: libyaml's parser when PyYAML has it (10x faster)
        loader, dumper = getattr(yaml, "CSafeLoader", yaml.SafeLoader), getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        with open(args.source, encoding="utf-8") as f:
            docs = local_manifests(yaml.load_all(f, Loader=loader), args.webhook_port)
        yaml.dump_all(docs, sys.stdout, Dumper=dumper, sort_keys=False)
    elif args.cmd == "config":
        yaml.safe_dump(controller_config(args.webhook_port, args.health_port, args.cert_dir), sys.stdout)
    elif args.cmd == "sync-certs":
        print(f"{sync_certs(args.kubectl, args.kubeconfig, Path(args.cert_dir), args.timeout):.1f}")
    else:
        print(f"{check(args.kubectl, args.kubeconfig, args.timeout):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

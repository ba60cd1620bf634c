"""Unit tests of the LWS wiring of the local cluster (hack/testenv/lwsctl.py) and its cluster DNS
(hack/testenv/podagent/dns.py): pure functions, plus the getent shim run by sh."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from hack.testenv import lwsctl
from hack.testenv.podagent.dns import HostsTable, getent_shim, pod_names

UPSTREAM = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: leaderworkersets.leaderworkerset.x-k8s.io}
spec:
  conversion:
    strategy: Webhook
    webhook: {clientConfig: {service: {name: lws-webhook-service, namespace: lws-system, path: /convert}}}
---
apiVersion: v1
kind: Service
metadata: {name: lws-webhook-service, namespace: lws-system}
spec: {ports: [{port: 443, targetPort: 9443}], selector: {control-plane: controller-manager}}
---
apiVersion: v1
kind: Service
metadata: {name: lws-controller-manager-metrics-service, namespace: lws-system}
spec: {ports: [{port: 8443}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: lws-controller-manager, namespace: lws-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: lws-manager-config, namespace: lws-system}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: lws-validating-webhook-configuration}
webhooks:
- name: vleaderworkerset.kb.io
  clientConfig: {service: {name: lws-webhook-service, namespace: lws-system, path: /validate}}
- name: other.example.com
  clientConfig: {service: {name: someone-else, namespace: x, path: /v}}
---
apiVersion: v1
kind: Secret
metadata: {name: lws-webhook-server-cert, namespace: lws-system}
"""


def test_local_manifests_route_every_lws_webhook_to_the_local_port() -> None:
    docs = lwsctl.local_manifests(yaml.safe_load_all(UPSTREAM), 41185)
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert ("Deployment", "lws-controller-manager") not in kinds
    assert ("ConfigMap", "lws-manager-config") not in kinds
    assert ("Service", "lws-controller-manager-metrics-service") not in kinds
    assert ("Secret", "lws-webhook-server-cert") in kinds
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"] == {"type": "ExternalName", "externalName": "127.0.0.1"}
    hooks = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")["webhooks"]
    assert hooks[0]["clientConfig"]["service"] == {"name": "lws-webhook-service", "namespace": "lws-system",
                                                   "path": "/validate", "port": 41185}
    assert "port" not in hooks[1]["clientConfig"]["service"]  # not LWS's: untouched
    crd = next(d for d in docs if d["kind"] == "CustomResourceDefinition")
    assert crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["port"] == 41185


def test_controller_config_keeps_lws_cert_management_and_listens_on_loopback_only() -> None:
    cfg = lwsctl.controller_config(41185, 41186, "/x/certs")
    assert cfg["internalCertManagement"] == {"enable": True}
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 41185, "certDir": "/x/certs"}
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:41186"
    assert cfg["leaderElection"] == {"leaderElect": False}


def test_cert_files_wait_for_every_file_then_decode_them(tmp_path: Path) -> None:
    enc = {name: base64.b64encode(name.encode()).decode() for name in lwsctl.CERT_FILES}
    assert lwsctl.cert_files({"data": {"ca.crt": enc["ca.crt"]}}) is None
    assert lwsctl.cert_files({}) is None
    files = lwsctl.cert_files({"data": enc})
    assert files == {name: name.encode() for name in lwsctl.CERT_FILES}
    lwsctl.write_cert_files(tmp_path / "certs", files)
    assert (tmp_path / "certs" / "tls.key").read_bytes() == b"tls.key"
    assert (tmp_path / "certs" / "tls.key").stat().st_mode & 0o077 == 0


def stateful_pod(name: str, hostname: str | None = None, subdomain: str | None = "mn") -> dict:
    spec = {"hostname": hostname or name, "subdomain": subdomain} if subdomain else {}
    return {"metadata": {"name": name, "namespace": "ns1"}, "spec": spec}


def test_pod_names_are_the_stateful_identity_forms_coredns_answers() -> None:
    assert pod_names(stateful_pod("mn-0-1")) == [
        "mn-0-1.mn.ns1.svc.cluster.local", "mn-0-1.mn.ns1.svc", "mn-0-1.mn.ns1"]
    assert pod_names(stateful_pod("plain", subdomain=None)) == []


def test_hosts_table_tracks_pods_and_the_getent_shim_answers_from_it(tmp_path: Path) -> None:
    table = HostsTable(tmp_path / "run" / "cluster-hosts")
    table.add("u1", "127.18.0.5", stateful_pod("mn-0"))
    table.add("u2", "127.18.0.6", stateful_pod("mn-0-1"))
    table.add("u3", "127.18.0.7", stateful_pod("plain", subdomain=None))  # no identity: no record
    shim = tmp_path / "getent"
    shim.write_text(getent_shim(table.path, None))
    shim.chmod(0o755)

    def getent(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([os.fspath(shim), *args], capture_output=True, text=True, check=False)

    assert getent("hosts", "mn-0-1.mn.ns1").stdout == "127.18.0.6 mn-0-1.mn.ns1\n"
    assert getent("ahostsv4", "mn-0.mn.ns1.svc.cluster.local").stdout.split()[0] == "127.18.0.5"
    assert getent("hosts", "mn-0.mn.other").returncode == 2  # unknown, and no host getent to ask
    table.remove("u1")
    assert getent("hosts", "mn-0.mn.ns1").returncode == 2
    assert table.path.read_text() == "127.18.0.6 mn-0-1.mn.ns1.svc.cluster.local mn-0-1.mn.ns1.svc mn-0-1.mn.ns1\n"


@pytest.mark.skipif(not Path("/usr/bin/getent").exists(), reason="no host getent")
def test_getent_shim_hands_other_lookups_to_the_host_getent(tmp_path: Path) -> None:
    table = HostsTable(tmp_path / "hosts")
    shim = tmp_path / "getent"
    shim.write_text(getent_shim(table.path, "/usr/bin/getent"))
    shim.chmod(0o755)
    done = subprocess.run([os.fspath(shim), "hosts", "localhost"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "localhost" in done.stdout

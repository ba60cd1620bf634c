"""Build and serving pods are locked down, take only HF_TOKEN from the Secret, drain before they stop,
keep a PodDisruptionBudget, and never leak credentials or fetch arbitrary URLs (issue 13, item 7)."""

from __future__ import annotations

import socket
from datetime import datetime, timezone

import pytest

from kvpilot.api.status import status_dict
from kvpilot.api.metrics_url import resolved_problem, url_problem
from kvpilot.desired.observed import JobState, Observed
from kvpilot.desired.plan import plan
from kvpilot.desired.settings import Settings
from kvpilot.desired.redact import MASK, redact
from kvpilot.api.models import InferenceEngine, ObjectRef
from tests.unit.helpers import engine, manifest, spec_of

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
BACKENDS = ("tensorrt", "pytorch", "simulated")


def pods(backend: str, **overrides):
    """(pod spec of the build Job or None, pod spec of the Deployment, the plan)."""
    overrides.setdefault("model__credentialsSecretRef", {"name": "hf"})
    doc = manifest(backend, **overrides)
    if doc["spec"]["model"]["source"].startswith("s3://"):
        doc["spec"]["model"].pop("revision", None)
    e = InferenceEngine(ObjectRef("e1", "ns", "uid-1", 1), spec_of(doc))
    p = plan(e, Observed(claim_phase="Bound"), Settings(), NOW)
    job = p.build_job["spec"]["template"]["spec"] if p.build_job else None
    dep = next((o for o in p.apply if o["kind"] == "Deployment"), None)
    if dep is None:  # engines that build serve once the Job succeeded
        ok = JobState(name=p.build_job["metadata"]["name"], active=False, succeeded=True, failed=False,
                      completion_time="2026-11-29T12:10:00Z", owner_uids=("uid-1",))
        p2 = plan(e, Observed(status=p.status, claim_phase="Bound", job=ok), Settings(), NOW)
        dep = next(o for o in p2.apply if o["kind"] == "Deployment")
        p = p2
    return job, dep["spec"]["template"]["spec"], p


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_pod_is_locked_down(backend: str) -> None:
    job, serve, _ = pods(backend)
    for spec in (s for s in (job, serve) if s is not None):
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert "envFrom" not in c, c["name"]


def test_simulated_pods_run_as_kvsims_user_and_release_images_stay_root_unless_overridden() -> None:
    _, serve, _ = pods("simulated")
    assert serve["securityContext"]["runAsNonRoot"] is True and serve["securityContext"]["runAsUser"] == 10001
    job, serve, _ = pods("tensorrt")
    assert "runAsUser" not in serve["securityContext"] and "runAsNonRoot" not in job["securityContext"]
    job, serve, _ = pods("tensorrt", runtime__runAsUser=1000)
    for spec in (job, serve):
        ctx = spec["securityContext"]
        assert (ctx["runAsNonRoot"], ctx["runAsUser"], ctx["runAsGroup"], ctx["fsGroup"]) == (True, 1000, 1000, 1000)


def test_only_hf_token_comes_from_the_secret() -> None:
    job, _, _ = pods("tensorrt")
    env = {e["name"]: e for e in job["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "HF_TOKEN"}
    assert [e["name"] for e in job["containers"][0]["env"] if "valueFrom" in e] == ["HF_TOKEN"]
    job, serve, _ = pods("pytorch")  # with an engine cache, the prepare Job downloads the checkpoint once
    assert [e["name"] for e in job["containers"][0]["env"] if "valueFrom" in e] == ["HF_TOKEN"]
    assert not [e for e in serve["containers"][0].get("env", []) if "valueFrom" in e]
    _, serve, _ = pods("pytorch", engineCache=None)  # without one, each pod downloads it when it serves
    assert [e["name"] for e in serve["containers"][0]["env"] if "valueFrom" in e] == ["HF_TOKEN"]
    _, serve, _ = pods("simulated")  # serving a built engine needs no credentials
    assert not [e for e in serve["containers"][0].get("env", []) if "valueFrom" in e]


def test_s3_sync_gets_only_the_aws_keys() -> None:
    job, _, _ = pods("tensorrt", model__source="s3://bucket/llama")
    init = job["initContainers"][0]
    assert {e["name"] for e in init["env"]} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                                "AWS_REGION"}
    assert not [e for e in job["containers"][0].get("env", []) if "valueFrom" in e]  # s3 needs no HF_TOKEN


def test_serving_pods_drain_and_probe_liveness_apart_from_readiness() -> None:
    _, serve, _ = pods("tensorrt")
    c = serve["containers"][0]
    assert c["readinessProbe"]["httpGet"] != c["livenessProbe"]["httpGet"]
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep" and sleep >= 5
    assert serve["terminationGracePeriodSeconds"] > sleep + 60  # room for in-flight requests after the delay
    assert c["resources"]["requests"]["ephemeral-storage"]


def test_a_user_ephemeral_storage_limit_is_not_contradicted_by_the_default_request() -> None:
    _, serve, _ = pods("tensorrt", serving__resources={"limits": {"ephemeral-storage": "500Mi"}})
    res = serve["containers"][0]["resources"]
    assert res["limits"]["ephemeral-storage"] == "500Mi" and "ephemeral-storage" not in res["requests"]


@pytest.mark.parametrize("replicas,expected", [(1, False), (2, True), (5, True)])
def test_a_pdb_guards_multi_replica_serving(replicas: int, expected: bool) -> None:
    _, _, p = pods("simulated", serving__replicas=replicas)
    pdbs = [o for o in p.apply if o["kind"] == "PodDisruptionBudget"]
    assert bool(pdbs) is expected
    if expected:
        dep = next(o for o in p.apply if o["kind"] == "Deployment")
        assert pdbs[0]["spec"]["selector"] == dep["spec"]["selector"] and pdbs[0]["spec"]["maxUnavailable"] == 1
        assert pdbs[0]["metadata"]["ownerReferences"][0]["controller"] is True


SECRETS = [
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl",
    "AKIAIOSFODNN7EXAMPLE",
    "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "https://user:pa55word@huggingface.co/x",
    "ghp_0123456789abcdefghijABCDEFGHIJ012345",
    "password: hunter2hunter2",
    "Zx81kQ2mLp0vR7tY3wE9uI4oP6aS5dF1gH",  # generic long mixed secret
]


@pytest.mark.parametrize("secret", SECRETS)
def test_token_like_strings_are_redacted(secret: str) -> None:
    out = redact(f"Traceback...\n  requests.exceptions: 401 for {secret} while downloading\n")
    assert MASK in out
    leaked = secret.split()[-1].split("=")[-1].split(":")[-1].split("@")[0]
    assert leaked not in out, out


def test_redaction_keeps_what_a_reader_needs() -> None:
    text = ("kvpilot: engine 918928f8db44fd062363b4f6ef4123128adb015d4912670f666eb9a0d668aab6\n"
            "trtllm-build --max_num_tokens 8192 --checkpoint_dir /engines/.staging/abc/checkpoint\n"
            "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert redact(text) == text


def test_a_failed_builds_log_tail_is_redacted_in_status_conditions_and_events() -> None:
    e = engine("tensorrt", model__credentialsSecretRef={"name": "hf"})
    first = plan(e, Observed(claim_phase="Bound"), Settings(), NOW)
    token = "hf_SeCrEtToKeN0123456789abcdefXYZ"
    failed = JobState(name=first.build_job["metadata"]["name"], active=False, succeeded=False, failed=True,
                      message=f"HTTPError: 401 Unauthorized, Authorization: Bearer {token}\nHF_TOKEN={token}")
    p = plan(e, Observed(status=first.status, claim_phase="Bound", job=failed), Settings(), NOW)
    seen = [status_dict(p.status)["build"]["message"]] + [c["message"] for c in status_dict(p.status)["conditions"]] + \
        [ev.message for ev in p.events]
    assert any("401 Unauthorized" in s for s in seen)
    assert not [s for s in seen if token in s]


@pytest.mark.parametrize("url", [
    "http://prometheus.monitoring.svc:9090",
    "https://prometheus-operated.monitoring.svc.cluster.local:9090/prom",
    "http://thanos-query.observability.svc",
])
def test_cluster_local_metrics_urls_are_accepted(url: str) -> None:
    assert url_problem(url) is None


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data", "http://[fe80::1]/", "http://metadata.google.internal/",
    "https://example.com/", "http://127.0.0.1:9090", "http://user:pw@prom.monitoring.svc/", "ftp://prom.ns.svc/",
    "http://prom.monitoring.svc:9090/\n", "http://prom.monitoring.svc/?q=1", "http://localhost:9090",
])
def test_other_metrics_urls_are_refused(url: str) -> None:
    assert url_problem(url)


@pytest.mark.parametrize("address", ["169.254.169.254", "127.0.0.1", "::1", "fe80::1", "0.0.0.0", "::ffff:169.254.1.1",
                                     "100.100.100.200"])
def test_a_service_name_resolving_to_metadata_or_loopback_is_refused(address: str) -> None:
    def resolve(host, port, proto=0):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    problem = resolved_problem("http://evil.ns.svc:9090", resolve=resolve)
    assert problem and address.split("%")[0].replace("::ffff:", "") in problem


def test_a_service_name_resolving_to_a_cluster_ip_is_accepted() -> None:
    def resolve(host, port, proto=0):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.96.12.7", port))]

    assert resolved_problem("http://prometheus.monitoring.svc:9090", resolve=resolve) is None


def test_replicas_prefer_different_nodes_and_scaling_does_not_roll_the_pods() -> None:
    _, one, _ = pods("simulated", serving__replicas=1)
    _, three, _ = pods("simulated", serving__replicas=3)
    assert one == three  # the scale subresource changes replicas only, never the pod template
    term = one["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"

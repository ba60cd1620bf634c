"""The operator Deployment as rendered: Pod Security "restricted", probes, command line, one replica."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from chart_helpers import (
    CHART_DIR,
    RELEASE_NAMESPACE,
    Manifest,
    objects_of_kind,
    only_object,
)
from chart_policies import pod_specs

CHART_META = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
APP_VERSION = str(CHART_META["appVersion"])


def operator_container(objects: list[Manifest]) -> dict[str, Any]:
    deployment = only_object(objects, "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def flag_values(args: list[str], flag: str) -> list[str]:
    """The values that follow each occurrence of `flag` (e.g. every --namespace NS)."""
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == flag]


def test_every_container_has_a_read_only_root(variant_objects: list[Manifest]) -> None:
    """Our own rule on top of Pod Security "restricted" (which the API server's admission checks on every
    variant in test_chart_install_e2e.py): the image is never writable at run time."""
    specs = pod_specs(variant_objects)
    assert specs, "the chart must render the operator's pod"
    for where, spec in specs:
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            assert (container.get("securityContext") or {}).get("readOnlyRootFilesystem") is True, \
                f"{where} {container['name']}"


def test_root_filesystem_is_read_only_with_a_writable_tmp(render) -> None:
    spec = only_object(render(), "Deployment")["spec"]["template"]["spec"]
    tmp_volumes = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    assert mounts.get("/tmp") in tmp_volumes, "an emptyDir must be mounted at /tmp"
    assert spec["securityContext"]["runAsUser"] != 0


def test_probes_hit_healthz_on_the_health_port(variant_objects: list[Manifest]) -> None:
    container = operator_container(variant_objects)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    health_port = int(flag_values(container["args"], "--health-port")[0])
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/healthz", probe
        port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        assert port == health_port == 8081, probe


def test_metrics_port_matches_the_flag_and_the_service(render) -> None:
    objects = render()
    container = operator_container(objects)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(flag_values(container["args"], "--metrics-port")[0]) == 8080
    service = only_object(objects, "Service")
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in ("metrics", 8080)
    pod_labels = only_object(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items(), "the metrics Service must select the operator pod"


def test_cluster_wide_command_line(render) -> None:
    container = operator_container(render())
    args = container["args"]
    assert container["command"] == ["kvpilot"]
    assert args[0] == "run"
    assert "--all-namespaces" in args
    assert "--namespace" not in args
    assert flag_values(args, "--kvsim-image") == [f"ghcr.io/kvpilot/kvsim:{APP_VERSION}"]
    assert flag_values(args, "--log-format") == ["json"]
    assert flag_values(args, "--resync-seconds") == ["30"]


def test_namespaced_command_line_carries_each_namespace_once(render) -> None:
    args = operator_container(render({"watchNamespaces": ["team-b", "team-a", "team-b"]}))["args"]
    assert sorted(flag_values(args, "--namespace")) == ["team-a", "team-b"]
    assert "--all-namespaces" not in args


def test_values_reach_the_command_line(render) -> None:
    values = {"logFormat": "plain", "resyncSeconds": 7, "kvsimImage": {"repository": "reg.example/kvsim", "tag": "t1"}}
    args = operator_container(render(values))["args"]
    assert flag_values(args, "--log-format") == ["plain"]
    assert flag_values(args, "--resync-seconds") == ["7"]
    assert flag_values(args, "--kvsim-image") == ["reg.example/kvsim:t1"]


def test_image_defaults_to_app_version_and_a_digest_wins(render) -> None:
    assert operator_container(render())["image"] == f"ghcr.io/kvpilot/kvpilot:{APP_VERSION}"
    digest = "sha256:" + "a" * 64
    assert operator_container(render({"image": {"digest": digest}}))["image"] == f"ghcr.io/kvpilot/kvpilot@{digest}"


def test_one_replica_recreated_not_rolled(variant_objects: list[Manifest]) -> None:
    spec = only_object(variant_objects, "Deployment")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("replicas", [0, 2])
def test_other_replica_counts_are_refused(render_result, replicas: int) -> None:
    result = render_result({"replicaCount": replicas})
    assert result.returncode != 0
    assert "replicaCount" in result.stderr


def test_resources_have_requests_and_limits(render) -> None:
    resources = operator_container(render())["resources"]
    for section in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[section]), section


def test_runs_as_the_chart_service_account(render) -> None:
    objects = render()
    account = only_object(objects, "ServiceAccount")
    assert account["metadata"]["namespace"] == RELEASE_NAMESPACE
    pod = only_object(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def test_existing_service_account_is_used_and_not_created(render) -> None:
    objects = render({"serviceAccount": {"create": False, "name": "platform-operator"}})
    assert objects_of_kind(objects, "ServiceAccount") == []
    pod = only_object(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-operator"
    subjects = [s for b in objects_of_kind(objects, "ClusterRoleBinding") for s in b["subjects"]]
    assert {"kind": "ServiceAccount", "name": "platform-operator", "namespace": RELEASE_NAMESPACE} in subjects


def test_scheduling_values_reach_the_pod(render) -> None:
    values = {
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "podAnnotations": {"example.com/team": "ml"},
        "priorityClassName": "system-cluster-critical",
    }
    template = only_object(render(values), "Deployment")["spec"]["template"]
    assert template["spec"]["nodeSelector"] == values["nodeSelector"]
    assert template["spec"]["tolerations"] == values["tolerations"]
    assert template["spec"]["priorityClassName"] == "system-cluster-critical"
    assert template["metadata"]["annotations"] == values["podAnnotations"]


def test_the_operator_cli_accepts_the_rendered_command_line(variant_objects: list[Manifest]) -> None:
    """The chart and `kvpilot run` must agree on every flag: parse the rendered args with the real parser."""
    cli = pytest.importorskip("kvpilot.cli", reason="the kvpilot package is not installed")
    args = operator_container(variant_objects)["args"]
    parsed = cli.build_parser().parse_args(args)
    assert parsed.command == "run"
    namespaces = flag_values(args, "--namespace")
    assert list(parsed.namespace) == namespaces
    assert parsed.all_namespaces is (not namespaces)
    assert parsed.metrics_port == 8080 and parsed.health_port == 8081
    assert parsed.log_format == "json"

"""The engine NetworkPolicy: off by default; when on, one per engine namespace, selecting the serving
pods and admitting only the operator's pods and the namespaces the user names (issue 13, item 7)."""

from __future__ import annotations

from chart_helpers import RELEASE_NAMESPACE, objects_of_kind, only_object


def test_no_network_policy_by_default(render) -> None:
    assert objects_of_kind(render(), "NetworkPolicy") == []


def test_one_policy_per_engine_namespace_admitting_the_operator_and_named_namespaces(render) -> None:
    objects = render({"engineNetworkPolicy": {"enabled": True, "namespaces": ["team-b", "team-a"],
                                              "allowSameNamespace": False, "allowFromNamespaces": ["gateway"]}})
    everything = objects_of_kind(objects, "NetworkPolicy")
    policies = [p for p in everything if p["metadata"]["name"].endswith("-engines")]
    builds = [p for p in everything if p["metadata"]["name"].endswith("-builds")]
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]
    assert sorted(p["metadata"]["namespace"] for p in builds) == ["team-a", "team-b"]
    for policy in builds:  # nothing connects to a build pod: all ingress denied
        assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "build"
        assert policy["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in policy["spec"]
    operator_pod = only_object(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for policy in policies:
        spec = policy["spec"]
        assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "kvpilot",
                                                      "app.kubernetes.io/component": "server"}
        assert spec["policyTypes"] == ["Ingress"]
        sources = [peer for rule in spec["ingress"] for peer in rule["from"]]
        operator, gateway = sources
        assert operator["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": RELEASE_NAMESPACE}
        assert operator["podSelector"]["matchLabels"].items() <= operator_pod.items()
        assert gateway == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}


def test_policy_defaults_to_watched_namespaces_and_admits_the_engines_own_namespace(render) -> None:
    objects = render({"watchNamespaces": ["ml"], "engineNetworkPolicy": {"enabled": True}})
    (policy,) = [p for p in objects_of_kind(objects, "NetworkPolicy") if p["metadata"]["name"].endswith("-engines")]
    assert policy["metadata"]["namespace"] == "ml"
    assert {"podSelector": {}} in [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]


def test_the_operator_policy_admits_only_its_metrics_port(render) -> None:
    objects = render({"networkPolicy": {"enabled": True, "metricsFromNamespaces": ["monitoring"]}})
    policy = only_object(objects, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == RELEASE_NAMESPACE
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def test_policy_without_any_namespace_is_refused(render_result) -> None:
    result = render_result({"engineNetworkPolicy": {"enabled": True}})
    assert result.returncode != 0 and "engineNetworkPolicy.namespaces" in result.stderr

"""Unit tests of hack/testenv/cluster.py's waits and liveness, with kubectl and the pid files faked: no cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack.testenv import cluster

ACCESSOR = "error: .status.conditions accessor error: <nil> is of the type <nil>, expected []interface{}\n"


class FakeKubectl:
    """Answers `kubectl wait` with the given stderr texts in turn ('' = success), recording each call."""

    def __init__(self, answers: list[str]) -> None:
        self.answers: list[str] = list(answers)
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str, **_kw: object) -> str:
        self.calls.append(args)
        err = self.answers.pop(0)
        if err:
            raise cluster.CommandError(["kubectl", *args], 1, "", err)
        return ""


def test_a_wait_on_an_object_without_conditions_yet_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeKubectl([ACCESSOR, ACCESSOR, ""])
    monkeypatch.setattr(cluster, "kubectl", fake)
    monkeypatch.setattr(cluster.time, "sleep", lambda _s: None)
    cluster.wait_condition("crd/leaderworkersets.leaderworkerset.x-k8s.io", "Established", timeout_s=60)
    assert len(fake.calls) == 3
    assert all("--for=condition=Established" in c and "crd/leaderworkersets.leaderworkerset.x-k8s.io" in c
               for c in fake.calls)


def test_any_other_wait_failure_is_raised_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeKubectl(['error: timed out waiting for the condition on inferenceengines/sim\n', ""])
    monkeypatch.setattr(cluster, "kubectl", fake)
    with pytest.raises(cluster.CommandError, match="timed out"):
        cluster.wait_condition("ie/sim", "Available", namespace="ns1", timeout_s=60)
    assert len(fake.calls) == 1
    assert fake.calls[0][:5] == ("wait", "--for=condition=Available", "ie/sim", "-n", "ns1")
    assert fake.calls[0][5] in ("--timeout=59s", "--timeout=60s")


def test_the_retries_stop_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(t) for t in range(0, 1000, 20))
    monkeypatch.setattr(cluster.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(cluster.time, "sleep", lambda _s: None)
    fake = FakeKubectl([ACCESSOR] * 50)
    monkeypatch.setattr(cluster, "kubectl", fake)
    with pytest.raises(cluster.CommandError, match="accessor error"):
        cluster.wait_condition("crd/x", "Established", timeout_s=60)
    assert 2 <= len(fake.calls) <= 4


def test_a_cluster_whose_lws_controller_died_is_not_live(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """cluster-up registers LWS's webhooks before it starts the controller: without it every LeaderWorkerSet create
    is refused, so the cluster must read as not up and cluster-up.sh run again (CI's cold machine, 2026-12-04)."""
    (tmp_path / "kubeconfig").write_text("")
    monkeypatch.setattr(cluster, "kubeconfig_path", lambda: tmp_path / "kubeconfig")
    monkeypatch.setattr(cluster, "bin_dir", lambda: tmp_path)
    (tmp_path / "kubectl").write_text("")
    monkeypatch.setattr(cluster, "kubectl", lambda *_a, **_k: "ok")
    running = {"localkubelet"}
    monkeypatch.setattr(cluster, "_pid_alive", lambda name: name in running)
    monkeypatch.delenv("TESTENV_LWS", raising=False)
    assert not cluster.is_live()
    running.add("lws-controller")
    assert cluster.is_live()
    running.discard("lws-controller")
    monkeypatch.setenv("TESTENV_LWS", "0")
    assert cluster.is_live(), "a cluster started without LWS needs no controller"


def test_a_hung_kubectl_is_a_command_error_naming_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    def hung(*args: str, **_kw: object) -> str:
        raise cluster.subprocess.TimeoutExpired(["kubectl", *args], 90)

    monkeypatch.setattr(cluster, "kubectl", hung)
    with pytest.raises(cluster.CommandError, match="did not return") as err:
        cluster.wait_condition("ie/sim", "Available", namespace="ns1", timeout_s=60)
    assert "ie/sim" in " ".join(err.value.argv) and "--for=condition=Available" in err.value.argv

"""Fixtures for the local control plane's own tests (hack/testenv).

`testenv_cluster` (session) makes sure the local cluster runs: if `.testenv/kubeconfig` does not answer,
it runs cluster-up.sh (which starts only what is missing). When the binaries were never built it skips
with the command to run, since a cold build takes minutes (`make cluster-build`, or `make test` does it).
Each e2e test gets a fresh namespace (`ns`), deleted afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.testenv import cluster


@pytest.fixture(scope="session")
def testenv_cluster() -> Path:
    """The admin kubeconfig of a running local cluster."""
    missing = [b for b in ("etcd", "kube-apiserver", "kwok", "kubectl") if not (cluster.bin_dir() / b).exists()]
    if missing and not cluster.is_live():
        pytest.skip(f"local control plane not built ({', '.join(missing)} missing): run `make cluster-build`")
    return cluster.ensure_cluster_up(build=False)


@pytest.fixture
def ns(testenv_cluster: Path) -> Iterator[str]:
    """A fresh namespace for one test; deleted (without waiting) afterwards."""
    name = f"te-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)

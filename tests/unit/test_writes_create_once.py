"""ChildWriter.create_once: an object the operator may create but never read (a multi-node engine's SSH Secret)
is created at most once per engine and operator process; an existing one (409) counts as created."""

from __future__ import annotations

import asyncio

from kvpilot.api.models import ObjectRef
from kvpilot.desired.once import CreateOnce
from kvpilot.k8s.errors import Conflict
from tests.unit.test_reconcile_cache import FakeApi

OWNER = ObjectRef("mn", "ns", uid="u1")
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "mn-ssh", "namespace": "ns"}, "data": {}}
RENDERS: list[int] = []


def render() -> dict:
    RENDERS.append(1)
    return SECRET


ONCE = CreateOnce("Secret", "ns", "mn-ssh", render)


def test_created_once_then_never_again_and_not_cached() -> None:
    RENDERS.clear()
    api = FakeApi()
    assert asyncio.run(api.writer.create_once(OWNER, ONCE)) is True
    assert asyncio.run(api.writer.create_once(OWNER, ONCE)) is False
    assert api.writes == [("create", "Secret", "mn-ssh")]
    assert api.cache.get("Secret", "ns", "mn-ssh") is None  # the operator keeps no Secret
    assert len(RENDERS) == 1  # rendered only for the create


def test_an_existing_object_counts_as_created() -> None:
    api = FakeApi()
    api.fail[("create", "Secret")] = Conflict("HTTP 409: already exists")
    assert asyncio.run(api.writer.create_once(OWNER, ONCE)) is False
    del api.fail[("create", "Secret")]
    assert asyncio.run(api.writer.create_once(OWNER, ONCE)) is False
    assert api.writes == [("create", "Secret", "mn-ssh")]

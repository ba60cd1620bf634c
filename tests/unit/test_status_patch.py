"""The status merge patch removes what the plan stopped writing and sends nothing when nothing changed."""

from __future__ import annotations

from kvpilot.reconcile import status_patch


def test_removed_keys_become_null_and_unchanged_ones_are_left_out() -> None:
    old = {"engine": {"fingerprint": "a", "maxBatchSize": 512}, "build": {"state": "Succeeded"}, "replicas": 1}
    new = {"engine": {"fingerprint": "b"}, "replicas": 1}
    assert status_patch(old, new) == {"engine": {"fingerprint": "b", "maxBatchSize": None}, "build": None}


def test_lists_are_replaced_whole_and_an_identical_status_needs_no_patch() -> None:
    old = {"conditions": [{"type": "Available", "status": "False"}]}
    new = {"conditions": [{"type": "Available", "status": "True"}]}
    assert status_patch(old, new) == new
    assert status_patch(new, new) == {}

"""Fixtures for the kvsim tests."""

from __future__ import annotations

import pytest
from kvsim.engine import Engine

from .helpers import small_config


@pytest.fixture
def make_engine():
    """Build a small engine (see helpers.small_config) with keyword overrides."""

    def factory(**overrides) -> Engine:
        return Engine(small_config(**overrides), epoch_s=0.0)

    return factory

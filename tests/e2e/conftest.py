"""End-to-end tests start real processes; select them with `-m e2e`."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end to end against real `bait serve` / `bait worker` processes")

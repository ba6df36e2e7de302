"""The real Label Studio end-to-end test runs only when asked for: `make test-labelstudio`
(`pytest -m labelstudio tests/labelstudio`); any other run deselects it (it needs .labelstudio-venv)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "labelstudio" in (config.option.markexpr or ""):
        return
    chosen = [i for i in items if i.get_closest_marker("labelstudio") is None]
    dropped = [i for i in items if i.get_closest_marker("labelstudio") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = chosen

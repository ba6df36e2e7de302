"""Fixtures shared by the worker tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.worker.test_distributed import Cluster, start_cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A real ``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1, killed afterwards."""
    c = start_cluster(tmp_path)
    yield c
    for p in [*c.workers, c.scheduler]:
        c.stop(p, signal.SIGKILL)

"""A `dask worker --preload` module for tests/worker/test_distributed.py: every shard task of the pool store
takes 0.6 s longer, so a test can kill a worker while tasks run. Never loaded outside that test."""

from __future__ import annotations

import time
from typing import Any

from worker import distributed

_shard_task = distributed.shard_task


def _slow_shard_task(*args: Any, **kwargs: Any) -> dict[str, Any]:
    time.sleep(0.6)
    return _shard_task(*args, **kwargs)


distributed.shard_task = _slow_shard_task  # type: ignore[assignment]

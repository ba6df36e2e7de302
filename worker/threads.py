"""Torch threads for a job's small work: head training, forward passes, validation.

A head trains on a few hundred labeled rows in minibatches of tens: every op is tiny, and torch's
OpenMP pool costs more than it gains. On the 2-core CI machine, with the api, a worker and the
machine's other load sharing the cores, a 26-class MLP head on 260 rows of 128-d trained in 8-12 s
with 2 intra-op threads against 0.5 s with one (the same head, same seed; `bench/service_many_classes.py`
shows the train stage). The spinning OpenMP workers are what an oversubscribed machine punishes.

So a job runs that work on ``BAIT_JOB_THREADS`` threads (default 1) and restores the process's setting
afterwards; the selection itself (exact BAIT's chunk workers, the baselines' pool GEMMs) keeps its own.
:func:`warm_up` pays torch's one-time costs of a first training (lazy initialisation of autograd, the
optimizer and the kernels: ~3 s of a first 26-class batch here) when a runner starts, not in the first
user's batch, and measures the BAIT cost model's rates of this machine and device
(:func:`selection.calibrate.warm`), so a first batch's time budget is planned on measured rates without
paying for the measurement.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch

from selection import calibrate, fused
from selection.bait.threads import resolve_threads
from selection.heads import HeadConfig, predict, train_head
from selection.linalg import torch_threads

log = logging.getLogger(__name__)

_warm_lock = threading.Lock()
_warmed = False


def warm_up(threads: int = 1, device: str = "cpu") -> float:
    """Train and run a tiny head once per process (CPU), load BAIT's compiled step, and measure the cost
    model's rates on ``device`` for float32 and float64 pools, so a first batch pays neither torch's
    start-up, nor numba's, nor the rates' measurement.

    Returns the seconds spent (0.0 when this process already warmed up).
    """
    global _warmed
    with _warm_lock:
        if _warmed:
            return 0.0
        t = time.perf_counter()
        rng = np.random.default_rng(0)
        X = rng.standard_normal((64, 8)).astype(np.float32)
        y = np.arange(64) % 3
        with torch_threads(threads):
            for kind in ("mlp", "linear"):
                config = HeadConfig(input_dim=8, n_outputs=3, kind=kind, task="classification", max_epochs=3)
                predict(train_head(config, X, y, device="cpu", seed=0), X)
        fused.warm_up()  # BAIT's compiled step: compiled on a first run, else loaded from numba's cache
        dev = torch.device(device)
        for dtype in (torch.float32, torch.float64):
            calibrate.warm(dev, dtype, resolve_threads(dev))
        _warmed = True
        seconds = time.perf_counter() - t
        log.info("warmed up head training in %.2f s", seconds)
        return seconds

"""Child processes for untrusted TorchScript: the environment they get and how they are started.

Uploaded encoders are checked (:mod:`worker.torchscript_check`, launched by the API at upload) and
run (:mod:`worker.encoder_child`, launched by workers) in child processes of ``sys.executable`` that

- get a minimal environment: no ``BAIT_*`` variable (no secret key, no database or Redis URL), no
  proxy or cloud credentials, only what Python, torch and the thread pools need, ``HOME``/``TMPDIR``
  pointing at a fresh temporary folder;
- start in that temporary folder (the embedded database and secret-key file are not relative to it);
- hold no descriptor of their parent but the pipes they talk through (``close_fds``);
- cap their own address space (``RLIMIT_AS``) and CPU time (``RLIMIT_CPU``) before they import torch
  or load a module; the parent adds a wall-clock limit and kills the process group.

This module never imports torch: the API process only spawns the check; spawning is not importing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# What a child may inherit: interpreter and library plumbing only, never credentials.
PASSED_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_HOME",
)
# The folder that holds the `service` and `worker` packages (a source checkout or site-packages).
PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


def child_env(workdir: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a sandboxed child (nothing else from ours is passed on)."""
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update(
        HOME=workdir,
        TMPDIR=workdir,
        PYTHONPATH=PACKAGE_ROOT,
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        # torch must not reach for the network or a hub cache either
        HF_HUB_OFFLINE="1",
        TORCH_HOME=workdir,
    )
    env.update(extra or {})
    return env


def child_command(module: str, *args: str) -> list[str]:
    """``python -I``-like command running ``module``; ``-I`` is not used because it drops PYTHONPATH."""
    return [sys.executable, "-s", "-m", module, *args]

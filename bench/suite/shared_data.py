"""The offline datasets of ``shared/data`` (``.npz`` files): where they are and how one is read.

Used by the suite's builders (:mod:`bench.suite.registry`) and by the paper's experiments.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """Folder of the offline datasets: ``$BAIT_DATA_DIR``, else ``shared/data`` in or next to the repo.

    Raises:
        FileNotFoundError: none of them holds ``mnist10k.npz``.
    """
    candidates = [REPO_ROOT / "shared" / "data", REPO_ROOT.parent / "shared" / "data"]
    env = os.environ.get("BAIT_DATA_DIR")
    if env:
        candidates.insert(0, Path(env))
    for path in candidates:
        if (path / "mnist10k.npz").is_file():
            return path
    raise FileNotFoundError(f"offline datasets not found in {[str(p) for p in candidates]}; set BAIT_DATA_DIR")


def load_npz(name: str) -> dict[str, np.ndarray]:
    """All arrays of ``<data_dir>/<name>`` (no pickles)."""
    with np.load(data_dir() / name, allow_pickle=False) as f:
        return {k: f[k] for k in f.files if k != "README"}

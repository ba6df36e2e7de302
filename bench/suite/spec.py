"""The dataset types of the suite (see :mod:`bench.suite`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

Task = Literal["binary", "multiclass", "regression"]
Modality = Literal["tabular", "image", "text"]
Half = Literal["tune", "heldout"]

#: Bumped when a converter changes what it writes; a cached file of another version is rebuilt.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class DatasetSpec:
    """What a dataset is, before it is fetched.

    Attributes:
        name: registry key (``"fine-foods"``).
        task: ``binary``, ``multiclass`` or ``regression``.
        modality: ``tabular``, ``image`` or ``text`` (text: MiniLM embeddings).
        half: ``tune`` (choose defaults on it) or ``heldout`` (evaluate them on it).
        source: where it comes from (package, file), one line.
        description: what is predicted from what, and how it was cut.
    """

    name: str
    task: Task
    modality: Modality
    half: Half
    source: str
    description: str


@dataclass
class Dataset:
    """A converted dataset: fixed train/test split (see the module docstring for the conventions)."""

    spec: DatasetSpec
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list[str] | None

    @property
    def n_outputs(self) -> int:
        """Classes ``k`` (classification) or regression outputs ``m``."""
        if self.classes is not None:
            return len(self.classes)
        return int(self.y_train.shape[1])


class DatasetNotCached(FileNotFoundError):
    """The dataset has not been converted into the cache yet; the message names the command that does."""


class DatasetFetchError(RuntimeError):
    """A dataset's source could not be obtained or converted (e.g. ``apt-get download`` failed)."""


def cache_dir() -> Path:
    """Where converted datasets live: ``$BAIT_DATASETS_DIR``, else ``~/.cache/bait-datasets``."""
    env = os.environ.get("BAIT_DATASETS_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bait-datasets"

"""The validated selection problem handed to every strategy, and the registry of strategies.

`selection.api.select` converts and validates the user's arrays into a :class:`Problem`, then calls
the registered strategy function as ``fn(problem, **params)``. A strategy function declares its
parameters as keyword-only arguments with defaults; the API rejects any parameter that is not in the
signature. Strategies register themselves with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

Task = Literal["classification", "regression"]
ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class Problem:
    """A validated pool, on the caller's device and dtype.

    Attributes:
        X: ``n x d`` embeddings of every pool row (labeled, reserved and candidate rows).
        probs: ``n x k`` class probabilities (rows sum to 1), or ``None`` for regression.
        labeled: ``(n_L,)`` int64 sorted row indices already labeled.
        reserved: ``(n_R,)`` int64 sorted row indices reserved by earlier batches (never picked;
            BAIT counts them as labeled).
        candidates: ``(n_C,)`` int64 sorted row indices that may be picked (all rows minus labeled
            and reserved).
        batch_size: number of rows to return, ``1 <= batch_size <= n_C``.
        task: ``"classification"`` or ``"regression"``.
        seed: seed for any randomness (use :meth:`generator`).
        chunk_size: rows per chunk when streaming over the pool.
        progress: optional ``callback(done, total)``.
        row_ids: ``(n,)`` int64 stable ids of the rows (e.g. the service's item ids), or ``None``. A pre-filter's
            random stratum is then drawn by id (:func:`selection.bait.approx.item_keys`), so it is the same
            sample whichever process holds which rows (a Dask cluster's shards draw it the same way).
    """

    X: torch.Tensor
    probs: torch.Tensor | None
    labeled: torch.Tensor
    reserved: torch.Tensor
    candidates: torch.Tensor
    batch_size: int
    task: Task
    seed: int = 0
    chunk_size: int = 8192
    progress: ProgressFn | None = None
    row_ids: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def d(self) -> int:
        return int(self.X.shape[1])

    @property
    def k(self) -> int:
        """Number of classes (1 for regression)."""
        return 1 if self.probs is None else int(self.probs.shape[1])

    @property
    def device(self) -> torch.device:
        return self.X.device

    @property
    def dtype(self) -> torch.dtype:
        return self.X.dtype

    @property
    def in_design(self) -> torch.Tensor:
        """Sorted rows counted as already labeled by BAIT: labeled and reserved together."""
        both = torch.cat([self.labeled, self.reserved])
        return torch.sort(both).values

    def generator(self) -> torch.Generator:
        """A CPU generator seeded with ``seed`` (draw on CPU, then move, for device-independent results)."""
        g = torch.Generator(device="cpu")
        g.manual_seed(int(self.seed))
        return g

    def report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)


@dataclass
class StrategyOutput:
    """What a strategy returns: pool row indices in pick order, objective, diagnostics."""

    indices: np.ndarray
    objective: float | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)


StrategyFn = Callable[..., StrategyOutput]


@dataclass(frozen=True)
class Strategy:
    name: str
    fn: StrategyFn
    tasks: frozenset[str]
    summary: str
    inputs: frozenset[str] = frozenset(("embeddings", "probs"))


# What a strategy may read besides the design: "embeddings" (the geometry of X), "probs" (class
# probabilities). A strategy without "probs" accepts probs=None; one with neither (random) needs no model.
INPUTS = frozenset(("embeddings", "probs"))

REGISTRY: dict[str, Strategy] = {}


def register(
    name: str, tasks: tuple[str, ...], summary: str, inputs: tuple[str, ...] = ("embeddings", "probs")
) -> Callable[[StrategyFn], StrategyFn]:
    """Register ``fn(problem, *, **params) -> StrategyOutput`` under ``name`` for ``tasks``.

    ``inputs`` names what the strategy reads (a subset of :data:`INPUTS`); callers use it to skip
    work the strategy does not need (``probs=None`` is accepted when ``"probs"`` is not among them).
    """
    if not set(inputs) <= INPUTS:
        raise RuntimeError(f"strategy {name!r}: unknown inputs {sorted(set(inputs) - INPUTS)}")

    def deco(fn: StrategyFn) -> StrategyFn:
        if name in REGISTRY:
            raise RuntimeError(f"strategy {name!r} registered twice")
        REGISTRY[name] = Strategy(name=name, fn=fn, tasks=frozenset(tasks), summary=summary, inputs=frozenset(inputs))
        return fn

    return deco

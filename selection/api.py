"""The public entry point: ``select(strategy, embeddings=..., probs=..., ...)``.

``select`` converts the arrays to torch on the requested device and dtype, validates them
(:mod:`selection.validation`), looks the strategy up in :data:`selection.problem.REGISTRY`, checks the
task and the parameters against the strategy's keyword-only signature, runs it, checks its output
(distinct candidate rows, exactly ``batch_size`` of them) and wraps it in a :class:`SelectionResult`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from selection.errors import ParameterError, TaskMismatchError, UnknownStrategyError
from selection.problem import REGISTRY, Problem, Strategy, StrategyOutput
from selection.validation import build_problem, check_task


@dataclass
class SelectionResult:
    """What :func:`select` returns.

    Attributes:
        indices: ``(batch_size,)`` int64 numpy array of pool row indices, in the order chosen.
        objective: the strategy's objective at the returned batch (BAIT family), else ``None``.
        diagnostics: ``strategy``, ``task``, ``device``, ``dtype``, ``n``, ``d``, ``k``,
            ``n_candidates``, ``batch_size``, ``seed``, ``params``, ``seconds`` (total wall time) and
            ``timings`` (seconds per phase: ``validate``, ``strategy``, ``total`` and whatever phases the
            strategy reports), plus the strategy's own entries (steps, approximation used, ...).
    """

    indices: np.ndarray
    objective: float | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StrategyInfo:
    """Introspection record of a registered strategy (no computation needed to build it).

    Attributes:
        name: registry name.
        summary: one-line description.
        tasks: tasks it supports, sorted.
        params: keyword-only parameters and their defaults.
        inputs: what it reads besides the design: ``"embeddings"`` and/or ``"probs"`` (empty for
            ``random``, which needs no model at all).
    """

    name: str
    summary: str
    tasks: tuple[str, ...]
    params: dict[str, Any]
    inputs: tuple[str, ...] = ("embeddings", "probs")


def strategy_params(fn: Callable[..., Any]) -> dict[str, Any]:
    """Keyword-only parameters of a strategy function and their defaults (``inspect.Parameter.empty``
    when required)."""
    return {
        p.name: p.default for p in inspect.signature(fn).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def _info(s: Strategy) -> StrategyInfo:
    return StrategyInfo(
        name=s.name,
        summary=s.summary,
        tasks=tuple(sorted(s.tasks)),
        params=strategy_params(s.fn),
        inputs=tuple(sorted(s.inputs)),
    )


class _StrategiesView(Mapping[str, StrategyInfo]):
    """Read-only, always up-to-date view of the registry as :class:`StrategyInfo` records."""

    def __getitem__(self, name: str) -> StrategyInfo:
        return _info(REGISTRY[name])

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(REGISTRY))

    def __len__(self) -> int:
        return len(REGISTRY)

    def __repr__(self) -> str:
        return f"STRATEGIES({', '.join(sorted(REGISTRY))})"


STRATEGIES: Mapping[str, StrategyInfo] = _StrategiesView()


def get_strategy(name: Any) -> Strategy:
    """Look a strategy up by name.

    Raises:
        UnknownStrategyError: the name is not registered (the message lists the valid names).
    """
    if not isinstance(name, str) or name not in REGISTRY:
        raise UnknownStrategyError(f"unknown strategy {name!r}; valid strategies: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def check_params(strategy: Strategy, params: Mapping[str, Any]) -> None:
    """Refuse parameters that the strategy function does not declare as keyword-only.

    Raises:
        ParameterError: an unknown parameter (the message lists the valid ones), or a missing required one.
    """
    valid = strategy_params(strategy.fn)
    unknown = sorted(set(params) - set(valid))
    if unknown:
        listed = ", ".join(sorted(valid)) if valid else "none"
        raise ParameterError(
            f"unknown parameter(s) {', '.join(map(repr, unknown))} for strategy {strategy.name!r}; "
            f"valid parameters: {listed}"
        )
    missing = [k for k, v in valid.items() if v is inspect.Parameter.empty and k not in params]
    if missing:
        raise ParameterError(f"strategy {strategy.name!r} requires parameter(s): {', '.join(missing)}")


def _check_output(out: StrategyOutput, problem: Problem, name: str) -> np.ndarray:
    """The strategy's indices as int64 numpy, after checking the contract (an internal bug otherwise)."""
    idx = np.asarray(out.indices.cpu() if isinstance(out.indices, torch.Tensor) else out.indices)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise RuntimeError(f"strategy {name!r} returned indices of shape {idx.shape} and dtype {idx.dtype}")
    idx = idx.astype(np.int64, copy=False)
    if idx.shape[0] != problem.batch_size:
        raise RuntimeError(f"strategy {name!r} returned {idx.shape[0]} rows instead of {problem.batch_size}")
    if np.unique(idx).shape[0] != idx.shape[0]:
        raise RuntimeError(f"strategy {name!r} returned a row twice")
    cand = problem.candidates.cpu().numpy()
    if not np.isin(idx, cand).all():
        raise RuntimeError(f"strategy {name!r} returned a row that is labeled, reserved or out of range")
    return idx


def _describe(value: Any) -> Any:
    """A parameter value for diagnostics: scalars as is, arrays as a short JSON-friendly description."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<{type(value).__name__} shape={tuple(shape)}>"
    return f"<{type(value).__name__}>"


def select(
    strategy: str,
    *,
    embeddings: Any,
    probs: Any = None,
    labeled: Any = None,
    reserved: Any = None,
    batch_size: int,
    task: str = "classification",
    seed: int = 0,
    device: Any = None,
    dtype: Any = None,
    chunk_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    row_ids: Any = None,
    **params: Any,
) -> SelectionResult:
    """Select ``batch_size`` pool rows to label next.

    Args:
        strategy: a name in :data:`STRATEGIES` (``"bait"``, ``"badge"``, ``"coreset"``, ...).
        embeddings: ``n x d`` numpy array, torch tensor or nested list: every pool row, labeled or not.
        probs: ``n x k`` predicted class probabilities (rows sum to 1) for classification; ``None``
            for regression, and allowed for strategies that do not read them
            (``"probs" not in STRATEGIES[strategy].inputs``: random, coreset).
        labeled: labeled rows, as integer indices or a boolean mask of length ``n``; ``None`` = none.
        reserved: rows reserved by earlier, not yet labeled batches (never returned; BAIT counts them
            in the design). A row in both ``labeled`` and ``reserved`` counts as labeled.
        batch_size: number of rows to return, at most the number of candidates
            (``n - |labeled ∪ reserved|``).
        task: ``"classification"`` or ``"regression"``.
        seed: non-negative seed of every random choice; results are reproducible from it.
        device: ``None`` (device of a torch input, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        dtype: ``None`` (float32 for float32/half inputs, float64 otherwise), ``"float32"``,
            ``"float64"`` or a torch/numpy float dtype.
        chunk_size: rows per chunk when streaming over the pool (bounds memory); ``None`` = 8192.
        progress: optional ``callback(done, total)`` called by long-running strategies.
        row_ids: optional ``n`` distinct non-negative integer ids of the rows (e.g. your item ids). BAIT's
            pre-filter then draws its random stratum by id, so the same pool sharded differently (the
            service's Dask path) keeps the same rows; ``None``: drawn by row position.
        **params: strategy parameters (see ``STRATEGIES[strategy].params``).

    Returns:
        A :class:`SelectionResult`: ``indices`` (``(batch_size,)`` int64, in pick order),
        ``objective`` and ``diagnostics``.

    Raises:
        UnknownStrategyError: unknown strategy name.
        TaskMismatchError: the strategy does not support ``task``.
        ParameterError: unknown/invalid parameter, batch size, index, seed, device or dtype.
        InputDataError: malformed embeddings or probabilities.
    """
    t0 = time.perf_counter()
    strat = get_strategy(strategy)
    check_params(strat, params)
    task_ = check_task(task)
    if task_ not in strat.tasks:  # before converting anything
        raise TaskMismatchError(
            f"strategy {strat.name!r} supports {', '.join(sorted(strat.tasks))}, not {task_}; "
            f"strategies for {task_}: {', '.join(sorted(n for n, s in REGISTRY.items() if task_ in s.tasks))}"
        )
    problem = build_problem(
        embeddings=embeddings,
        probs=probs,
        labeled=labeled,
        reserved=reserved,
        batch_size=batch_size,
        task=task_,
        seed=seed,
        device=device,
        dtype=dtype,
        chunk_size=chunk_size,
        progress=progress,
        needs_probs="probs" in strat.inputs,
        row_ids=row_ids,
    )
    t1 = time.perf_counter()
    with torch.no_grad():
        out = strat.fn(problem, **params)
    t2 = time.perf_counter()
    indices = _check_output(out, problem, strat.name)

    diagnostics: dict[str, Any] = dict(out.diagnostics)
    timings = dict(diagnostics.pop("timings", {}) or {})
    timings.update(validate=t1 - t0, strategy=t2 - t1, total=time.perf_counter() - t0)
    diagnostics.update(
        strategy=strat.name,
        task=problem.task,
        device=str(problem.device),
        dtype=str(problem.dtype).removeprefix("torch."),
        n=problem.n,
        d=problem.d,
        k=problem.k,
        n_candidates=int(problem.candidates.numel()),
        batch_size=problem.batch_size,
        seed=problem.seed,
        params={k: _describe(v) for k, v in params.items()},
        timings=timings,
        seconds=timings["total"],
    )
    objective = None if out.objective is None else float(out.objective)
    return SelectionResult(indices=indices, objective=objective, diagnostics=diagnostics)

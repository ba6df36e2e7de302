"""BAIT and baseline batch active-learning selection on arrays.

    from selection import select
    res = select("bait", embeddings=X, probs=P, labeled=idx, batch_size=100)
    res.indices, res.objective, res.diagnostics

:data:`STRATEGIES` lists every registered strategy with its tasks and parameters.
"""

from selection import auto, bait, baselines, coldstart, logdet  # noqa: F401  (importing registers the strategies)
from selection.api import STRATEGIES, SelectionResult, StrategyInfo, select
from selection.errors import (
    InputDataError,
    MemoryBudgetError,
    NumericalWarning,
    ParameterError,
    SelectionError,
    TaskMismatchError,
    UnknownStrategyError,
)
from selection.problem import Problem, StrategyOutput, register

__all__ = [
    "STRATEGIES",
    "InputDataError",
    "MemoryBudgetError",
    "NumericalWarning",
    "ParameterError",
    "Problem",
    "SelectionError",
    "SelectionResult",
    "StrategyInfo",
    "StrategyOutput",
    "TaskMismatchError",
    "UnknownStrategyError",
    "register",
    "select",
]

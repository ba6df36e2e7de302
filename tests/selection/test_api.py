"""The public ``select`` API: result shape, devices, dtypes, registry introspection, output checks."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import selection
from selection import STRATEGIES, SelectionResult, StrategyOutput, TaskMismatchError, register, select
from selection.problem import REGISTRY
from tests.devices import DEVICES


def pool(n: int = 30, d: int = 4, k: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.dirichlet(np.ones(k), size=n)


@pytest.fixture
def temp_strategy():
    """Register throw-away strategies and remove them afterwards."""
    names: list[str] = []

    def add(name, fn, tasks=("classification", "regression")):
        names.append(name)
        register(name, tasks=tasks, summary="test")(fn)

    yield add
    for name in names:
        REGISTRY.pop(name, None)


def test_select_returns_result_with_diagnostics():
    X, P = pool()
    res = select("margin", embeddings=X, probs=P, labeled=[0, 1], reserved=[5], batch_size=4, seed=3)
    assert isinstance(res, SelectionResult)
    assert res.indices.dtype == np.int64 and res.indices.shape == (4,)
    assert res.objective is None
    diag = res.diagnostics
    expected = {"strategy": "margin", "task": "classification", "device": "cpu", "dtype": "float64",
                "n": 30, "d": 4, "k": 3, "n_candidates": 27, "batch_size": 4, "seed": 3}  # fmt: skip
    assert {key: diag[key] for key in expected} == expected
    assert set(diag["timings"]) >= {"validate", "strategy", "total"}
    assert diag["seconds"] == diag["timings"]["total"] >= diag["timings"]["strategy"] >= 0


def test_objective_is_float_for_logdet():
    X, P = pool()
    res = select("logdet_rank1", embeddings=X, probs=P, batch_size=3, lam=0.5)
    assert isinstance(res.objective, float) and res.objective > 0
    assert res.diagnostics["params"] == {"lam": 0.5}


def test_regression_k_is_one():
    X, _ = pool()
    res = select("coreset", embeddings=X, task="regression", batch_size=2)
    assert res.diagnostics["k"] == 1


@pytest.mark.parametrize("device", DEVICES)
def test_torch_inputs_stay_on_their_device_and_dtype(device, temp_strategy):
    seen = {}

    def spy(problem):
        seen.update(device=problem.X.device, dtype=problem.X.dtype, probs=problem.probs.dtype,
                    idx=problem.candidates.device)  # fmt: skip
        return StrategyOutput(indices=problem.candidates[: problem.batch_size].cpu().numpy())

    temp_strategy("spy", spy)
    X, P = pool()
    Xt = torch.tensor(X, dtype=torch.float32, device=device)
    res = select("spy", embeddings=Xt, probs=torch.tensor(P, device=device), batch_size=2)
    assert seen["device"].type == device and seen["idx"].type == device
    assert seen["dtype"] == torch.float32 and seen["probs"] == torch.float32
    assert res.diagnostics["dtype"] == "float32"


def test_numpy_inputs_default_to_cpu_and_explicit_dtype_wins(temp_strategy):
    X, P = pool()
    res = select("margin", embeddings=X.astype(np.float32), probs=P, batch_size=2)
    assert res.diagnostics["device"] == "cpu" and res.diagnostics["dtype"] == "float32"
    res = select("margin", embeddings=X.astype(np.float32), probs=P, batch_size=2, dtype="float64")
    assert res.diagnostics["dtype"] == "float64"


def test_torch_and_numpy_inputs_give_the_same_selection():
    X, P = pool()
    a = select("badge", embeddings=X, probs=P, batch_size=5, seed=2)
    b = select("badge", embeddings=torch.from_numpy(X), probs=torch.from_numpy(P), batch_size=5, seed=2)
    np.testing.assert_array_equal(a.indices, b.indices)


def test_strategies_are_introspectable():
    assert {"badge", "coreset", "confidence", "margin", "entropy", "random", "logdet_rank1"} <= set(STRATEGIES)
    info = STRATEGIES["logdet_rank1"]
    assert info.params == {"lam": 1.0}
    assert info.tasks == ("classification",)
    assert STRATEGIES["coreset"].tasks == ("classification", "regression")
    assert all(isinstance(STRATEGIES[name].summary, str) and STRATEGIES[name].summary for name in STRATEGIES)


def test_strategies_view_reflects_new_registrations(temp_strategy):
    def tmp(problem, *, alpha: float = 0.5, mode: str = "x"):
        return StrategyOutput(indices=problem.candidates[: problem.batch_size].cpu().numpy())

    temp_strategy("tmp_view", tmp, tasks=("regression",))
    assert STRATEGIES["tmp_view"].params == {"alpha": 0.5, "mode": "x"}
    X, _ = pool()
    with pytest.raises(TaskMismatchError, match="'tmp_view' supports regression, not classification"):
        select("tmp_view", embeddings=X, probs=pool()[1], batch_size=1)


def test_required_strategy_parameter_must_be_given(temp_strategy):
    def needs(problem, *, weight):
        return StrategyOutput(indices=problem.candidates[: problem.batch_size].cpu().numpy())

    temp_strategy("tmp_needs", needs)
    X, _ = pool()
    with pytest.raises(selection.ParameterError, match="requires parameter"):
        select("tmp_needs", embeddings=X, task="regression", batch_size=1)
    assert STRATEGIES["tmp_needs"].params == {"weight": inspect.Parameter.empty}
    assert len(select("tmp_needs", embeddings=X, task="regression", batch_size=1, weight=1).indices) == 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (lambda c, b: c[:b] * 0 + c[0], "twice"),
        (lambda c, b: c[: b - 1], "returned 2 rows instead of 3"),
        (lambda c, b: np.array([0, *c[: b - 1]]), "labeled, reserved or out of range"),
        (lambda c, b: c[:b].astype(float), "dtype"),
    ],
)
def test_strategy_breaking_the_contract_is_an_internal_error(temp_strategy, bad, message):
    def broken(problem):
        return StrategyOutput(indices=bad(problem.candidates.cpu().numpy(), problem.batch_size))

    temp_strategy("tmp_broken", broken)
    X, _ = pool()
    with pytest.raises(RuntimeError, match=message):
        select("tmp_broken", embeddings=X, task="regression", labeled=[0], batch_size=3)


def test_strategy_runs_without_autograd(temp_strategy):
    seen = {}

    def spy(problem):
        seen["grad"] = torch.is_grad_enabled()
        return StrategyOutput(indices=problem.candidates[: problem.batch_size].cpu().numpy())

    temp_strategy("tmp_grad", spy)
    X = torch.randn(10, 3, requires_grad=True)
    select("tmp_grad", embeddings=X, task="regression", batch_size=1)
    assert seen["grad"] is False


def test_error_classes_are_exported():
    for name in ("SelectionError", "InputDataError", "UnknownStrategyError", "ParameterError",
                 "TaskMismatchError", "MemoryBudgetError", "NumericalWarning"):  # fmt: skip
        assert hasattr(selection, name)


def test_task_mismatch_is_reported_before_the_data_is_converted():
    with pytest.raises(TaskMismatchError, match=r"'badge' supports classification, not regression"):
        select("badge", embeddings=np.full((3, 2), np.nan), task="regression", batch_size=1)

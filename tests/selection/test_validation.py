"""Every bad input to ``select`` raises a specific error with an actionable message."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selection import (
    STRATEGIES,
    InputDataError,
    ParameterError,
    SelectionError,
    UnknownStrategyError,
    select,
)
from selection.validation import build_problem, resolve_dtype


def pool(n: int = 20, d: int = 3, k: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    P = rng.dirichlet(np.ones(k), size=n)
    return X, P


def problem(**overrides):
    X, P = pool()
    kw = dict(
        embeddings=X, probs=P, labeled=None, reserved=None, batch_size=2, task="classification",
        seed=0, device=None, dtype=None, chunk_size=None, progress=None,
    )  # fmt: skip
    kw.update(overrides)
    return build_problem(**kw)


# ---------------------------------------------------------------- embeddings


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rejects_nonfinite_embedding(bad):
    X, P = pool()
    X[7, 1] = bad
    with pytest.raises(InputDataError, match=r"NaN or inf.*row 7"):
        select("random", embeddings=X, probs=P, batch_size=2)


def test_rejects_embedding_that_overflows_float32():
    X, P = pool()
    X[3, 0] = 1e300
    with pytest.raises(InputDataError, match="row 3"):
        select("random", embeddings=X, probs=P, batch_size=2, dtype="float32")


@pytest.mark.parametrize("shape", [(20,), (20, 3, 1), ()])
def test_rejects_embeddings_not_2d(shape):
    _, P = pool()
    with pytest.raises(InputDataError, match="2-D"):
        select("random", embeddings=np.zeros(shape), probs=P, batch_size=2)


def test_rejects_empty_pool():
    with pytest.raises(InputDataError, match="empty"):
        select("random", embeddings=np.zeros((0, 3)), task="regression", batch_size=1)


def test_rejects_zero_width_embeddings():
    with pytest.raises(InputDataError, match="0 features"):
        select("random", embeddings=np.zeros((5, 0)), task="regression", batch_size=1)


@pytest.mark.parametrize("bad", [np.array([["a", "b"]]), np.array([[1 + 1j]]), np.ones((2, 2), dtype=bool)])
def test_rejects_non_numeric_embeddings(bad):
    with pytest.raises(InputDataError, match="real numbers"):
        select("random", embeddings=bad, task="regression", batch_size=1)


def test_rejects_ragged_embeddings():
    with pytest.raises(InputDataError, match="rectangular"):
        select("random", embeddings=[[1.0, 2.0], [3.0]], task="regression", batch_size=1)


def test_accepts_big_endian_arrays():
    X, P = pool()
    a = select("margin", embeddings=X.astype(">f8"), probs=P.astype(">f4"), batch_size=3)
    b = select("margin", embeddings=X, probs=P, batch_size=3)
    np.testing.assert_array_equal(a.indices, b.indices)


def test_accepts_nested_lists_and_integer_embeddings():
    res = select("coreset", embeddings=[[0, 0], [1, 0], [5, 5]], task="regression", labeled=[0], batch_size=1)
    assert res.indices.tolist() == [2]
    assert res.diagnostics["dtype"] == "float64"


# ---------------------------------------------------------------- probabilities


def test_rejects_probs_with_wrong_number_of_rows():
    X, _ = pool(n=20)
    _, P = pool(n=19)
    with pytest.raises(InputDataError, match="19 rows but embeddings has 20"):
        select("margin", embeddings=X, probs=P, batch_size=2)


def test_rejects_probs_not_2d():
    X, P = pool()
    with pytest.raises(InputDataError, match="2-D"):
        select("margin", embeddings=X, probs=P[:, 0], batch_size=2)


def test_rejects_negative_probs():
    X, P = pool()
    P[4] = [1.2, -0.2, 0.0]
    with pytest.raises(InputDataError, match=r"negative.*row 4"):
        select("margin", embeddings=X, probs=P, batch_size=2)


def test_rejects_probs_rows_not_summing_to_one():
    X, P = pool()
    P[6] *= 1.01
    with pytest.raises(InputDataError, match=r"row 6 sums to 1.01"):
        select("margin", embeddings=X, probs=P, batch_size=2)


def test_renormalises_probs_within_tolerance():
    X, P = pool()
    P[6] *= 1.0005
    prob = problem(embeddings=X, probs=P)
    assert prob.probs is not None
    torch.testing.assert_close(prob.probs.sum(1), torch.ones(20, dtype=torch.float64))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_rejects_nonfinite_probs(bad):
    X, P = pool()
    P[2, 0] = bad
    with pytest.raises(InputDataError, match=r"NaN or inf.*row 2"):
        select("margin", embeddings=X, probs=P, batch_size=2)


def test_rejects_single_class_probs():
    X, _ = pool()
    with pytest.raises(InputDataError, match="at least 2 classes"):
        select("margin", embeddings=X, probs=np.ones((20, 1)), batch_size=2)


def test_rejects_missing_probs_for_classification():
    X, _ = pool()
    with pytest.raises(InputDataError, match="classification needs probs"):
        select("margin", embeddings=X, batch_size=2)


@pytest.mark.parametrize("strategy", ["random", "coreset"])
def test_strategies_that_read_no_probs_accept_none_for_classification(strategy):
    X, P = pool()
    without = select(strategy, embeddings=X, batch_size=4, seed=3)
    with_probs = select(strategy, embeddings=X, probs=P, batch_size=4, seed=3)
    np.testing.assert_array_equal(without.indices, with_probs.indices)
    assert "probs" not in STRATEGIES[strategy].inputs


def test_probs_are_still_checked_when_the_strategy_ignores_them():
    X, _ = pool()
    with pytest.raises(InputDataError, match="sum to 1"):
        select("random", embeddings=X, probs=np.full((20, 3), 0.5), batch_size=2)


def test_rejects_probs_for_regression():
    X, P = pool()
    with pytest.raises(InputDataError, match="regression"):
        select("coreset", embeddings=X, probs=P, task="regression", batch_size=2)


# ---------------------------------------------------------------- batch size, task, seed, chunk size


@pytest.mark.parametrize("bad", [0, -3])
def test_rejects_nonpositive_batch_size(bad):
    X, P = pool()
    with pytest.raises(ParameterError, match="batch_size must be >= 1"):
        select("random", embeddings=X, probs=P, batch_size=bad)


@pytest.mark.parametrize("bad", [2.0, "2", True, None])
def test_rejects_non_integer_batch_size(bad):
    X, P = pool()
    with pytest.raises(ParameterError, match="batch_size must be an integer"):
        select("random", embeddings=X, probs=P, batch_size=bad)


def test_accepts_numpy_integer_batch_size():
    X, P = pool()
    assert len(select("random", embeddings=X, probs=P, batch_size=np.int64(3)).indices) == 3


def test_rejects_batch_larger_than_candidates_and_says_how_many():
    X, P = pool(n=20)
    with pytest.raises(ParameterError, match=r"only 15 candidate rows are available.*3 labeled, 2 reserved"):
        select("random", embeddings=X, probs=P, labeled=[0, 1, 2], reserved=[3, 4], batch_size=16)


def test_batch_equal_to_candidates_is_allowed():
    X, P = pool(n=20)
    res = select("random", embeddings=X, probs=P, labeled=[0, 1, 2], reserved=[3, 4], batch_size=15)
    assert sorted(res.indices.tolist()) == list(range(5, 20))


def test_rejects_unknown_task():
    X, P = pool()
    with pytest.raises(ParameterError, match=r"unknown task 'ranking'.*classification, regression"):
        select("random", embeddings=X, probs=P, task="ranking", batch_size=2)


@pytest.mark.parametrize(("name", "value"), [("seed", -1), ("seed", 1.5), ("chunk_size", 0)])
def test_rejects_bad_seed_and_chunk_size(name, value):
    X, P = pool()
    with pytest.raises(ParameterError, match=name):
        select("random", embeddings=X, probs=P, batch_size=2, **{name: value})


def test_rejects_non_callable_progress():
    X, P = pool()
    with pytest.raises(ParameterError, match="progress"):
        select("random", embeddings=X, probs=P, batch_size=2, progress=5)


# ---------------------------------------------------------------- strategy and parameters


def test_rejects_unknown_strategy_listing_valid_ones():
    X, P = pool()
    with pytest.raises(UnknownStrategyError, match=r"'bayt'.*badge.*coreset.*random"):
        select("bayt", embeddings=X, probs=P, batch_size=2)


def test_rejects_unknown_parameter_listing_valid_ones():
    X, P = pool()
    with pytest.raises(ParameterError, match=r"'lambda'.*'logdet_rank1'.*valid parameters: lam"):
        select("logdet_rank1", embeddings=X, probs=P, batch_size=2, **{"lambda": 1.0})
    with pytest.raises(ParameterError, match="valid parameters: none"):
        select("margin", embeddings=X, probs=P, batch_size=2, lam=1.0)


# ---------------------------------------------------------------- labeled / reserved


@pytest.mark.parametrize(
    ("labeled", "message"),
    [
        ([0, 20], "index 20 but the pool has only 20 rows"),
        ([-1, 3], "negative index -1"),
        ([3, 5, 3], "duplicate index 3"),
        ([[1, 2]], "must be 1-D"),
        ([0.0, 1.5], "integer row indices"),
        (np.ones(19, dtype=bool), "boolean mask of length 19 but the pool has 20 rows"),
        (torch.ones(21, dtype=torch.bool), "boolean mask of length 21"),
    ],
)
def test_rejects_bad_labeled_indices(labeled, message):
    X, P = pool()
    with pytest.raises(ParameterError, match=message):
        select("random", embeddings=X, probs=P, labeled=labeled, batch_size=2)


def test_rejects_bad_reserved_indices():
    X, P = pool()
    with pytest.raises(ParameterError, match="reserved contains index 25"):
        select("random", embeddings=X, probs=P, reserved=[25], batch_size=2)


def test_accepts_index_forms_equivalently():
    forms = [
        [1, 4, 2],
        np.array([4, 1, 2], dtype=np.int32),
        torch.tensor([2, 4, 1]),
        np.isin(np.arange(20), [1, 2, 4]),
        torch.from_numpy(np.isin(np.arange(20), [1, 2, 4])),
    ]
    for f in forms:
        prob = problem(labeled=f)
        assert prob.labeled.tolist() == [1, 2, 4]
        assert prob.labeled.dtype == torch.int64
        assert 1 not in prob.candidates.tolist() and len(prob.candidates) == 17


def test_empty_index_lists_mean_none():
    for f in ([], np.array([]), torch.tensor([])):
        assert problem(labeled=f, reserved=f).candidates.tolist() == list(range(20))


def test_row_both_labeled_and_reserved_counts_as_labeled():
    prob = problem(labeled=[1, 2], reserved=[2, 3])
    assert prob.labeled.tolist() == [1, 2]
    assert prob.reserved.tolist() == [3]
    assert prob.in_design.tolist() == [1, 2, 3]
    assert prob.candidates.tolist() == [0, *range(4, 20)]


# ---------------------------------------------------------------- device and dtype


def test_rejects_unavailable_or_invalid_device():
    X, P = pool()
    if not torch.cuda.is_available():
        with pytest.raises(ParameterError, match="CUDA is not available"):
            select("random", embeddings=X, probs=P, batch_size=2, device="cuda")
    with pytest.raises(ParameterError, match="not a valid torch device"):
        select("random", embeddings=X, probs=P, batch_size=2, device="gpu0")
    with pytest.raises(ParameterError, match="not supported"):
        select("random", embeddings=X, probs=P, batch_size=2, device="meta")


@pytest.mark.parametrize(
    ("src", "requested", "expected"),
    [
        (np.float32, None, torch.float32),
        (np.float64, None, torch.float64),
        (np.float16, None, torch.float32),
        (np.int64, None, torch.float64),
        (np.float64, "float32", torch.float32),
        (np.float32, "float64", torch.float64),
        (np.float32, torch.float64, torch.float64),
        (np.float64, np.float32, torch.float32),
        (np.float64, "double", torch.float64),
    ],
)
def test_dtype_resolution(src, requested, expected):
    assert resolve_dtype(requested, np.zeros((2, 2), dtype=src)) == expected


def test_dtype_of_torch_input_is_kept():
    assert resolve_dtype(None, torch.zeros(2, 2, dtype=torch.bfloat16)) == torch.float32
    assert resolve_dtype(None, torch.zeros(2, 2, dtype=torch.float64)) == torch.float64


@pytest.mark.parametrize("bad", ["float16", torch.float16, torch.int64, np.int32, "fp8", 3])
def test_rejects_unsupported_dtype(bad):
    X, P = pool()
    with pytest.raises(ParameterError, match="dtype"):
        select("random", embeddings=X, probs=P, batch_size=2, dtype=bad)


def test_every_error_is_a_selection_error_and_a_value_error():
    X, P = pool()
    with pytest.raises(SelectionError):
        select("random", embeddings=X, probs=P, batch_size=0)
    with pytest.raises(ValueError):
        select("nope", embeddings=X, probs=P, batch_size=1)

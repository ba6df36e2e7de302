"""Tests of selection.heads: training stops, determinism, fresh init, outputs, checkpoints, errors."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest
import torch

from selection.errors import InputDataError, ParameterError
from selection.heads import (
    DTypeName,
    HeadConfig,
    HeadKind,
    TrainedHead,
    build_head,
    evaluate,
    load_checkpoint,
    predict,
    save_checkpoint,
    train_head,
)
from selection.problem import Task
from tests.conftest import shared_data
from tests.devices import DEVICES

DTYPES = [torch.float32, torch.float64]
DTYPE_NAMES: dict[torch.dtype, DTypeName] = {torch.float32: "float32", torch.float64: "float64"}


def blobs(n: int = 150, d: int = 5, k: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n x d`` points around ``k`` well separated centres, and their ``(n,)`` int64 labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d)) * 4.0
    labels = rng.integers(0, k, size=n)
    return centres[labels] + rng.normal(size=(n, d)), labels.astype(np.int64)


def linear_targets(n: int = 200, d: int = 4, m: int = 2, noise: float = 0.01, seed: int = 0):
    """``n x d`` inputs, ``n x m`` targets ``X W + 0.5 + noise``, and the noise-free targets."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    clean = X @ rng.normal(size=(d, m)) + 0.5
    return X, clean + noise * rng.normal(size=(n, m)), clean


def state(trained: TrainedHead | torch.nn.Module) -> dict[str, torch.Tensor]:
    module = trained.module if isinstance(trained, TrainedHead) else trained
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def states_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------------------------------
# Training and stopping
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_classifier_reaches_target_accuracy_and_stops_early(kind: HeadKind, dtype: torch.dtype) -> None:
    X, y = blobs()
    config = HeadConfig(input_dim=5, n_outputs=3, kind=kind, dtype=DTYPE_NAMES[dtype], lr=1e-2, max_epochs=500)
    seen: list[tuple[int, int]] = []
    trained = train_head(config, X, y, progress=lambda done, total: seen.append((done, total)))

    m = trained.metrics
    assert m["stop_reason"] == "target_accuracy"
    assert m["train_accuracy"] >= 0.99
    assert 1 <= m["epochs"] < config.max_epochs
    assert seen == [(e, config.max_epochs) for e in range(1, m["epochs"] + 1)]
    assert m["n_train"] == 150 and m["seconds"] >= 0.0
    assert trained.dtype == dtype
    # The reported accuracy is the real accuracy of the returned module on the training rows.
    probs = predict(trained, X).probs
    assert probs is not None
    accuracy = float((probs.argmax(dim=1).numpy() == y).mean())
    assert accuracy == pytest.approx(m["train_accuracy"])
    assert evaluate(trained, X, y)["accuracy"] == pytest.approx(m["train_accuracy"])


def test_training_stops_at_the_epoch_cap() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 2))
    y = rng.integers(0, 4, size=200)  # random labels in 2-D: 99% is out of reach in 3 epochs
    config = HeadConfig(input_dim=2, n_outputs=4, kind="mlp", max_epochs=3)
    seen: list[tuple[int, int]] = []
    trained = train_head(config, X, y, progress=lambda done, total: seen.append((done, total)))
    assert trained.metrics["stop_reason"] == "max_epochs"
    assert trained.metrics["epochs"] == 3
    assert trained.metrics["train_accuracy"] < 0.99
    assert seen == [(1, 3), (2, 3), (3, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_regression_fits_linear_target_and_stops_on_plateau(kind: HeadKind, dtype: torch.dtype) -> None:
    X, y, clean = linear_targets()
    config = HeadConfig(
        input_dim=4, n_outputs=2, kind=kind, task="regression", lr=3e-2, max_epochs=2000,
        dtype=DTYPE_NAMES[dtype],
    )  # fmt: skip
    trained = train_head(config, X, y)

    m = trained.metrics
    assert m["stop_reason"] == "plateau"
    assert m["epochs"] < config.max_epochs
    # The target has noise of std 0.01; the fitted function must be close to the clean one.
    outputs = predict(trained, X).outputs
    assert outputs is not None and outputs.shape == (200, 2) and outputs.dtype == dtype
    assert float(np.sqrt(((outputs.numpy() - clean) ** 2).mean())) < 0.05
    assert m["train_rmse"] == pytest.approx(np.sqrt(m["train_loss"]))
    assert m["train_rmse"] < 0.05
    ev = evaluate(trained, X, y)
    assert ev["mse"] == pytest.approx(((outputs.numpy() - y) ** 2).mean(), rel=1e-4)
    assert ev["rmse"] == pytest.approx(np.sqrt(ev["mse"]))


def test_regression_accepts_one_dimensional_targets_for_one_output() -> None:
    X, y, _ = linear_targets(m=1)
    config = HeadConfig(input_dim=4, n_outputs=1, kind="linear", task="regression", lr=3e-2)
    a = train_head(config, X, y[:, 0])
    b = train_head(config, X, y)
    assert states_equal(state(a), state(b))


# --------------------------------------------------------------------------------------------------
# Seeds, determinism and fresh initialisation
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_same_seed_gives_identical_weights_and_predictions(kind: HeadKind) -> None:
    X, y = blobs()
    config = HeadConfig(input_dim=5, n_outputs=3, kind=kind, lr=1e-2)
    a = train_head(config, X, y, seed=7)
    b = train_head(config, X, y, seed=7)
    assert states_equal(state(a), state(b))
    pa, pb = predict(a, X), predict(b, X)
    assert torch.equal(pa.features, pb.features)
    assert pa.probs is not None and pb.probs is not None
    assert torch.equal(pa.probs, pb.probs)
    assert a.metrics["epochs"] == b.metrics["epochs"]


def test_different_seeds_give_different_init_and_weights() -> None:
    X, y = blobs()
    config = HeadConfig(input_dim=5, n_outputs=3, kind="mlp")
    assert not states_equal(state(build_head(config, seed=1)), state(build_head(config, seed=2)))
    assert not states_equal(state(train_head(config, X, y, seed=1)), state(train_head(config, X, y, seed=2)))
    # config.seed is the default seed.
    assert states_equal(state(build_head(config)), state(build_head(config, seed=0)))
    assert states_equal(
        state(train_head(HeadConfig(input_dim=5, n_outputs=3, seed=3), X, y)),
        state(train_head(config, X, y, seed=3)),
    )


def test_init_depends_on_seed_only_and_leaves_global_rng_alone() -> None:
    config = HeadConfig(input_dim=6, n_outputs=4, kind="mlp")
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = build_head(config, seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(456)
    b = build_head(config, seed=5)
    assert states_equal(state(a), state(b))
    # PyTorch's default range U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    assert float(a.state_dict()["hidden.0.weight"].abs().max()) <= 1 / np.sqrt(6)
    assert float(a.state_dict()["out.weight"].abs().max()) <= 1 / np.sqrt(128)


def test_each_call_starts_from_a_fresh_init() -> None:
    Xa, ya = blobs(seed=0)
    Xb, yb = blobs(seed=1)
    config = HeadConfig(input_dim=5, n_outputs=3, kind="mlp")
    first_b = train_head(config, Xb, yb, seed=0)
    a = train_head(config, Xa, ya, seed=0)
    second_b = train_head(config, Xb, yb, seed=0)
    # Training on other data in between changes nothing: no warm start, no shared state.
    assert states_equal(state(first_b), state(second_b))
    assert not states_equal(state(a), state(first_b))
    for p, q in zip(a.module.parameters(), second_b.module.parameters(), strict=True):
        assert p.data_ptr() != q.data_ptr()
    # And training moved the weights away from the seeded init.
    assert not states_equal(state(a), state(build_head(config, seed=0)))


@pytest.mark.parametrize("device", DEVICES)
def test_training_runs_on_the_requested_device(device: str) -> None:
    X, y = blobs()
    config = HeadConfig(input_dim=5, n_outputs=3, kind="mlp")
    trained = train_head(config, X, y, device=device)
    assert trained.device.type == device
    out = predict(trained, X)
    assert out.features.device.type == device and out.probs is not None
    assert out.probs.device.type == device
    assert trained.metrics["stop_reason"] == "target_accuracy"
    # The same seed gives the same initial weights on every device.
    assert states_equal(state(build_head(config, device=device)), state(build_head(config)))
    # Tensor inputs: training follows their device when none is given.
    from_tensor = train_head(config, torch.as_tensor(X, device=device), torch.as_tensor(y, device=device))
    assert from_tensor.device.type == device


# --------------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_features_are_hidden_layer_for_mlp_and_input_for_linear(dtype: torch.dtype) -> None:
    X, y = blobs(n=40, d=5)
    kinds: tuple[tuple[HeadKind, int], ...] = (("mlp", 128), ("linear", 5))
    for kind, width in kinds:
        config = HeadConfig(input_dim=5, n_outputs=3, kind=kind, dtype=DTYPE_NAMES[dtype], max_epochs=2)
        trained = train_head(config, X, y)
        out = predict(trained, X)
        assert out.features.shape == (40, width) and config.feature_dim == width
        assert out.features.dtype == dtype
        assert out.outputs is None
        if kind == "linear":
            assert torch.equal(out.features, torch.as_tensor(X, dtype=dtype))
        else:
            # hidden = ReLU(W1 x + b1), computed here by hand.
            weights = trained.module.state_dict()
            x = torch.as_tensor(X, dtype=dtype)
            expected = torch.relu(x @ weights["hidden.0.weight"].T + weights["hidden.0.bias"])
            torch.testing.assert_close(out.features, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_probabilities_sum_to_one_and_match_softmax_of_logits(dtype: torch.dtype) -> None:
    X, y = blobs(n=60)
    config = HeadConfig(input_dim=5, n_outputs=3, kind="mlp", dtype=DTYPE_NAMES[dtype])
    trained = train_head(config, X, y)
    out = predict(trained, X, chunk_size=7)  # uneven chunks
    assert out.probs is not None and out.probs.shape == (60, 3) and out.probs.dtype == dtype
    assert bool((out.probs >= 0).all())
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out.probs.sum(dim=1), torch.ones(60, dtype=dtype), atol=tol, rtol=0)
    with torch.no_grad():
        logits = trained.module(torch.as_tensor(X, dtype=dtype))
    torch.testing.assert_close(out.probs, torch.softmax(logits, dim=1))
    whole = predict(trained, X)
    assert whole.probs is not None
    torch.testing.assert_close(out.probs, whole.probs)
    assert not out.probs.requires_grad and not out.features.requires_grad


def test_predict_on_zero_rows_gives_empty_outputs() -> None:
    config = HeadConfig(input_dim=5, n_outputs=3, kind="mlp")
    trained = train_head(config, *blobs(n=30))
    out = predict(trained, np.zeros((0, 5)))
    assert out.features.shape == (0, 128)
    assert out.probs is not None and out.probs.shape == (0, 3)


def test_evaluate_matches_manual_accuracy_and_cross_entropy() -> None:
    X, y = blobs(n=100, seed=3)
    config = HeadConfig(input_dim=5, n_outputs=3, kind="linear", max_epochs=3, dtype="float64")
    trained = train_head(config, X[:50], y[:50])
    probs = predict(trained, X[50:]).probs
    assert probs is not None
    p = probs.numpy()
    result = evaluate(trained, X[50:], y[50:], chunk_size=16)
    assert result["n"] == 50
    assert result["accuracy"] == pytest.approx(float((p.argmax(1) == y[50:]).mean()))
    assert result["loss"] == pytest.approx(float(-np.log(p[np.arange(50), y[50:]]).mean()), rel=1e-9)
    assert evaluate(trained, np.zeros((0, 5)), np.zeros(0, dtype=np.int64)) == {
        "n": 0,
        "accuracy": None,
        "loss": None,
    }


# --------------------------------------------------------------------------------------------------
# Zero labels
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_zero_labeled_rows_return_the_seeded_init_head(task: Task) -> None:
    n_outputs = 3 if task == "classification" else 2
    config = HeadConfig(input_dim=5, n_outputs=n_outputs, kind="mlp", task=task)
    y = np.zeros(0, dtype=np.int64) if task == "classification" else np.zeros((0, 2))
    calls: list[tuple[int, int]] = []
    trained = train_head(config, np.zeros((0, 5)), y, seed=4, progress=lambda a, b: calls.append((a, b)))
    assert trained.metrics["stop_reason"] == "no_data"
    assert trained.metrics["epochs"] == 0 and trained.metrics["n_train"] == 0
    assert calls == []
    assert states_equal(state(trained), state(build_head(config, seed=4)))
    json.dumps(trained.metrics)
    X = blobs(n=10)[0]
    out = predict(trained, X)
    if task == "classification":
        assert trained.metrics["train_accuracy"] is None
        assert out.probs is not None
        torch.testing.assert_close(out.probs.sum(dim=1), torch.ones(10))
    else:
        assert trained.metrics["train_loss"] is None
        assert out.outputs is not None and out.outputs.shape == (10, 2)


# --------------------------------------------------------------------------------------------------
# Config and checkpoints
# --------------------------------------------------------------------------------------------------


def test_config_round_trips_through_json() -> None:
    config = HeadConfig(input_dim=7, n_outputs=2, kind="linear", task="regression", lr=0.01, seed=9)
    again = HeadConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert HeadConfig.from_dict({"input_dim": 3, "n_outputs": 4}) == HeadConfig(input_dim=3, n_outputs=4)
    # numpy scalars (e.g. from an array of seeds) are stored as Python numbers.
    numpy_fields: dict[str, Any] = {"input_dim": np.int64(3), "n_outputs": 4, "lr": np.float32(0.5)}
    from_numpy = HeadConfig.from_dict({**numpy_fields, "seed": np.int64(2)})
    assert json.loads(json.dumps(from_numpy.to_dict()))["seed"] == 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("kind", "task"), [("mlp", "classification"), ("linear", "regression")])
def test_checkpoint_round_trip_reproduces_predictions_bitwise(kind: HeadKind, task: Task, dtype: torch.dtype) -> None:
    if task == "classification":
        X, y = blobs()
        n_outputs = 3
    else:
        X, y, _ = linear_targets(n=150, d=5)
        n_outputs = 2
    config = HeadConfig(input_dim=5, n_outputs=n_outputs, kind=kind, task=task, lr=3e-2, dtype=DTYPE_NAMES[dtype])
    trained = train_head(config, X, y)
    blob = save_checkpoint(trained)
    assert isinstance(blob, bytes)

    loaded = load_checkpoint(blob)
    assert loaded.config == trained.config
    assert loaded.metrics == trained.metrics
    assert states_equal(state(loaded), state(trained))
    a, b = predict(trained, X), predict(loaded, X)
    assert torch.equal(a.features, b.features)
    for x, z in ((a.probs, b.probs), (a.outputs, b.outputs)):
        assert (x is None) == (z is None)
        if x is not None and z is not None:
            assert torch.equal(x, z)
    # Only tensors and primitives inside: the safe loader reads it.
    payload = torch.load(io.BytesIO(blob), weights_only=True)
    assert payload["config"] == config.to_dict()


def test_load_checkpoint_rejects_garbage_and_foreign_payloads() -> None:
    with pytest.raises(InputDataError, match="not a readable head checkpoint"):
        load_checkpoint(b"not a checkpoint")
    buffer = io.BytesIO()
    torch.save({"weights": torch.zeros(2)}, buffer)
    with pytest.raises(InputDataError, match="format marker"):
        load_checkpoint(buffer.getvalue())
    # Weights that do not fit the stored config.
    trained = train_head(HeadConfig(input_dim=5, n_outputs=3, max_epochs=1), *blobs(n=20))
    payload = torch.load(io.BytesIO(save_checkpoint(trained)), weights_only=True)
    payload["config"]["hidden"] = 64
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    with pytest.raises(InputDataError, match="do not match its config"):
        load_checkpoint(buffer.getvalue())


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_input_data_error() -> None:
    X, y = blobs(n=20)
    config = HeadConfig(input_dim=5, n_outputs=3, max_epochs=1)
    X_nan = X.copy()
    X_nan[3, 1] = np.nan
    X_inf = X.copy()
    X_inf[0, 0] = np.inf
    y_frac = y.astype(np.float64)
    y_frac[0] = 0.5
    cases: list[tuple[Any, Any, str]] = [
        (X_nan, y, "NaN or inf in 1 row"),
        (X_inf, y, "NaN or inf"),
        (X[:, :4], y, "4 columns but the head expects input_dim=5"),
        (X[:, 0], y, "must be 2-D"),
        (X, y[:19], "X has 20 rows"),
        (X, np.where(np.arange(20) == 2, 3, y), r"class indices must lie in \[0, 2\]"),
        (X, np.where(np.arange(20) == 2, -1, y), "class indices must lie in"),
        (X, y_frac, "integer class indices"),
        (X, y.reshape(20, 1), "1-D class indices"),
        (X.tolist(), y, "numpy array or torch tensor"),
    ]
    for bad_X, bad_y, message in cases:
        with pytest.raises(InputDataError, match=message):
            train_head(config, bad_X, bad_y)
    # Integral floats are accepted as class indices.
    train_head(config, X, y.astype(np.float32))

    reg = HeadConfig(input_dim=5, n_outputs=2, task="regression", max_epochs=1)
    targets = np.ones((20, 2))
    targets[5, 1] = np.inf
    with pytest.raises(InputDataError, match="y contains NaN or inf"):
        train_head(reg, X, targets)
    with pytest.raises(InputDataError, match=r"shape \(20, 2\)"):
        train_head(reg, X, np.ones((20, 3)))
    with pytest.raises(InputDataError, match=r"shape \(20, 2\)"):
        train_head(reg, X, np.ones(20))

    trained = train_head(config, X, y)
    with pytest.raises(InputDataError, match="NaN or inf"):
        predict(trained, X_nan)
    with pytest.raises(InputDataError, match="input_dim=5"):
        predict(trained, X[:, :3])
    with pytest.raises(InputDataError, match="class indices"):
        evaluate(trained, X, np.full(20, 7))


def test_bad_parameters_raise_parameter_error() -> None:
    bad_configs: list[tuple[dict[str, Any], str]] = [
        ({"kind": "cnn"}, "head kind"),
        ({"task": "ranking"}, "task must be"),
        ({"n_outputs": 1}, "n_outputs must be >= 2"),
        ({"input_dim": 0}, "input_dim must be >= 1"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"lr": float("nan")}, "lr must be finite"),
        ({"max_epochs": 0}, "max_epochs must be >= 1"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"hidden": True}, "hidden must be an integer"),
        ({"target_train_accuracy": 1.5}, "target_train_accuracy"),
        ({"dtype": "float16"}, "dtype must be one of"),
        ({"seed": -1}, "seed must be >= 0"),
    ]
    for override, message in bad_configs:
        with pytest.raises(ParameterError, match=message):
            HeadConfig.from_dict({"input_dim": 5, "n_outputs": 3, **override})
    # Regression may have a single output.
    assert HeadConfig(input_dim=5, n_outputs=1, task="regression").n_outputs == 1
    with pytest.raises(ParameterError, match="unknown head config field"):
        HeadConfig.from_dict({"input_dim": 5, "n_outputs": 3, "layers": 2})
    with pytest.raises(ParameterError, match="missing required field"):
        HeadConfig.from_dict({"input_dim": 5})
    X, y = blobs(n=20)
    config = HeadConfig(input_dim=5, n_outputs=3, max_epochs=1)
    with pytest.raises(ParameterError, match="seed must be >= 0"):
        train_head(config, X, y, seed=-3)
    with pytest.raises(ParameterError, match="chunk_size must be >= 1"):
        predict(train_head(config, X, y), X, chunk_size=0)


# --------------------------------------------------------------------------------------------------
# Real data
# --------------------------------------------------------------------------------------------------


def test_mlp_on_real_mnist_subset_generalises() -> None:
    data = np.load(shared_data("mnist10k.npz"), allow_pickle=False)
    order = np.random.default_rng(0).permutation(len(data["y"]))  # the file is grouped by class
    X = data["X"][order].reshape(len(order), -1).astype(np.float32) / 255.0
    y = data["y"][order].astype(np.int64)
    config = HeadConfig(input_dim=784, n_outputs=10, kind="mlp")
    trained = train_head(config, X[:1000], y[:1000])
    assert trained.metrics["stop_reason"] == "target_accuracy"
    assert trained.metrics["train_accuracy"] >= 0.99
    result = evaluate(trained, X[1000:2000], y[1000:2000])
    assert result["accuracy"] > 0.8
    assert predict(trained, X[1000:1010]).features.shape == (10, 128)

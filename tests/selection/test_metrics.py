"""selection.metrics against brute-force definitions on small inputs."""

from __future__ import annotations

import numpy as np
import pytest

from selection.metrics import classification_metrics, pca_2d, regression_metrics


def _probs(n: int, k: int, seed: int) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(0, 2, size=(n, k))
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classification_metrics_match_brute_force(seed: int) -> None:
    n, k = 97, 4
    P = _probs(n, k, seed)
    y = np.random.default_rng(seed + 10).integers(0, k, size=n)
    m = classification_metrics(P, y, ["a", "b", "c", "d"])
    pred = P.argmax(axis=1)
    assert m["accuracy"] == pytest.approx(sum(int(pred[i] == y[i]) for i in range(n)) / n)
    f1 = []
    for c in range(k):
        tp = sum(1 for i in range(n) if pred[i] == c and y[i] == c)
        fp = sum(1 for i in range(n) if pred[i] == c and y[i] != c)
        fn = sum(1 for i in range(n) if pred[i] != c and y[i] == c)
        f1.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
        assert m["per_class_recall"]["abcd"[c]] == pytest.approx(tp / (tp + fn))
    assert m["macro_f1"] == pytest.approx(sum(f1) / k)
    assert m["log_loss"] == pytest.approx(-sum(np.log(P[i, y[i]]) for i in range(n)) / n)
    ece = 0.0
    for b in range(15):
        members = [i for i in range(n) if min(int(P[i].max() * 15), 14) == b]
        if members:
            acc = sum(int(pred[i] == y[i]) for i in members) / len(members)
            conf = sum(P[i].max() for i in members) / len(members)
            ece += len(members) / n * abs(acc - conf)
    assert m["ece"] == pytest.approx(ece)


def test_classification_metrics_edge_cases() -> None:
    P = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    m = classification_metrics(P, np.array([0, 2]))
    assert m["accuracy"] == 0.5
    assert m["per_class_recall"] == {"0": 1.0, "1": None, "2": 0.0}  # class 1 has no true item
    assert m["log_loss"] == pytest.approx(-np.log(1e-15) / 2)  # a zero probability is clipped, not infinite
    assert m["macro_f1"] == pytest.approx(1 / 3)  # classes 0 (F1 1), 1 (0: predicted, never true), 2 (0)
    with pytest.raises(ValueError):
        classification_metrics(np.zeros((0, 3)), np.zeros(0, dtype=np.int64))


def test_regression_metrics_match_definitions() -> None:
    rng = np.random.default_rng(0)
    Y = rng.normal(size=(50, 2))
    pred = Y + rng.normal(0, 0.3, size=(50, 2))
    m = regression_metrics(pred, Y)
    assert m["rmse"] == pytest.approx(np.sqrt(np.mean((pred - Y) ** 2)))
    assert m["mae"] == pytest.approx(np.mean(np.abs(pred - Y)))
    r2 = [1 - np.sum((pred[:, j] - Y[:, j]) ** 2) / np.sum((Y[:, j] - Y[:, j].mean()) ** 2) for j in range(2)]
    assert m["r2"] == pytest.approx(np.mean(r2))
    assert regression_metrics(np.ones((3, 1)), np.ones((3, 1)))["r2"] is None  # constant targets


def test_pca_2d_matches_eigenvectors_of_the_covariance() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 5)) @ np.diag([5.0, 3.0, 1.0, 0.5, 0.1])
    xy = pca_2d(X)
    assert xy.shape == (300, 2) and xy.dtype == np.float32
    w, v = np.linalg.eigh(np.cov(X - X.mean(axis=0), rowvar=False))
    top = v[:, np.argsort(w)[::-1][:2]]
    ref = (X - X.mean(axis=0)) @ top
    for j in range(2):  # equal up to the sign of each axis
        assert min(np.abs(xy[:, j] - ref[:, j]).max(), np.abs(xy[:, j] + ref[:, j]).max()) < 1e-3
    assert np.allclose(pca_2d(X, np.arange(300)), xy)
    assert pca_2d(X[:, :1]).shape == (300, 2)

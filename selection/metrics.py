"""Quality of a trained head on held-out items, and a 2-D picture of its feature space (pure numpy).

Classification: accuracy, macro-F1 (mean over classes of F1, a class with no true and no predicted
item left out of the mean), log loss (mean negative log-probability of the true class, probabilities
clipped at 1e-15), expected calibration error (15 equal-width confidence bins, weighted by their
size) and recall per class. Regression: RMSE, MAE (both over every output) and R² (1 - SSE / SST,
averaged over outputs; an output with zero variance in the targets is left out).
"""

from __future__ import annotations

from typing import Any

import numpy as np

ECE_BINS = 15
_EPS = 1e-15


def classification_metrics(probs: np.ndarray, y: np.ndarray, classes: list[str] | None = None) -> dict[str, Any]:
    """Scores of predicted class probabilities against true classes.

    Args:
        probs: ``n x k`` class probabilities (rows sum to 1).
        y: ``(n,)`` true class indices in ``[0, k)``.
        classes: ``k`` class names for ``per_class_recall`` (default: the indices as strings).

    Returns:
        ``{"accuracy", "macro_f1", "log_loss", "ece", "per_class_recall": {class: recall or None}}``;
        a class without true items has recall ``None``.
    """
    P = np.asarray(probs, dtype=np.float64)  # n x k
    t = np.asarray(y, dtype=np.int64)  # n
    n, k = P.shape
    if n == 0:
        raise ValueError("no items to score")
    names = classes if classes is not None else [str(c) for c in range(k)]
    pred = P.argmax(axis=1)  # n
    correct = pred == t
    tp = np.bincount(t[correct], minlength=k).astype(np.float64)  # k
    true_n = np.bincount(t, minlength=k).astype(np.float64)  # k
    pred_n = np.bincount(pred, minlength=k).astype(np.float64)  # k
    present = (true_n + pred_n) > 0
    f1 = np.where(present, 2 * tp / np.maximum(true_n + pred_n, 1), 0.0)
    recall = [float(tp[c] / true_n[c]) if true_n[c] > 0 else None for c in range(k)]
    p_true = np.clip(P[np.arange(n), t], _EPS, 1.0)
    conf = P.max(axis=1)
    bins = np.minimum((conf * ECE_BINS).astype(np.int64), ECE_BINS - 1)  # n
    ece = 0.0
    for b in range(ECE_BINS):
        in_bin = bins == b
        if in_bin.any():
            ece += in_bin.sum() / n * abs(float(correct[in_bin].mean()) - float(conf[in_bin].mean()))
    return {
        "accuracy": float(correct.mean()),
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "log_loss": float(-np.log(p_true).mean()),
        "ece": float(ece),
        "per_class_recall": dict(zip(names, recall, strict=True)),
    }


def regression_metrics(pred: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Scores of predicted targets.

    Args:
        pred: ``n x m`` predictions.
        y: ``n x m`` true targets.

    Returns:
        ``{"rmse", "mae", "r2"}`` (``r2`` is ``None`` when no output varies in ``y``).
    """
    P = np.asarray(pred, dtype=np.float64).reshape(len(pred), -1)  # n x m
    Y = np.asarray(y, dtype=np.float64).reshape(P.shape)  # n x m
    if P.shape[0] == 0:
        raise ValueError("no items to score")
    err = P - Y
    sse = (err**2).sum(axis=0)  # m
    sst = ((Y - Y.mean(axis=0)) ** 2).sum(axis=0)  # m
    varies = sst > 0
    return {
        "rmse": float(np.sqrt((err**2).mean())),
        "mae": float(np.abs(err).mean()),
        "r2": float((1 - sse[varies] / sst[varies]).mean()) if varies.any() else None,
    }


def pca_2d(features: np.ndarray, fit_rows: np.ndarray | None = None) -> np.ndarray:
    """Project rows onto the first two principal components (of ``fit_rows`` when given).

    Args:
        features: ``n x d`` features.
        fit_rows: optional row indices the components are fitted on (a sample; all rows by default).

    Returns:
        ``n x 2`` float32 coordinates; the sign of each axis is fixed (largest loading positive) so maps
        of successive checkpoints do not flip at random.
    """
    F = np.asarray(features, dtype=np.float64)  # n x d
    fit = F if fit_rows is None else F[fit_rows]
    mean = fit.mean(axis=0)  # d
    if F.shape[1] == 1:
        out = np.zeros((F.shape[0], 2))
        out[:, 0] = F[:, 0] - mean[0]
        return out.astype(np.float32)
    # Thin SVD of the centred sample: the right singular vectors are the components.
    _, _, vt = np.linalg.svd(fit - mean, full_matrices=False)  # vt: r x d
    comps = np.zeros((2, F.shape[1]))
    r = min(2, vt.shape[0])
    comps[:r] = vt[:r]
    signs = np.sign(comps[np.arange(2), np.abs(comps).argmax(axis=1)])
    comps *= np.where(signs == 0, 1.0, signs)[:, None]
    return ((F - mean) @ comps.T).astype(np.float32)  # n x 2

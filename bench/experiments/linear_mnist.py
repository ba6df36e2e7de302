"""Experiment 1: linear classification on MNIST in a learned and in a random 128-d representation.

The paper's "comparing objectives" experiment (Sec. 4, Figures detPlot and projPlot). mnist10k is
shuffled once (data seed 0) and split in half:

* ``learned``: an MLP (one hidden ReLU layer of 128) is fit on the first half; the second half is
  embedded by its first layer (the ReLU activations);
* ``random``: the normalised pixels (``x / 255`` centred by the pixel mean of the first half and
  divided by its overall standard deviation) of the second half times a ``784 x 128`` standard
  Gaussian matrix divided by ``sqrt(784)``.

Both representations hold the same rows; the first ``--pool`` of them are the pool, the last
``--test`` the test set. A linear head (multinomial logistic regression) starts from ``--m0`` random
labels and gains ``--batch`` labels for ``--rounds`` rounds. BAIT and its ablation run forward only
(``oversample=1``), as in the paper, so that they compare with the greedy log-det variants on
objectives alone.

    python -m bench.experiments.linear_mnist                  # full: 5 seeds, both representations
    python -m bench.experiments.linear_mnist --smoke --out /tmp/lin
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from bench.experiments.common import (
    Setting,
    Split,
    StrategySpec,
    add_size_options,
    add_strategy_options,
    bait_params,
    chosen_strategies,
    experiment_parser,
    run_and_plot,
    sizes_from,
    start_run,
)
from bench.suite.shared_data import load_npz
from selection.heads import HeadConfig, train_head

EXPERIMENT = "linear_mnist"
REPRESENTATIONS = ("learned", "random")


def strategies(lam: float | None = None, convention: str = "reference") -> list[StrategySpec]:
    """The paper's eight agents for this experiment (BAIT forward only).

    ``lam`` is BAIT's ridge (``None``: the library default); the log-det strategies keep theirs (1).
    """
    params = bait_params(lam, convention, oversample=1)
    return [
        StrategySpec("bait", "bait", params),
        StrategySpec("bait_nofisher", "bait_nofisher", params),
        StrategySpec("logdet_rank1", "logdet_rank1"),
        StrategySpec("logdet_fisher", "logdet_fisher"),
        StrategySpec("badge", "badge"),
        StrategySpec("coreset", "coreset"),
        StrategySpec("confidence", "confidence"),
        StrategySpec("random", "random"),
    ]


def representations(
    *, pool: int, test: int, rep_rows: int, rep_epochs: int, dim: int = 128
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``name -> (Z, y)``: the ``pool + test`` rows of the second half in each representation.

    Args:
        pool: pool rows.
        test: test rows.
        rep_rows: rows of the first half the representation MLP is fit on.
        rep_epochs: its epoch cap.
        dim: representation width.
    """
    data = load_npz("mnist10k.npz")
    X = data["X"].reshape(len(data["X"]), -1).astype(np.float32) / 255.0
    y = data["y"].astype(np.int64)
    order = np.random.default_rng(0).permutation(len(X))  # the file is grouped by class
    X, y = X[order], y[order]
    half = len(X) // 2
    if rep_rows > half or pool + test > len(X) - half:
        raise ValueError(f"rep_rows <= {half} and pool + test <= {len(X) - half} are required")
    X_fit, y_fit = X[:rep_rows], y[:rep_rows]
    X_al, y_al = X[half : half + pool + test], y[half : half + pool + test]

    mlp = HeadConfig(input_dim=X.shape[1], n_outputs=10, kind="mlp", hidden=dim, max_epochs=rep_epochs)
    trained = train_head(mlp, X_fit, y_fit, seed=0)
    with torch.no_grad():
        learned = trained.module.features(torch.from_numpy(X_al)).numpy().astype(np.float32)

    mean = X_fit.mean(axis=0)
    scale = float((X_fit - mean).std())
    G = np.random.default_rng(1).standard_normal((X.shape[1], dim)).astype(np.float32)
    random = ((X_al - mean) / scale) @ G / np.float32(np.sqrt(X.shape[1]))
    return {"learned": (learned, y_al), "random": (random.astype(np.float32), y_al)}


def settings(
    reps: Sequence[str],
    *,
    pool: int,
    test: int,
    m0: int,
    batch: int,
    rounds: int,
    max_epochs: int,
    rep_rows: int,
    rep_epochs: int = 200,
    dim: int = 128,
    lr: float = 1e-3,
) -> list[Setting]:
    """One :class:`Setting` per representation (see :func:`representations` for the arguments)."""
    data = representations(pool=pool, test=test, rep_rows=rep_rows, rep_epochs=rep_epochs, dim=dim)
    out = []
    for name in reps:
        Z, y = data[name]
        split = Split(Z[:pool], y[:pool], Z[pool:], y[pool:], "classification", 10)
        head = HeadConfig(input_dim=Z.shape[1], n_outputs=10, kind="linear", lr=lr, max_epochs=max_epochs)
        out.append(Setting(EXPERIMENT, name, split, head, m0=m0, batch=batch, rounds=rounds))
    return out


#: Full size: 40 rounds of 10 (the paper ran 50) on a 3,000-row pool (2,000 test rows), 128-d
#: representations; 40 rounds keep the whole run within this 2-core machine's budget.
FULL = {
    "pool": 3000,
    "test": 2000,
    "m0": 10,
    "batch": 10,
    "rounds": 40,
    "max_epochs": 500,
    "rep_rows": 5000,
    "rep_epochs": 200,
    "dim": 128,
}
#: Smoke size: 16-d representations (BAIT's k d x k d matrices stay tiny), a 150-row pool, 3 rounds.
SMOKE = {
    "pool": 150,
    "test": 100,
    "m0": 10,
    "batch": 5,
    "rounds": 3,
    "max_epochs": 5,
    "rep_rows": 300,
    "rep_epochs": 5,
    "dim": 16,
}


def build_parser() -> argparse.ArgumentParser:
    p = experiment_parser(__doc__, EXPERIMENT, "tiny pool and 3 rounds: checks the harness in seconds")
    p.add_argument("--reps", default=",".join(REPRESENTATIONS), help="representations, comma-separated")
    add_strategy_options(p, "Adam learning rate of the head")
    add_size_options(p, FULL)
    return p


def main(argv: Sequence[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    size = sizes_from(args, SMOKE if args.smoke else FULL)
    specs = chosen_strategies(strategies(lam=args.lam), args.strategies)
    reps = [r for r in args.reps.split(",") if r]
    out, seeds = start_run(args, EXPERIMENT, argv, size)
    grid = settings(reps, lr=args.lr, **size)
    title = "Linear classification on MNIST representations"
    return run_and_plot(grid, specs, seeds, out, desc=EXPERIMENT, quiet=args.quiet, title=title)


if __name__ == "__main__":
    main()

"""Experiment 3: active regression (paper Sec. 5.3): BAIT, Core-set and random.

Configurations:

* ``mnist-mlp``: MNIST as 10-output regression onto one-hot labels, the paper's MLP (128 hidden);
* ``mnist-linear``: the same with a linear model on the 784 pixels;
* ``diamonds-mlp``: log price of ggplot2's diamonds from its 9 features (standardised by the pool),
  the target centred by the pool mean (so the RMSE is in log-price units).

The heads minimise squared error from scratch every round until the training loss stops improving
(relative ``1e-4`` for 10 epochs) or the epoch cap. BAIT's regression Fisher is ``x x^T ⊗ Σ^{-1}``;
with isotropic noise the ``Σ`` factor only scales ``tr(M^{-1} F)``, so the library's single-output
regression path (``I(x) = x x^T`` on the penultimate features) selects exactly what the multi-output
objective would. The metric is the test RMSE (lower is better).

    python -m bench.experiments.regression
    python -m bench.experiments.regression --smoke --out /tmp/reg
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.experiments.common import (
    Setting,
    Split,
    StrategySpec,
    add_strategy_options,
    bait_params,
    chosen_strategies,
    experiment_parser,
    run_and_plot,
    start_run,
)
from bench.suite.shared_data import load_npz
from selection.heads import HeadConfig

EXPERIMENT = "regression"
CONFIGS = ("mnist-mlp", "mnist-linear", "diamonds-mlp")


def strategies(lam: float | None = None, convention: str = "reference") -> list[StrategySpec]:
    """BAIT (forward-backward), Core-set and random: the strategies that support regression."""
    return [
        StrategySpec("bait", "bait", bait_params(lam, convention, oversample=2)),
        StrategySpec("coreset", "coreset"),
        StrategySpec("random", "random"),
    ]


def mnist_onehot(pool: int, test: int) -> Split:
    """MNIST pixels ``x / 255`` with one-hot float targets (``n x 10``)."""
    data = load_npz("mnist10k.npz")
    X = data["X"].reshape(len(data["X"]), -1).astype(np.float32) / 255.0
    order = np.random.default_rng(0).permutation(len(X))
    if pool + test > len(X):
        raise ValueError(f"pool + test must be <= {len(X)}")
    tr, te = order[:pool], order[len(X) - test :]
    Y = np.eye(10, dtype=np.float32)[data["y"].astype(np.int64)]
    return Split(X[tr], Y[tr], X[te], Y[te], "regression", 10)


def diamonds(pool: int, test: int) -> Split:
    """Diamonds features standardised by the pool; log price centred by the pool mean (``n x 1``)."""
    data = load_npz("diamonds.npz")
    X, y = data["X"].astype(np.float64), data["y_log"].astype(np.float64)
    order = np.random.default_rng(0).permutation(len(X))
    if pool + test > len(X):
        raise ValueError(f"pool + test must be <= {len(X)}")
    tr, te = order[:pool], order[len(X) - test :]
    mu, sd = X[tr].mean(axis=0), X[tr].std(axis=0) + 1e-12
    ym = y[tr].mean()

    def xs(rows: np.ndarray) -> np.ndarray:
        return ((X[rows] - mu) / sd).astype(np.float32)

    def ys(rows: np.ndarray) -> np.ndarray:
        return (y[rows] - ym).astype(np.float32).reshape(-1, 1)

    return Split(xs(tr), ys(tr), xs(te), ys(te), "regression", 1)


FULL = {
    "mnist-mlp": {"pool": 8000, "test": 2000, "m0": 100, "batch": 10, "rounds": 20, "max_epochs": 200, "hidden": 128},
    "mnist-linear": {
        "pool": 8000,
        "test": 2000,
        "m0": 100,
        "batch": 10,
        "rounds": 20,
        "max_epochs": 200,
        "hidden": 128,
    },
    "diamonds-mlp": {"pool": 8000, "test": 2000, "m0": 20, "batch": 10, "rounds": 20, "max_epochs": 200, "hidden": 128},
}
SMOKE = {
    "mnist-mlp": {"pool": 150, "test": 60, "m0": 10, "batch": 5, "rounds": 3, "max_epochs": 3, "hidden": 16},
    "mnist-linear": {"pool": 150, "test": 60, "m0": 10, "batch": 5, "rounds": 3, "max_epochs": 3, "hidden": 16},
    "diamonds-mlp": {"pool": 150, "test": 60, "m0": 10, "batch": 5, "rounds": 3, "max_epochs": 3, "hidden": 16},
}


def settings(configs: Sequence[str], sizes: dict[str, dict[str, int]], *, lr: float = 1e-3) -> list[Setting]:
    """One :class:`Setting` per configuration name."""
    out = []
    for name in configs:
        s = sizes[name]
        dataset, kind = name.split("-")
        split = mnist_onehot(s["pool"], s["test"]) if dataset == "mnist" else diamonds(s["pool"], s["test"])
        head = HeadConfig(
            input_dim=split.X_pool.shape[1],
            n_outputs=split.n_outputs,
            kind="mlp" if kind == "mlp" else "linear",
            task="regression",
            lr=lr,
            max_epochs=s["max_epochs"],
            hidden=s["hidden"],
        )
        out.append(Setting(EXPERIMENT, name, split, head, m0=s["m0"], batch=s["batch"], rounds=s["rounds"]))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = experiment_parser(__doc__, EXPERIMENT, "tiny pools, 3 rounds: checks the harness in seconds")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ",".join(CONFIGS))
    p.add_argument("--rounds", type=int, default=None, help="override the rounds of every configuration")
    add_strategy_options(p, "Adam learning rate")
    return p


def main(argv: Sequence[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    sizes = {k: dict(v) for k, v in (SMOKE if args.smoke else FULL).items()}
    if args.rounds is not None:
        for s in sizes.values():
            s["rounds"] = args.rounds
    specs = chosen_strategies(strategies(lam=args.lam), args.strategies)
    configs = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"unknown configs {unknown}; expected a subset of {CONFIGS}")
    out, seeds = start_run(args, EXPERIMENT, argv, {"sizes": sizes})
    grid = settings(configs, sizes, lr=args.lr)
    title = "Active regression (test RMSE, lower is better)"
    return run_and_plot(grid, specs, seeds, out, desc=EXPERIMENT, quiet=args.quiet, title=title)


if __name__ == "__main__":
    main()

"""Experiment 2: MLP classification on MNIST and Fashion-MNIST, batch sizes 10, 100 and 1,000.

The paper's deep-classification setting (Sec. 5.2) on raw pixels (``x / 255``, 784-d) with its MLP
(one hidden ReLU layer of 128 units), retrained from scratch every round until 99% training
accuracy (or the epoch cap), 100 initial random labels, five seeds. BAIT runs forward-backward
(``oversample=2``) with the library's default ridge (see experiment 5).

Pools are subsets so that the full grid fits a few hours on two CPU cores: MNIST's 10,000 images are
shuffled (data seed 0) into ``--pool`` pool rows and ``--test`` test rows; Fashion-MNIST's pool is
drawn from its 60,000 training images and its test set from the official 10,000 test images.

    python -m bench.experiments.mlp_classification                # full grid
    python -m bench.experiments.mlp_classification --smoke --out /tmp/mlp
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
from selection.heads import HeadConfig

EXPERIMENT = "mlp_classification"
DATASETS = ("mnist", "fashion")


def strategies(lam: float | None = None, convention: str = "reference") -> list[StrategySpec]:
    """BAIT (forward-backward) and the paper's baselines for deep classification."""
    return [
        StrategySpec("bait", "bait", bait_params(lam, convention, oversample=2)),
        StrategySpec("badge", "badge"),
        StrategySpec("coreset", "coreset"),
        StrategySpec("confidence", "confidence"),
        StrategySpec("random", "random"),
    ]


def load_split(dataset: str, pool: int, test: int) -> Split:
    """Pool and test set of ``dataset`` (``"mnist"`` or ``"fashion"``) as flattened ``x / 255`` pixels."""
    rng = np.random.default_rng(0)
    if dataset == "mnist":
        data = load_npz("mnist10k.npz")
        X, y = data["X"], data["y"]
        order = rng.permutation(len(X))  # the file is grouped by class
        if pool + test > len(X):
            raise ValueError(f"pool + test must be <= {len(X)}")
        tr, te = order[:pool], order[len(X) - test :]
        X_tr, y_tr, X_te, y_te = X[tr], y[tr], X[te], y[te]
    elif dataset == "fashion":
        data = load_npz("fashion_mnist.npz")
        tr = rng.permutation(len(data["X"]))[:pool]
        te = rng.permutation(len(data["X_test"]))[:test]
        X_tr, y_tr, X_te, y_te = data["X"][tr], data["y"][tr], data["X_test"][te], data["y_test"][te]
    else:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {DATASETS}")

    def flat(a: np.ndarray) -> np.ndarray:
        return (a.reshape(len(a), -1).astype(np.float32) / 255.0).astype(np.float32)

    return Split(flat(X_tr), y_tr.astype(np.int64), flat(X_te), y_te.astype(np.int64), "classification", 10)


#: Rounds per batch size in the full run (labels at the end: 100 + rounds x B).
FULL_ROUNDS = {10: 10, 100: 5, 1000: 2}
FULL = {"pool": 3000, "test": 2000, "m0": 100, "max_epochs": 100, "hidden": 128}
SMOKE_ROUNDS = {5: 2}
SMOKE = {"pool": 200, "test": 100, "m0": 20, "max_epochs": 3, "hidden": 16}


def settings(
    datasets: Sequence[str],
    rounds: dict[int, int],
    *,
    pool: int,
    test: int,
    m0: int,
    max_epochs: int,
    lr: float = 1e-3,
    hidden: int = 128,
) -> list[Setting]:
    """One :class:`Setting` per (dataset, batch size)."""
    out = []
    for dataset in datasets:
        split = load_split(dataset, pool, test)
        head = HeadConfig(
            input_dim=split.X_pool.shape[1], n_outputs=10, kind="mlp", hidden=hidden, lr=lr, max_epochs=max_epochs
        )
        for batch, n_rounds in rounds.items():
            out.append(Setting(EXPERIMENT, f"{dataset}-B{batch}", split, head, m0=m0, batch=batch, rounds=n_rounds))
    return out


def parse_rounds(text: str) -> dict[int, int]:
    """``"10:30,100:20"`` -> ``{10: 30, 100: 20}`` (batch size: rounds)."""
    pairs = (item.split(":") for item in text.split(",") if item)
    return {int(b): int(r) for b, r in pairs}


def build_parser() -> argparse.ArgumentParser:
    p = experiment_parser(__doc__, EXPERIMENT, "tiny pool, few rounds: checks the harness in seconds")
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated subset of mnist,fashion")
    p.add_argument("--rounds", default=None, help="batch:rounds pairs, e.g. '10:30,100:20,1000:5'")
    add_strategy_options(p, "Adam learning rate of the MLP")
    add_size_options(p, FULL)
    return p


def main(argv: Sequence[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    size = sizes_from(args, SMOKE if args.smoke else FULL)
    rounds = parse_rounds(args.rounds) if args.rounds else (SMOKE_ROUNDS if args.smoke else FULL_ROUNDS)
    specs = chosen_strategies(strategies(lam=args.lam), args.strategies)
    datasets = [d for d in args.datasets.split(",") if d]
    out, seeds = start_run(args, EXPERIMENT, argv, {**size, "rounds": rounds})
    grid = settings(datasets, rounds, lr=args.lr, **size)
    return run_and_plot(grid, specs, seeds, out, desc=EXPERIMENT, quiet=args.quiet, title="MLP classification")


if __name__ == "__main__":
    main()

"""Experiment 5: BAIT's weighting conventions and ridge, on the settings of experiments 1 and 2.

Six BAIT variants, ``convention`` in {reference, paper, sum} x ``lam`` in {0.01, 1} (named
``bait-<convention>-lam<lam>``), plus random (which sets the penalty budgets), on

* experiment 1's two representations (linear head, forward-only BAIT as there), and
* experiment 2's MNIST MLP with batch size 100 (forward-backward BAIT as there).

Writes ``results.csv`` and ``curves.png`` like the other experiments, then ``ranking.md``/``ranking.csv``:
per variant, the penalty-matrix column mean among the variants (how often it is significantly
beaten, lower is better) and its mean test accuracy over all rounds and configurations (the
normalised area under its learning curves), best first.

    python -m bench.experiments.conventions
    python -m bench.experiments.conventions --smoke --out /tmp/conv
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.experiments import linear_mnist, mlp_classification
from bench.experiments.common import (
    ResultStore,
    Setting,
    StrategySpec,
    curves,
    experiment_parser,
    plot_curves,
    run_grid,
    start_run,
)
from bench.experiments.penalty import write_outputs
from bench.experiments.penalty_matrix import penalty_matrix

EXPERIMENT = "conventions"
CONVENTIONS = ("reference", "paper", "sum")
LAMS = (0.01, 1.0)


def variant_name(convention: str, lam: float) -> str:
    return f"bait-{convention}-lam{lam:g}"


def variants(oversample: float) -> list[StrategySpec]:
    """The six BAIT variants and random."""
    out = [
        StrategySpec(variant_name(c, lam), "bait", {"convention": c, "lam": lam, "oversample": oversample})
        for c in CONVENTIONS
        for lam in LAMS
    ]
    return [*out, StrategySpec("random", "random")]


def _relabel(settings: list[Setting], prefix: str) -> list[Setting]:
    return [
        Setting(EXPERIMENT, f"{prefix}-{s.config}", s.split, s.head, m0=s.m0, batch=s.batch, rounds=s.rounds)
        for s in settings
    ]


FULL: dict[str, dict[str, Any]] = {
    "linear": {
        "reps": ["random"],
        "pool": 3000,
        "test": 2000,
        "m0": 10,
        "batch": 10,
        "rounds": 20,
        "max_epochs": 500,
        "rep_rows": 5000,
    },
    "mlp": {"pool": 3000, "test": 2000, "m0": 100, "max_epochs": 100, "hidden": 128, "rounds": {100: 5}},
}
SMOKE: dict[str, dict[str, Any]] = {
    "linear": {
        "reps": ["random"],
        "pool": 150,
        "test": 100,
        "m0": 10,
        "batch": 5,
        "rounds": 2,
        "max_epochs": 5,
        "rep_rows": 300,
        "rep_epochs": 5,
        "dim": 16,
    },
    "mlp": {"pool": 200, "test": 100, "m0": 20, "max_epochs": 3, "rounds": {5: 2}, "hidden": 16},
}


def ranking(rows: list[dict[str, object]], names: Sequence[str]) -> list[tuple[str, float, float]]:
    """``(variant, column mean, mean accuracy)`` for each BAIT variant, best (lowest column mean,
    then highest accuracy) first."""
    res = penalty_matrix(rows, strategies=list(names), reference="random")
    col = dict(zip(res.strategies, res.column_means, strict=True))
    acc: dict[str, list[float]] = {n: [] for n in names}
    for per_cfg in curves(rows).values():
        for n, c in per_cfg.items():
            if n in acc:
                acc[n].append(float(np.mean(c.mean)))
    table = [(n, float(col[n]), float(np.mean(acc[n])) if acc[n] else float("nan")) for n in names if n != "random"]
    return sorted(table, key=lambda r: (r[1], -r[2]))


def build_parser() -> argparse.ArgumentParser:
    p = experiment_parser(__doc__, EXPERIMENT, "tiny pools, 2 rounds: checks the harness in seconds")
    p.add_argument("--parts", default="linear,mlp", help="which settings: linear (exp. 1), mlp (exp. 2)")
    return p


def main(argv: Sequence[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    size = SMOKE if args.smoke else FULL
    parts = [p for p in args.parts.split(",") if p]
    out, seeds = start_run(args, EXPERIMENT, argv, size)
    store = ResultStore(out)
    names: list[str] = []
    if "linear" in parts:
        lin = dict(size["linear"])
        reps = lin.pop("reps")
        grid = _relabel(linear_mnist.settings(reps, lr=1e-3, **lin), "linear")
        specs = variants(oversample=1)
        run_grid(grid, specs, seeds, store, desc=f"{EXPERIMENT}/linear", quiet=args.quiet)
        names = [s.name for s in specs]
    if "mlp" in parts:
        mlp = dict(size["mlp"])
        rounds = mlp.pop("rounds")
        grid = _relabel(mlp_classification.settings(["mnist"], rounds, **mlp), "mlp")
        specs = variants(oversample=2)
        run_grid(grid, specs, seeds, store, desc=f"{EXPERIMENT}/mlp", quiet=args.quiet)
        names = [s.name for s in specs]
    rows = store.rows()
    plot_curves(rows, out / "curves.png", title="BAIT conventions and ridge")
    res = penalty_matrix(rows, strategies=names, reference="random")
    write_outputs(res, out, title="Penalty matrix of the BAIT variants")
    table = ranking(rows, names)
    with (out / "ranking.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "penalty_column_mean", "mean_accuracy"])
        for n, c, a in table:
            w.writerow([n, f"{c:.4f}", f"{a:.4f}"])
    lines = ["| variant | penalty column mean (lower is better) | mean test accuracy over rounds |", "|---|---|---|"]
    lines += [f"| {n} | {c:.3f} | {a:.4f} |" for n, c, a in table]
    (out / "ranking.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return out


if __name__ == "__main__":
    main()

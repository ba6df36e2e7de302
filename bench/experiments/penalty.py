"""Experiment 4: the paper's pairwise penalty matrix over the results of experiments 1-3.

Reads the ``results.csv`` of each experiment, finds the labeling budgets of every (experiment, config)
and accumulates the matrix (see :mod:`bench.experiments.penalty_matrix`). Writes into ``--out``:

* ``penalty_matrix.csv`` (the matrix, column means as the last row) and ``penalty_matrix.md``;
* ``budgets.csv``: per experiment, ``M_0``, ``B``, the labels where random converged, the budgets;
* ``wins.csv``: every significant comparison (experiment, budget, winner, loser, t);
* ``penalty_matrix.png``: the heat map.

    python -m bench.experiments.penalty
    python -m bench.experiments.penalty --inputs docs/results/linear_mnist/results.csv --out /tmp/pen
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path

from bench.experiments.common import RESULTS_ROOT, read_results
from bench.experiments.penalty_matrix import PenaltyResult, format_table, penalty_matrix, plot_matrix

EXPERIMENT = "penalty"
DEFAULT_INPUTS = tuple(RESULTS_ROOT / e / "results.csv" for e in ("linear_mnist", "mlp_classification", "regression"))


def write_outputs(res: PenaltyResult, out: Path, *, title: str = "Pairwise penalty matrix") -> None:
    """The CSV, Markdown, budgets, wins and heat-map files of ``res`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "penalty_matrix.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["beats \\ beaten", *res.strategies])
        for name, row in zip(res.strategies, res.matrix, strict=True):
            w.writerow([name, *(f"{v:.4f}" for v in row)])
        w.writerow(["column_mean", *(f"{v:.4f}" for v in res.column_means)])
    (out / "penalty_matrix.md").write_text(format_table(res) + "\n")
    with (out / "budgets.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["experiment", "m0", "batch", "converged_labels", "z", "budgets"])
        for e in res.experiments:
            w.writerow([e.experiment, e.m0, e.batch, e.converged_labels, len(e.budgets), " ".join(map(str, e.budgets))])
    with (out / "wins.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["experiment", "budget", "winner", "loser", "t"])
        for e in res.experiments:
            for budget, a, b, t in e.wins:
                w.writerow([e.experiment, budget, a, b, f"{t:.3f}"])
    plot_matrix(res, out / "penalty_matrix.png", title=title)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="*", type=Path, default=None, help="results.csv files (default: experiments 1-3)")
    p.add_argument("--out", type=Path, default=None, help=f"output folder (default {RESULTS_ROOT / EXPERIMENT})")
    p.add_argument("--seeds", default=None, help="restrict to these seeds ('0-4', '0,3'); default all")
    p.add_argument("--reference", default="random", help="strategy whose convergence sets the budgets")
    p.add_argument("--tol", type=float, default=0.01, help="relative closeness to the final value")
    p.add_argument("--threshold", type=float, default=None, help="fixed t threshold (default: t_0.975 at N-1 dof)")
    p.add_argument("--smoke", action="store_true", help="accepted for symmetry; the computation is always fast")
    return p


def main(argv: Sequence[str] | None = None) -> Path:
    from bench.experiments.common import parse_seeds

    args = build_parser().parse_args(argv)
    inputs = [Path(p) for p in (args.inputs if args.inputs else DEFAULT_INPUTS)]
    missing = [str(p) for p in inputs if not p.is_file()]
    if missing:
        raise SystemExit(f"missing results: {missing}; run the experiments first")
    rows = [r for p in inputs for r in read_results(p)]
    if args.seeds:
        keep = set(parse_seeds(args.seeds))
        rows = [r for r in rows if r["seed"] in keep]
    res = penalty_matrix(rows, reference=args.reference, tol=args.tol, threshold=args.threshold)
    out = args.out or RESULTS_ROOT / EXPERIMENT
    write_outputs(res, out)
    print(format_table(res))
    return out


if __name__ == "__main__":
    main()

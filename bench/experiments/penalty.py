"""Experiment 4: the paper's pairwise penalty matrix over the results of experiments 1-3.

Reads the ``results.csv`` of each experiment, finds the labeling budgets of every (experiment, config)
and accumulates the matrix (see :mod:`bench.experiments.penalty_matrix`). Writes into ``--out``:

* ``penalty_matrix.csv`` (the matrix, column means as the last row) and ``penalty_matrix.md``;
* ``budgets.csv``: per experiment, ``M_0``, ``B``, the labels where random converged, the budgets;
* ``wins.csv``: every significant comparison (experiment, budget, winner, loser, t);
* ``penalty_matrix.png``: the heat map.

``--all-rounds`` uses every round (after round 0) of every config as a budget, not only the paper's
``M_0 + 2^k B`` up to random's convergence, so late-round losses show; it writes the same files
into ``docs/results/penalty/all_rounds/`` (unless ``--out``) plus ``losses.csv`` and ``losses.md``:
every significant comparison that the ``--focus`` strategy (default ``bait``) lost.

    python -m bench.experiments.penalty
    python -m bench.experiments.penalty --all-rounds
    python -m bench.experiments.penalty --inputs docs/results/linear_mnist/results.csv --out /tmp/pen
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path

from bench.experiments.common import RESULTS_ROOT, read_results
from bench.experiments.penalty_matrix import (
    Loss,
    PenaltyResult,
    format_table,
    losses,
    penalty_matrix,
    plot_matrix,
)

EXPERIMENT = "penalty"
ALL_ROUNDS = "all_rounds"
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


def format_losses(lost: Sequence[Loss], focus: str) -> str:
    """``lost`` as a Markdown table (or a sentence when there are none)."""
    if not lost:
        return f"`{focus}` loses no significant comparison."
    lines = [
        f"Significant comparisons lost by `{focus}` ({len(lost)}):",
        "",
        "| experiment | config | labels | round | winner | t |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {x.experiment} | {x.config} | {x.budget} | {x.round} | {x.winner} | {x.t:.2f} |" for x in lost]
    return "\n".join(lines)


def write_losses(lost: Sequence[Loss], out: Path, focus: str) -> None:
    """``losses.csv`` and ``losses.md`` of ``lost`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "losses.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["experiment", "config", "budget", "round", "loser", "winner", "t"])
        for x in lost:
            w.writerow([x.experiment, x.config, x.budget, x.round, focus, x.winner, f"{x.t:.3f}"])
    (out / "losses.md").write_text(format_losses(lost, focus) + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="*", type=Path, default=None, help="results.csv files (default: experiments 1-3)")
    p.add_argument("--out", type=Path, default=None, help=f"output folder (default {RESULTS_ROOT / EXPERIMENT})")
    p.add_argument("--seeds", default=None, help="restrict to these seeds ('0-4', '0,3'); default all")
    p.add_argument("--reference", default="random", help="strategy whose convergence sets the budgets")
    p.add_argument("--tol", type=float, default=0.01, help="relative closeness to the final value")
    p.add_argument("--threshold", type=float, default=None, help="fixed t threshold (default: t_0.975 at N-1 dof)")
    p.add_argument(
        "--all-rounds",
        action="store_true",
        help=f"every round of every config is a budget; default out {RESULTS_ROOT / EXPERIMENT / ALL_ROUNDS}",
    )
    p.add_argument("--focus", default="bait", help="with --all-rounds: list this strategy's losses")
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
    res = penalty_matrix(
        rows, reference=args.reference, tol=args.tol, threshold=args.threshold, all_rounds=args.all_rounds
    )
    if not args.all_rounds:
        out = args.out or RESULTS_ROOT / EXPERIMENT
        write_outputs(res, out)
        print(format_table(res))
        return out
    out = args.out or RESULTS_ROOT / EXPERIMENT / ALL_ROUNDS
    write_outputs(res, out, title="Pairwise penalty matrix, every round")
    lost = losses(res, args.focus)
    write_losses(lost, out, args.focus)
    print(format_table(res))
    print()
    print(format_losses(lost, args.focus))
    return out


if __name__ == "__main__":
    main()

"""The held-out half against the baselines: the penalty matrix of issue 14's "Done when".

:mod:`bench.experiments.heldout` runs BAIT (``bait-lam0.01``, today's and the chosen default) and
``random`` on the held-out half of the offline suite. This runs the known baselines on the *same*
settings, seeds and initial labels (its own store, ``<out>/heldout_baselines/``, so the held-out rows are
read, never rerun or rewritten):

- classification: ``badge``, ``margin``, ``coreset`` and the cold-start strategy ``typiclust`` (on the
  pool's embeddings, as the service runs it);
- regression: ``coreset`` and the regression cold-start strategy ``kmeanspp``.

and writes ``<out>/matrix.md``: the paper's pairwise penalty matrix (App. "penalty matrix") over the six
held-out datasets, once at the paper's budgets (``M_0 + 2^k B`` up to random's convergence) and once over
every round, with the t threshold of the number of paired seeds (3 seeds: t_{0.975,2} = 4.303), the
column means (lower is better) and every comparison BAIT lost.

    python -m bench.experiments.heldout --phase heldout          # first: BAIT and random
    python -m bench.experiments.heldout_matrix                  # the baselines, then matrix.md
    python -m bench.experiments.heldout_matrix --phase report   # matrix.md from the stored rows only
    python -m bench.experiments.heldout_matrix --smoke --out /tmp/heldout   # after heldout --smoke: < 60 s
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.experiments import heldout
from bench.experiments.common import (
    RESULTS_ROOT,
    ResultStore,
    StrategySpec,
    parse_seeds,
    read_results,
    recorded_run,
    run_grid,
)
from bench.experiments.penalty_matrix import PenaltyResult, format_table, losses, penalty_matrix, t_threshold

BAIT = heldout.lam_name(heldout.DEFAULT_LAM)
CLASSIFICATION = (
    StrategySpec("badge", "badge"),
    StrategySpec("margin", "margin"),
    StrategySpec("coreset", "coreset"),
    StrategySpec("typiclust", "typiclust", inputs="pool"),
)
REGRESSION = (StrategySpec("coreset", "coreset"), StrategySpec("kmeanspp", "kmeanspp", inputs="pool"))
#: Row and column order of the matrices.
ORDER = (BAIT, "badge", "margin", "coreset", "typiclust", "kmeanspp", "random")
STORE = "heldout_baselines"


def baselines(task_type: str) -> tuple[StrategySpec, ...]:
    """The baselines run on a dataset of ``task_type`` (``binary``, ``multiclass`` or ``regression``)."""
    return REGRESSION if task_type == "regression" else CLASSIFICATION


def run_baselines(
    datasets: Sequence[str], size: Mapping[str, int], seeds: Sequence[int], out: Path, lr: float, quiet: bool
) -> None:
    wrong = [d for d in datasets if heldout.half(d) not in ("heldout", "synthetic")]
    if wrong:
        raise SystemExit(f"held-out-half datasets only; {wrong} are not")
    store = ResultStore(out / STORE)
    for d in datasets:
        setting = heldout.make_setting("heldout", d, size, lr)
        run_grid([setting], baselines(heldout.task_type(d)), seeds, store, desc=d, quiet=quiet)


def matrix_rows(out: Path) -> list[dict[str, Any]]:
    """BAIT at the default lam and random from the held-out store, and the baselines from their own."""
    main = [r for r in read_results(out / "heldout" / "results.csv") if r["strategy"] in (BAIT, "random")]
    return main + read_results(out / STORE / "results.csv")


def _section(title: str, res: PenaltyResult, seeds: int, note: str) -> list[str]:
    lost = losses(res, BAIT)
    i = res.strategies.index(BAIT)
    best = min(res.column_means)
    lines = [
        f"## {title}",
        "",
        note,
        "",
        format_table(res),
        "",
        f"BAIT's column mean: {res.column_means[i]:.2f} "
        + ("(the best column)" if res.column_means[i] <= best + 1e-12 else f"(best: {best:.2f})")
        + f"; |t| threshold {t_threshold(seeds):.3f} ({seeds} paired seeds).",
        "",
    ]
    if lost:
        lines += ["Comparisons BAIT lost:", "", "| dataset | labels | winner | t |", "|---|---|---|---|"]
        lines += [f"| {lo.config} | {lo.budget} | {lo.winner} | {lo.t:+.2f} |" for lo in lost]
    else:
        lines.append("BAIT lost no comparison.")
    per = ", ".join(
        f"{e.experiment.partition('/')[2]}: {', '.join(str(b) for b in e.budgets)}" for e in res.experiments
    )
    return [*lines, "", f"Budgets (labels) per dataset: {per}.", ""]


def report(out: Path) -> Path:
    rows = matrix_rows(out)
    present = [s for s in ORDER if any(r["strategy"] == s for r in rows)]
    seeds = len({int(r["seed"]) for r in rows})
    paper = penalty_matrix(rows, strategies=present)
    every = penalty_matrix(rows, strategies=present, all_rounds=True)
    runs = [r for r in heldout._load_runs(out) if r.get("phase") == "baselines"]
    lines = [
        "# Held-out half: BAIT against the baselines (penalty matrix)",
        "",
        f"`{BAIT}` (the default: lam = 0.01, convention reference, MLP head) and `random` come from "
        "`python -m bench.experiments.heldout --phase heldout`; the baselines from "
        "`python -m bench.experiments.heldout_matrix`, on the same settings, seeds and initial labels. "
        "Entry (i, j): the budget-weighted number of datasets where i beat j significantly (paired t over "
        "seeds); BADGE and margin are classification-only, kmeanspp regression-only, so a column counts the "
        "datasets the strategy ran on. Lower column mean is better.",
        "",
        *_section(
            "At the paper's budgets",
            paper,
            seeds,
            "Budgets `M_0 + 2^k B` up to the round where random comes within 1 % of its final value.",
        ),
        *_section("Over every round", every, seeds, "Every round after the initial labels is a budget."),
    ]
    if runs:
        lines += ["## Runs", "", "| command | wall s | load start / end | machine |", "|---|---|---|---|"]
        for r in runs:
            load = f"{r['load_start'][0]:.1f} / {r['load_end'][0]:.1f}"
            lines.append(f"| `{r['command']}` | {r['wall_s']} | {load} | {r['machine']} |")
    path = out / "matrix.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", choices=("run", "report"), default="run", help="run the baselines then report (default)")
    p.add_argument("--smoke", action="store_true", help="the synthetic stand-ins of `heldout --smoke`")
    p.add_argument(
        "--out", type=Path, default=None, help=f"the heldout folder (default {RESULTS_ROOT / heldout.EXPERIMENT})"
    )
    p.add_argument("--datasets", default=None, help="comma-separated held-out datasets (default: the held-out half)")
    p.add_argument("--seeds", default=None, help="as for heldout (default 3; smoke 2)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    preset = heldout.SMOKE if args.smoke else heldout.FULL
    size = {k: v for k, v in preset.items() if k != "seeds"}
    seeds = parse_seeds(args.seeds or str(preset["seeds"]))
    lr = heldout.LR["smoke" if args.smoke else "full"]
    out: Path = args.out or RESULTS_ROOT / heldout.EXPERIMENT
    if not (out / "heldout" / "results.csv").is_file():
        raise SystemExit(
            f"{out / 'heldout'} has no results: run `python -m bench.experiments.heldout --phase heldout` first"
        )
    if args.phase == "run":
        datasets = (
            [d for d in args.datasets.split(",") if d]
            if args.datasets
            else list(heldout.SMOKE_HELDOUT if args.smoke else heldout.HELDOUT_DATASETS)
        )
        argv_list = list(argv) if argv is not None else sys.argv[1:]
        with recorded_run(
            out, "bench.experiments.heldout_matrix", argv_list, phase="baselines", datasets=datasets, seeds=seeds
        ):
            run_baselines(datasets, size, seeds, out, lr, args.quiet)
    return report(out)


if __name__ == "__main__":
    print(main())

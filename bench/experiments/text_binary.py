"""Binary text tasks embedded with the service's ``text-minilm`` encoder: where does BAIT help (issue 14)?

Datasets of the offline suite (``python -m bench.suite fetch fine-foods austen-pair``), both stored as
unit-length 384-d all-MiniLM-L6-v2 embeddings:

* ``fine-foods``: Amazon fine-food reviews, score ``great`` vs ``other``;
* ``austen-pair``: sentences of *Emma* vs *Persuasion*.

From each, ``--pool`` rows of the suite's training split form the pool and ``--test`` rows of its test
split the test set (seeded subsamples). The loop is the shared harness (:mod:`bench.experiments.common`):
``--m0`` random initial labels (the same for every strategy of a seed), then ``--rounds`` batches of
``--batch``, the pool's MLP head (one hidden ReLU layer of 128 units, Adam 1e-3, to 99 % training
accuracy or the epoch cap, as in :mod:`bench.experiments.mlp_classification`) retrained from scratch each
round and scored on the test set. Strategies: ``bait`` (forward-backward, the library's ridge), ``badge``,
``margin`` and ``coreset`` on the head's features and probabilities; ``typiclust`` on the pool's own
MiniLM embeddings (as the service runs it: model-free); ``random``.

``summary.md`` gets, per dataset, the mean ± standard error over seeds of the test accuracy at every
budget, and per budget BAIT's difference to every other strategy with its paired t over seeds (the
penalty matrix's :func:`~bench.experiments.penalty_matrix.paired_t`, two-sided 5 % Student-t critical
value): significantly better, tied or significantly worse.

    python -m bench.experiments.text_binary                   # full: 2 datasets x 6 strategies x 5 seeds
    python -m bench.experiments.text_binary --smoke --out /tmp/text
    python -m bench.experiments.text_binary --smoke --datasets synthetic --out /tmp/text   # no fetch needed

``synthetic`` is a stand-in for tests: two overlapping Gaussian classes, normalised to unit length like
the MiniLM embeddings (it says nothing about text).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np

from bench.experiments.common import (
    Curve,
    ResultStore,
    Setting,
    Split,
    StrategySpec,
    add_size_options,
    add_strategy_options,
    bait_params,
    chosen_strategies,
    curves,
    experiment_parser,
    run_and_plot,
    sizes_from,
    start_run,
)
from bench.experiments.penalty_matrix import paired_budgets
from selection.heads import HeadConfig

EXPERIMENT = "text_binary"
DATASETS = ("fine-foods", "austen-pair")
SYNTHETIC = "synthetic"
#: The strategy every other one is compared with.
FOCUS = "bait"

FULL = {"pool": 900, "test": 300, "m0": 10, "batch": 20, "rounds": 6, "max_epochs": 100, "hidden": 128}
SMOKE = {"pool": 120, "test": 80, "m0": 10, "batch": 10, "rounds": 2, "max_epochs": 30, "hidden": 32}


def strategies(lam: float | None = None, convention: str = "reference") -> list[StrategySpec]:
    """BAIT and the baselines; ``typiclust`` reads the pool's embeddings, the others the head's outputs."""
    return [
        StrategySpec(FOCUS, "bait", bait_params(lam, convention, oversample=2)),
        StrategySpec("badge", "badge"),
        StrategySpec("margin", "margin"),
        StrategySpec("coreset", "coreset"),
        StrategySpec("typiclust", "typiclust", inputs="pool"),
        StrategySpec("random", "random"),
    ]


def synthetic_split(pool: int, test: int, *, dim: int = 16, seed: int = 0) -> Split:
    """Two overlapping Gaussian classes (means ``±1.5 e_1``, unit covariance), rows scaled to unit length."""
    rng = np.random.default_rng([seed, 0x7E47])
    n = pool + test
    y = rng.integers(0, 2, size=n)
    X = rng.standard_normal((n, dim))
    X[:, 0] += np.where(y == 1, 1.5, -1.5)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return Split(
        X[:pool].astype(np.float32),
        y[:pool].astype(np.int64),
        X[pool:].astype(np.float32),
        y[pool:].astype(np.int64),
        "classification",
        2,
    )


def load_split(dataset: str, pool: int, test: int) -> Split:
    """Seeded subsamples of the suite's cached train (pool) and test splits of ``dataset``.

    Raises:
        bench.suite.DatasetNotCached: the dataset has not been fetched (the message gives the command).
        ValueError: ``pool`` or ``test`` exceeds the split, or the dataset is not binary.
    """
    if dataset == SYNTHETIC:
        return synthetic_split(pool, test)
    from bench import suite

    ds = suite.load(dataset)
    if ds.n_outputs != 2:
        raise ValueError(f"{dataset} has {ds.n_outputs} classes; this experiment is for binary tasks")
    if pool > ds.x_train.shape[0] or test > ds.x_test.shape[0]:
        raise ValueError(
            f"{dataset}: pool {pool} / test {test} exceed its splits ({ds.x_train.shape[0]} / {ds.x_test.shape[0]})"
        )
    rng = np.random.default_rng(0)
    tr = np.sort(rng.permutation(ds.x_train.shape[0])[:pool])
    te = np.sort(rng.permutation(ds.x_test.shape[0])[:test])
    return Split(
        ds.x_train[tr].astype(np.float32),
        ds.y_train[tr].astype(np.int64),
        ds.x_test[te].astype(np.float32),
        ds.y_test[te].astype(np.int64),
        "classification",
        2,
    )


def settings(
    datasets: Sequence[str],
    *,
    pool: int,
    test: int,
    m0: int,
    batch: int,
    rounds: int,
    max_epochs: int,
    hidden: int,
    lr: float = 1e-3,
) -> list[Setting]:
    """One :class:`Setting` per dataset (config = the dataset's name)."""
    out = []
    for dataset in datasets:
        split = load_split(dataset, pool, test)
        head = HeadConfig(
            input_dim=split.X_pool.shape[1], n_outputs=2, kind="mlp", hidden=hidden, lr=lr, max_epochs=max_epochs
        )
        out.append(Setting(EXPERIMENT, dataset, split, head, m0=m0, batch=batch, rounds=rounds))
    return out


# --------------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------------

Verdict = Literal["better", "tied", "worse"]


def comparisons(
    rows: Sequence[Mapping[str, Any]], *, focus: str = FOCUS
) -> dict[str, dict[str, dict[int, tuple[float, float, Verdict, int]]]]:
    """config -> other strategy -> labels -> (mean difference focus - other, paired t, verdict, seeds).

    Only budgets after the initial labels (where every strategy has the same rows) and seeds both
    strategies reached are compared; the verdict is ``better``/``worse`` when ``|t|`` exceeds the
    two-sided 5 % critical value for the paired seeds, else ``tied``.
    """
    # config -> strategy -> seed -> labels -> accuracy
    table: dict[str, dict[str, dict[int, dict[int, float]]]] = {}
    m0: dict[str, int] = {}
    for r in rows:
        cfg = str(r["config"])
        table.setdefault(cfg, {}).setdefault(str(r["strategy"]), {}).setdefault(int(r["seed"]), {})[
            int(r["labels"])
        ] = float(r["value"])
        if int(r["round"]) == 0:
            m0[cfg] = int(r["labels"])
    out: dict[str, dict[str, dict[int, tuple[float, float, Verdict, int]]]] = {}
    for cfg, strat in table.items():
        if focus not in strat:
            continue
        mine = strat[focus]
        out[cfg] = {}
        for other, theirs in strat.items():
            if other == focus:
                continue
            per = cast(dict[int, tuple[float, float, Verdict, int]], paired_budgets(mine, theirs, m0.get(cfg, 0)))
            out[cfg][other] = per
    return out


def _order(names: Sequence[str]) -> list[str]:
    known = [s.name for s in strategies()]
    return [n for n in known if n in names] + sorted(n for n in names if n not in known)


def summarise(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: per dataset, accuracy (mean ± s.e.) per budget and strategy, BAIT's paired t against
    each other strategy per budget, and a tally of BAIT's wins / ties / losses."""
    data = curves(rows)
    comp = comparisons(rows)
    lines = [
        "# Binary text tasks (text-minilm embeddings): BAIT vs the baselines",
        "",
        "Test accuracy, mean ± standard error over seeds; `n` seeds per strategy. "
        "In the comparison tables a cell is BAIT's mean accuracy minus the other strategy's, with the "
        "paired t over seeds in brackets; **better** / **worse** when |t| exceeds the two-sided 5 % "
        "Student-t critical value for the paired seeds, else tied.",
        "",
    ]
    tally: dict[str, dict[str, list[int]]] = {}  # config -> other -> [better, tied, worse]
    for key in sorted(data):
        cfg = key[1]
        by_name: dict[str, Curve] = data[key]
        names = _order(list(by_name))
        labels = sorted({int(v) for c in by_name.values() for v in c.labels})
        lines += [f"## {cfg}", "", "| labels | " + " | ".join(f"{n} (n={by_name[n].n_seeds})" for n in names) + " |"]
        lines.append("|---|" + "---|" * len(names))
        for lab in labels:
            cells = []
            for n in names:
                c = by_name[n]
                hit = np.flatnonzero(c.labels == lab)
                cells.append(f"{c.mean[hit[0]]:.3f} ± {c.se[hit[0]]:.3f}" if hit.size else "—")
            lines.append(f"| {lab} | " + " | ".join(cells) + " |")
        lines.append("")
        others = [n for n in names if n != FOCUS and n in comp.get(cfg, {})]
        if not others:
            lines += [f"(no `{FOCUS}` rows to compare)", ""]
            continue
        budgets = sorted({lab for o in others for lab in comp[cfg][o]})
        lines += [
            f"BAIT minus each strategy (paired t), {cfg}:",
            "",
            "| labels | " + " | ".join(f"vs {o}" for o in others) + " |",
            "|---|" + "---|" * len(others),
        ]
        tally[cfg] = {o: [0, 0, 0] for o in others}
        for lab in budgets:
            cells = []
            for o in others:
                got = comp[cfg][o].get(lab)
                if got is None:
                    cells.append("—")
                    continue
                diff, t, verdict, _ = got
                tally[cfg][o][("better", "tied", "worse").index(verdict)] += 1
                mark = f" **{verdict}**" if verdict != "tied" else ""
                cells.append(f"{diff:+.3f} ({t:+.2f}){mark}")
            lines.append(f"| {lab} | " + " | ".join(cells) + " |")
        lines.append("")
    if tally:
        everyone = _order(sorted({o for t in tally.values() for o in t}))
        lines += [
            "## Tally: budgets where BAIT is significantly better / tied / significantly worse",
            "",
            "| dataset | " + " | ".join(f"vs {o}" for o in everyone) + " |",
            "|---|" + "---|" * len(everyone),
        ]
        for cfg in sorted(tally):
            cells = ["—" if o not in tally[cfg] else " / ".join(str(v) for v in tally[cfg][o]) for o in everyone]
            lines.append(f"| {cfg} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = experiment_parser(__doc__, EXPERIMENT, "tiny pool, two rounds, two seeds: checks the harness in seconds")
    p.add_argument(
        "--datasets", default=",".join(DATASETS), help=f"comma-separated subset of {','.join(DATASETS)},{SYNTHETIC}"
    )
    add_strategy_options(p, "Adam learning rate of the MLP head")
    add_size_options(p, FULL)
    return p


def main(argv: Sequence[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    size = sizes_from(args, SMOKE if args.smoke else FULL)
    specs = chosen_strategies(strategies(lam=args.lam), args.strategies)
    datasets = [d for d in args.datasets.split(",") if d]
    unknown = [d for d in datasets if d not in (*DATASETS, SYNTHETIC)]
    if unknown:
        raise SystemExit(f"unknown dataset(s) {unknown}; expected {', '.join((*DATASETS, SYNTHETIC))}")
    grid = settings(datasets, lr=args.lr, **size)  # loads first: a missing dataset fails before anything is written
    out, seeds = start_run(
        args, EXPERIMENT, argv, {**size, "datasets": datasets, "strategies": [s.name for s in specs], "lr": args.lr}
    )
    run_and_plot(grid, specs, seeds, out, desc=EXPERIMENT, quiet=args.quiet, title="Binary text (text-minilm)")
    text = summarise(ResultStore(out).rows())
    (out / "summary.md").write_text(text)
    if not args.quiet:
        print(text)
    return out


if __name__ == "__main__":
    main()

"""A Markdown summary of the experiments' results: per configuration, every strategy's learning
curve in a few numbers, and how often it is significantly better or worse than random.

For each (experiment, config) and strategy: the mean over seeds at the first and last rounds, the
mean over rounds 1.. (the normalised area under the curve), and the number of rounds where the paired
t-test over seeds against random (the same test as the penalty matrix) says better / worse.

    python -m bench.experiments.summary                       # -> docs/results/summary.md
    python -m bench.experiments.summary --inputs a.csv b.csv --out /tmp/summary.md
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.experiments.common import RESULTS_ROOT, curves, read_results
from bench.experiments.penalty_matrix import paired_t, t_threshold

DEFAULT_INPUTS = tuple(
    RESULTS_ROOT / e / "results.csv" for e in ("linear_mnist", "mlp_classification", "regression", "conventions")
)


def _per_seed(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], dict[int, dict[int, float]]]:
    out: dict[tuple[str, str, str], dict[int, dict[int, float]]] = {}
    for r in rows:
        key = (str(r["experiment"]), str(r["config"]), str(r["strategy"]))
        out.setdefault(key, {}).setdefault(int(r["seed"]), {})[int(r["round"])] = float(r["value"])
    return out


def _area(mean: np.ndarray) -> float:
    """Mean over rounds 1.. (round 0 is the same for every strategy)."""
    return float(np.mean(mean[1:])) if len(mean) > 1 else float(mean[0])


def summarize(rows: Sequence[Mapping[str, Any]], *, reference: str = "random") -> str:
    """The Markdown text (one table per configuration)."""
    metric = {(str(r["experiment"]), str(r["config"])): str(r["metric"]) for r in rows}
    seeds = _per_seed(rows)
    lines: list[str] = []
    for (exp, cfg), per in sorted(curves(rows).items()):
        lower = metric[(exp, cfg)] != "accuracy"
        ref = per.get(reference)
        n = min(c.n_seeds for c in per.values())
        thr = t_threshold(n) if n > 1 else float("inf")
        lines += [
            f"### {exp} / {cfg} ({metric[(exp, cfg)]}, {'lower' if lower else 'higher'} is better; "
            f"{n} seeds; t threshold {thr:.3f})",
            "",
            f"| strategy | labels {int(next(iter(per.values())).labels[0])} | labels (last) | value (last) | "
            f"mean over rounds 1.. | rounds better / worse than {reference} |",
            "|---|---|---|---|---|---|",
        ]

        sign = 1.0 if lower else -1.0
        order = sorted(per, key=lambda s: sign * _area(per[s].mean))
        for name in order:
            c = per[name]
            better = worse = 0
            if ref is not None and name != reference:
                mine, theirs = seeds[(exp, cfg, name)], seeds[(exp, cfg, reference)]
                common = sorted(set(mine) & set(theirs))
                for rnd in range(1, min(len(c.labels), len(ref.labels))):
                    if not all(rnd in mine[s] and rnd in theirs[s] for s in common):
                        continue
                    a = np.array([mine[s][rnd] for s in common])
                    b = np.array([theirs[s][rnd] for s in common])
                    t = paired_t(b, a) if lower else paired_t(a, b)
                    better += int(t > thr)
                    worse += int(t < -thr)
            cmp = "—" if name == reference or ref is None else f"{better} / {worse}"
            mean = _area(c.mean)
            lines.append(
                f"| {name} | {c.mean[0]:.4f} | {int(c.labels[-1])} | {c.mean[-1]:.4f} ± {c.se[-1]:.4f} | "
                f"{mean:.4f} | {cmp} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="*", type=Path, default=None, help="results.csv files (default: all experiments)")
    p.add_argument("--out", type=Path, default=RESULTS_ROOT / "summary.md", help="Markdown file to write")
    args = p.parse_args(argv)
    inputs = [Path(x) for x in (args.inputs or DEFAULT_INPUTS) if Path(x).is_file()]
    if not inputs:
        raise SystemExit("no results.csv found; run the experiments first")
    rows = [r for path in inputs for r in read_results(path)]
    text = "# Experiment results, summarised\n\n" + summarize(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return args.out


if __name__ == "__main__":
    main()

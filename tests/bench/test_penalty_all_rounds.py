"""``python -m bench.experiments.penalty --all-rounds`` on a hand-built ``results.csv``.

One synthetic config: 5 seeds, rounds 0-12, ``M_0 = 10``, ``B = 10``. Every strategy has the same
value as random at every (seed, round), except that ``weak`` is clearly worse at round 10 only.
Random converges at round 3 (40 labels), so the paper's budgets are 20 and 30 labels and the
default mode cannot see round 10; ``--all-rounds`` must, and ``losses.csv`` must list it.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from bench.experiments import penalty
from bench.experiments.common import COLUMNS, read_results
from bench.experiments.penalty_matrix import paired_t

SEEDS = range(5)
ROUNDS = range(13)
M0, B = 10, 10
LOSE_ROUND = 10
STRATEGIES = ("random", "strong", "weak")
# random's mean curve: within 1% of its final value from round 3 on
CURVE = [0.5, 0.7, 0.8] + [0.9] * (len(ROUNDS) - 3)


def write_synthetic(path: Path, metric: str) -> list[float]:
    """Write the table; return ``weak``'s per-seed gap at the losing round (in "worse" direction)."""
    worse = 1.0 if metric == "rmse" else -1.0
    gaps = [0.05 + 0.01 * s for s in SEEDS]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        for strategy in STRATEGIES:
            for seed in SEEDS:
                for rnd in ROUNDS:
                    base = CURVE[rnd] + 0.003 * ((seed * 7 + rnd * 3) % 5)
                    value = 1.0 - base if metric == "rmse" else base
                    if strategy == "weak" and rnd == LOSE_ROUND:
                        value += worse * gaps[seed]
                    w.writerow(
                        {
                            "experiment": "synth",
                            "config": "cfg",
                            "strategy": strategy,
                            "seed": seed,
                            "round": rnd,
                            "labels": M0 + B * rnd,
                            "metric": metric,
                            "value": f"{value:.6f}",
                            "train_epochs": 1,
                            "stop_reason": "max_epochs",
                            "train_s": 0.0,
                            "select_s": 0.0,
                            "round_s": 0.0,
                            "init_hash": f"h{seed}",
                        }
                    )
    return gaps


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def column_means(path: Path) -> dict[str, float]:
    with path.open(newline="") as f:
        table = list(csv.reader(f))
    assert table[-1][0] == "column_mean"
    return {name: float(v) for name, v in zip(table[0][1:], table[-1][1:], strict=True)}


@pytest.mark.parametrize("metric", ["accuracy", "rmse"])
def test_late_loss_only_seen_with_all_rounds(tmp_path: Path, metric: str) -> None:
    src = tmp_path / "results.csv"
    gaps = write_synthetic(src, metric)
    assert len(read_results(src)) == len(STRATEGIES) * len(SEEDS) * len(ROUNDS)

    # Default mode: the paper's budgets (20, 30 labels) stop before the losing round.
    paper = tmp_path / "paper"
    penalty.main(["--inputs", str(src), "--out", str(paper)])
    budgets = read_csv(paper / "budgets.csv")
    assert [(b["experiment"], b["converged_labels"], b["budgets"]) for b in budgets] == [("synth/cfg", "40", "20 30")]
    assert read_csv(paper / "wins.csv") == []
    assert column_means(paper / "penalty_matrix.csv") == {s: 0.0 for s in STRATEGIES}
    assert not (paper / "losses.csv").exists()

    # --all-rounds: every round 1..12 is a budget; weak loses to both others at round 10 only.
    every = tmp_path / "every"
    penalty.main(["--inputs", str(src), "--out", str(every), "--all-rounds", "--focus", "weak"])
    for name in ("penalty_matrix.csv", "penalty_matrix.md", "budgets.csv", "wins.csv", "penalty_matrix.png"):
        assert (every / name).is_file(), name
    (row,) = read_csv(every / "budgets.csv")
    assert row["budgets"].split() == [str(M0 + B * r) for r in ROUNDS if r > 0]
    assert row["z"] == str(len(ROUNDS) - 1)

    t_expected = paired_t(np.zeros(len(gaps)), -np.array(gaps))  # the others minus weak, "larger is better"
    assert t_expected > 2.776
    losses = read_csv(every / "losses.csv")
    assert [(x["experiment"], x["config"], x["budget"], x["round"], x["loser"], x["winner"]) for x in losses] == [
        ("synth", "cfg", str(M0 + B * LOSE_ROUND), str(LOSE_ROUND), "weak", "random"),
        ("synth", "cfg", str(M0 + B * LOSE_ROUND), str(LOSE_ROUND), "weak", "strong"),
    ]
    for x in losses:
        assert float(x["t"]) == pytest.approx(t_expected, rel=1e-3)
    assert "| synth | cfg | 110 | 10 | random |" in (every / "losses.md").read_text()

    wins = read_csv(every / "wins.csv")
    expected = {("110", "random", "weak"), ("110", "strong", "weak")}
    assert {(w["budget"], w["winner"], w["loser"]) for w in wins} == expected
    means = column_means(every / "penalty_matrix.csv")
    z = len(ROUNDS) - 1
    assert means["weak"] == pytest.approx(1.0 / z, abs=1e-4)  # beaten by both others at 1 of z budgets
    assert means["random"] == 0.0 and means["strong"] == 0.0


def test_focus_without_losses_says_so(tmp_path: Path) -> None:
    src = tmp_path / "results.csv"
    write_synthetic(src, "accuracy")
    out = tmp_path / "every"
    penalty.main(["--inputs", str(src), "--out", str(out), "--all-rounds", "--focus", "strong"])
    assert read_csv(out / "losses.csv") == []
    assert (out / "losses.md").read_text().strip() == "`strong` loses no significant comparison."

"""The experiment harness end to end at smoke size, and the penalty matrix on hand-built tables.

Each experiment's ``--smoke`` mode runs on a tiny pool; the checks are the issue's: the files are
written, labels grow by the batch size every round, every number is finite, strategies on the same
seed start from the same initial labels (same hash, same round-0 accuracy), and the picks are new
rows. Resumption is checked by deleting rows and rerunning: the same rows come back.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from bench.experiments import conventions, linear_mnist, mlp_classification, penalty, regression, summary
from bench.experiments.common import initial_labels, read_results
from bench.experiments.penalty_matrix import budgets_for, paired_t, penalty_matrix, t_threshold


def check_results(
    out: Path, strategies: set[str], configs: set[str], seeds: set[int], pool_size: int | dict[str, int]
) -> list[dict[str, Any]]:
    """Assert the harness properties on ``out/results.csv`` and ``out/picks.jsonl``; return the rows."""
    assert (out / "results.csv").is_file()
    assert (out / "curves.png").stat().st_size > 1000
    assert (out / "runs.jsonl").is_file()
    rows = read_results(out / "results.csv")
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        runs[(r["config"], r["strategy"], r["seed"])].append(r)
    assert {k[0] for k in runs} == configs
    assert {k[1] for k in runs} == strategies
    assert {k[2] for k in runs} == seeds
    assert len(runs) == len(configs) * len(strategies) * len(seeds)

    picks: dict[tuple[str, str, int], dict[int, list[int]]] = defaultdict(dict)
    with (out / "picks.jsonl").open() as f:
        for line in f:
            rec = json.loads(line)
            picks[(rec["config"], rec["strategy"], rec["seed"])][rec["round"]] = rec["picked"]

    for key, run in runs.items():
        run.sort(key=lambda r: r["round"])
        assert [r["round"] for r in run] == list(range(len(run)))
        assert len(run) >= 3
        batch = run[1]["labels"] - run[0]["labels"]
        assert batch > 0
        for a, b in itertools.pairwise(run):
            assert b["labels"] - a["labels"] == batch, f"{key}: labels do not grow by the batch size"
        for r in run:
            for name in ("value", "train_s", "select_s", "round_s"):
                assert math.isfinite(r[name]), f"{key} round {r['round']}: {name} = {r[name]}"
        # the picks: `batch` new, distinct rows per round, never one of the initial labels
        n_pool = pool_size if isinstance(pool_size, int) else pool_size[key[0]]
        seen: set[int] = set(initial_labels(n_pool, run[0]["labels"], key[2]).tolist())
        for rnd in range(len(run) - 1):
            p = picks[key][rnd]
            assert len(p) == batch and len(set(p)) == batch
            assert not (set(p) & seen)
            seen |= set(p)
        assert len(run) - 1 not in picks[key]  # no selection after the last evaluation

    # same seed and config -> same initial labels and the same round-0 model for every strategy
    for config in configs:
        for seed in seeds:
            first = [runs[(config, s, seed)][0] for s in strategies]
            assert len({r["init_hash"] for r in first}) == 1
            assert len({r["value"] for r in first}) == 1
            assert len({r["labels"] for r in first}) == 1
        hashes = {runs[(config, next(iter(strategies)), s)][0]["init_hash"] for s in seeds}
        assert len(hashes) == len(seeds), "different seeds should start from different labels"
    return rows


@pytest.fixture(scope="module")
def linear_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("linear")
    linear_mnist.main(["--smoke", "--out", str(out), "--quiet"])
    return out


def test_linear_mnist_smoke_end_to_end(linear_out: Path) -> None:
    rows = check_results(linear_out, {s.name for s in linear_mnist.strategies()}, {"learned", "random"}, {0, 1}, 150)
    assert {r["metric"] for r in rows} == {"accuracy"}
    assert all(0.0 <= r["value"] <= 1.0 for r in rows)
    assert {r["labels"] for r in rows} == {10, 15, 20, 25}


def test_mlp_classification_smoke_end_to_end(tmp_path: Path) -> None:
    mlp_classification.main(["--smoke", "--out", str(tmp_path), "--quiet"])
    check_results(
        tmp_path,
        {s.name for s in mlp_classification.strategies()},
        {"mnist-B5", "fashion-B5"},
        {0, 1},
        200,
    )


def test_regression_smoke_end_to_end(tmp_path: Path) -> None:
    regression.main(["--smoke", "--out", str(tmp_path), "--quiet"])
    rows = check_results(tmp_path, {"bait", "coreset", "random"}, set(regression.CONFIGS), {0, 1}, 150)
    assert {r["metric"] for r in rows} == {"rmse"}
    assert all(r["value"] > 0 for r in rows)


def test_conventions_smoke_writes_ranking(tmp_path: Path) -> None:
    conventions.main(["--smoke", "--out", str(tmp_path), "--quiet"])
    names = {s.name for s in conventions.variants(1)}
    assert len(names) == 7
    check_results(
        tmp_path,
        names,
        {"linear-random", "mlp-mnist-B5"},
        {0, 1},
        {"linear-random": 150, "mlp-mnist-B5": 200},
    )
    with (tmp_path / "ranking.csv").open() as f:
        ranked = list(csv.DictReader(f))
    assert {r["variant"] for r in ranked} == names - {"random"}
    assert (tmp_path / "penalty_matrix.png").is_file()


def test_penalty_smoke_on_experiment_results(linear_out: Path, tmp_path: Path) -> None:
    penalty.main(["--inputs", str(linear_out / "results.csv"), "--out", str(tmp_path)])
    for name in ("penalty_matrix.csv", "penalty_matrix.md", "budgets.csv", "wins.csv", "penalty_matrix.png"):
        assert (tmp_path / name).is_file(), name
    with (tmp_path / "penalty_matrix.csv").open() as f:
        table = list(csv.reader(f))
    names = table[0][1:]
    assert set(names) == {s.name for s in linear_mnist.strategies()}
    values = np.array([[float(v) for v in row[1:]] for row in table[1:]])
    assert values.shape == (len(names) + 1, len(names))
    assert np.isfinite(values).all() and (values >= 0).all()
    assert np.all(np.diag(values[:-1]) == 0)


def test_rerun_skips_done_rounds_and_resumes_identically(tmp_path: Path) -> None:
    args = ["--smoke", "--out", str(tmp_path), "--quiet", "--reps", "random", "--strategies", "bait,coreset"]
    linear_mnist.main(args)
    csv_path = tmp_path / "results.csv"
    full = csv_path.read_text().splitlines()
    linear_mnist.main(args)  # nothing left to do: the CSV is unchanged
    assert csv_path.read_text().splitlines() == full

    # Interrupt seed 1's bait run after round 1: its later rows vanish; a rerun must redo them
    # from the stored picks and reproduce them (up to the timing columns).
    header, body = full[0], full[1:]
    cut = [ln for ln in body if not (ln.split(",")[2:4] == ["bait", "1"] and int(ln.split(",")[4]) >= 2)]
    assert len(cut) == len(body) - 2
    csv_path.write_text("\n".join([header, *cut]) + "\n")
    linear_mnist.main(args)
    again = read_results(csv_path)
    before = {(r["config"], r["strategy"], r["seed"], r["round"]): r for r in read_results_lines(header, body)}
    assert len(again) == len(before)
    for r in again:
        b = before[(r["config"], r["strategy"], r["seed"], r["round"])]
        assert (r["labels"], r["value"], r["init_hash"]) == (b["labels"], b["value"], b["init_hash"])


def read_results_lines(header: str, lines: list[str]) -> list[dict[str, Any]]:
    reader = csv.DictReader([header, *lines])
    return [{**r, "seed": int(r["seed"]), "round": int(r["round"]), "labels": int(r["labels"]),
             "value": float(r["value"])} for r in reader]  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Penalty matrix on hand-built tables
# --------------------------------------------------------------------------------------------------

SEEDS = range(5)
LABELS = [10 + 10 * r for r in range(9)]  # M_0 = 10, B = 10, rounds 0..8
RANDOM_CURVE = [0.50, 0.60, 0.70, 0.80, 0.905, 0.91, 0.91, 0.91, 0.91]  # within 1% of 0.91 from 50 labels


def _rows(experiment: str, metric: str, curves: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, fn in curves.items():
        for s in SEEDS:
            for rnd, lab in enumerate(LABELS):
                out.append({"experiment": experiment, "config": "c", "strategy": name, "seed": s, "round": rnd,
                            "labels": lab, "metric": metric, "value": fn(rnd, lab, s)})  # fmt: skip
    return out


def test_budgets_are_m0_plus_powers_of_two_batches_up_to_random_convergence() -> None:
    conv, budgets = budgets_for(LABELS, RANDOM_CURVE)
    assert conv == 50
    assert budgets == [20, 30, 50]  # 10 + 10 * 2^k for k = 0, 1, 2; 90 > 50


def test_paired_t_matches_scipy_and_threshold_is_the_papers_for_five_seeds() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=5), rng.normal(size=5)
    assert paired_t(a, b) == pytest.approx(stats.ttest_rel(a, b).statistic, rel=1e-12)
    assert t_threshold(5) == pytest.approx(2.776, abs=5e-4)
    assert paired_t(np.ones(5), np.zeros(5)) == math.inf
    assert paired_t(np.ones(5), np.ones(5)) == 0.0


def test_penalty_matrix_on_a_hand_built_table() -> None:
    def rand(rnd: int, lab: int, s: int) -> float:
        return RANDOM_CURVE[rnd] + 0.01 * ((s * 7) % 5 - 2)  # seed noise shared by all strategies

    def good(rnd: int, lab: int, s: int) -> float:  # beats random at every budget
        return rand(rnd, lab, s) + 0.05 + 0.002 * s

    def mid(rnd: int, lab: int, s: int) -> float:
        # beats random at budgets 20 and 30, indistinguishable at 50 (noise of both signs),
        # and far ahead of everyone at 40 labels, which is not a budget
        if lab == 40:
            return 2.0 + 0.01 * s
        if lab == 50:
            return rand(rnd, lab, s) + [0.01, -0.01, 0.02, -0.02, 0.0][s]
        return rand(rnd, lab, s) + 0.03 + 0.001 * s

    rows = _rows("exp1", "accuracy", {"random": rand, "good": good, "mid": mid})

    # A second experiment with an error metric (lower is better), where "mid" has the lowest error.
    def err_rand(rnd: int, lab: int, s: int) -> float:
        return 1.0 - RANDOM_CURVE[rnd] + 0.01 * ((s * 3) % 5 - 2)

    def err_mid(rnd: int, lab: int, s: int) -> float:
        return err_rand(rnd, lab, s) - 0.05 - 0.001 * s

    rows += _rows("exp2", "rmse", {"random": err_rand, "mid": err_mid})

    res = penalty_matrix(rows, strategies=["good", "mid", "random"])
    P = dict(((a, b), res.matrix[i, j]) for i, a in enumerate(res.strategies) for j, b in enumerate(res.strategies))
    assert P[("good", "random")] == pytest.approx(1.0)  # exp1: 3 of 3 budgets
    assert P[("good", "mid")] == pytest.approx(1.0)  # +0.05 vs +0.03 at 20, 30; +0.05 vs noise at 50
    assert P[("mid", "random")] == pytest.approx(2 / 3 + 1.0)  # exp1: 2 of 3; exp2: 3 of 3
    assert P[("mid", "good")] == 0.0  # the 40-label lead does not count
    assert P[("random", "good")] == P[("random", "mid")] == 0.0
    assert np.all(np.diag(res.matrix) == 0)
    # column means over the other rows
    assert res.column_means == pytest.approx([0.0, 0.5, (1.0 + 5 / 3) / 2])
    assert [e.budgets for e in res.experiments] == [[20, 30, 50], [20, 30, 50]]


def test_penalty_matrix_needs_a_significant_difference() -> None:
    # identical strategies up to seed noise of both signs: nothing is significant
    def base(rnd: int, lab: int, s: int) -> float:
        return RANDOM_CURVE[rnd]

    def noisy(rnd: int, lab: int, s: int) -> float:
        return RANDOM_CURVE[rnd] + [0.01, -0.01, 0.02, -0.02, 0.005][s]

    res = penalty_matrix(_rows("e", "accuracy", {"random": base, "noisy": noisy}))
    assert np.all(res.matrix == 0)


def test_summary_counts_significant_rounds_against_random(tmp_path: Path) -> None:
    def rand(rnd: int, lab: int, s: int) -> float:
        return RANDOM_CURVE[rnd] + 0.01 * ((s * 7) % 5 - 2)

    def ahead(rnd: int, lab: int, s: int) -> float:  # better from round 1 on, by a seed-independent-ish margin
        return rand(rnd, lab, s) + (0.0 if rnd == 0 else 0.05 + 0.001 * s)

    def behind(rnd: int, lab: int, s: int) -> float:  # worse in rounds 1-3 only
        return rand(rnd, lab, s) - (0.04 + 0.001 * s if 1 <= rnd <= 3 else 0.0)

    rows = _rows("exp1", "accuracy", {"random": rand, "ahead": ahead, "behind": behind})
    text = summary.summarize(rows)
    lines = {
        line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ") and "---" not in line
    }
    assert lines["ahead"].rstrip(" |").endswith(f"{len(LABELS) - 1} / 0")
    assert lines["behind"].rstrip(" |").endswith("0 / 3")
    assert lines["random"].rstrip(" |").endswith("—")
    # Best first: ahead, random, behind.
    order = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert order[1:] == ["ahead", "random", "behind"]

    csv_path = tmp_path / "results.csv"
    with csv_path.open("w", newline="") as f:
        fields = ["experiment", "config", "strategy", "seed", "round", "labels", "metric", "value", "train_epochs",
                  "train_s", "select_s", "round_s"]  # fmt: skip
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "train_epochs": 1, "train_s": 0.0, "select_s": 0.0, "round_s": 0.0})
    out = summary.main(["--inputs", str(csv_path), "--out", str(tmp_path / "summary.md")])
    assert "### exp1 / c (accuracy" in out.read_text()

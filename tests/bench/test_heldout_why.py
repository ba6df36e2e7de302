"""The why-BAIT-loses diagnostics at smoke size (synthetic stand-ins), and their helpers on hand-made data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.experiments import heldout_why
from bench.experiments.common import read_results


def test_smoke_runs_replays_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "why"
    report = heldout_why.main(["--smoke", "--out", str(out), "--quiet"])
    assert report == out / "why.md"

    # the runs: BAIT and random, 2 seeds, rounds 0..2 (10 -> 20 labels), both stand-ins, and (the smoke
    # defaults of --clean and --drop) the regression stand-in again without its input outliers / its row 0
    every = read_results(out / "results.csv")
    clean, drop = "synthetic-regression-no-outliers", "synthetic-regression-minus-0"
    assert {r["config"] for r in every} == {*heldout_why.SMOKE_DATASETS, clean, drop}
    for extra in (clean, drop):
        assert len([r for r in every if r["config"] == extra]) == 2 * 2 * 3
    rows = [r for r in every if r["config"] not in (clean, drop)]
    assert {r["strategy"] for r in rows} == {heldout_why.BAIT.name, "random"}
    assert len(rows) == 2 * 2 * 2 * 3
    assert sorted({r["labels"] for r in rows}) == [10, 15, 20]

    # the replay: one record per round, the retrained head gives the stored metric bit for bit
    recs = [json.loads(x) for x in (out / "diagnostics.jsonl").read_text().splitlines()]
    assert len(recs) == len(rows)
    assert all(r["replay_matches"] for r in recs)
    stored = {(r["config"], r["strategy"], r["seed"], r["round"]): r["value"] for r in rows}
    for r in recs:
        assert r["value"] == stored[(r["dataset"], r["strategy"], r["seed"], r["round"])]
        assert ("picks" in r) == (r["round"] < 2)

    reg = [r for r in recs if r["dataset"] == "synthetic-regression" and "picks" in r]
    clf = [r for r in recs if r["dataset"] == "synthetic-binary" and "picks" in r]
    for r in reg:
        p = r["picks"]
        for k in ("feat_norm_pct", "lev_pct", "dist_pct", "y_pct"):
            assert 0.0 <= p[k] <= 100.0, (k, p[k])
        for k in ("tail_lo", "tail_hi", "mid50", "outlier"):
            assert 0.0 <= p[k] <= 1.0 and (p[k] * 5).is_integer(), (k, p[k])  # a fraction of a batch of 5
        assert set(r["rmse_bin"]) == {*heldout_why.BIN_NAMES, "mid90", "tails"}
        assert all(v > 0 for v in r["cover_bin"].values() if v == v)
    for r in clf:
        p = r["picks"]
        assert 0.0 <= p["margin"] <= 1.0 and 0.0 <= p["pool_margin"] <= 1.0
        assert (p["class1"] * 5).is_integer() and 0.0 < p["pool_class1"] < 1.0
        assert set(r["acc_class"]) == {"0", "1"}
    # BAIT picks rows of higher leverage in the head's features than random does (its design criterion)
    picks = reg + clf
    lev = {
        s: np.mean([r["picks"]["lev_pct"] for r in picks if r["strategy"] == s])
        for s in ("random", heldout_why.BAIT.name)
    }
    assert lev[heldout_why.BAIT.name] > lev["random"] + 10, lev

    # the ablation: every seed and strategy; 'all' is the last round's set as run (same head, same metric)
    abl = [json.loads(x) for x in (out / "ablation.jsonl").read_text().splitlines()]
    last = {(r["config"], r["strategy"], r["seed"]): r["value"] for r in rows if r["round"] == 2}
    for r in abl:
        assert r["labels"] + r["dropped"] == 20
        if r["variant"] == "all":
            assert r["value"] == last[(r["dataset"], r["strategy"], r["seed"])]
    assert {(r["strategy"], r["variant"]) for r in abl} == {
        (heldout_why.BAIT.name, "all"),
        (heldout_why.BAIT.name, "no_outliers"),
        (heldout_why.BAIT.name, "control"),
        ("random", "all"),
        ("random", "no_outliers"),
    }
    # the leave-one-out: only BAIT's picked outliers of its final set
    picked: dict[tuple[str, int], set[int]] = {}
    for line in (out / "picks.jsonl").read_text().splitlines():
        p = json.loads(line)
        if p["strategy"] == heldout_why.BAIT.name:
            picked.setdefault((p["config"], p["seed"]), set()).update(p["picked"])
    infl = [json.loads(x) for x in (out / "influence.jsonl").read_text().splitlines()]
    assert infl  # the synthetic-binary pool has outliers that BAIT picks
    for r in infl:
        assert r["row"] in picked[(r["dataset"], r["seed"])]
        split = heldout_why.make_setting("why", r["dataset"], heldout_why.SMOKE, 1e-2).split
        assert heldout_why.outliers(split.X_pool)[r["row"]]
        assert abs(r["delta"]) < 1.0

    # the report: the tables with numbers, the command and its load, and the kept hand-written tail
    text = report.read_text()
    for ds in heldout_why.SMOKE_DATASETS:
        assert f"## {ds}" in text
    assert "| 15 | " in text and "| 20 | " in text  # per-budget rows
    assert "leverage in the penultimate features, pool percentile" in text
    assert "fraction above the pool's 95 % target quantile" in text
    assert "Ablation: the last round's head retrained" in text and "Leave-one-out" in text
    assert "Test RMSE per target bin" in text and "Test accuracy per true class" in text
    assert "replayed heads give the stored test metric in 24 of 24 rounds" in text
    assert f"## {clean}: a pool without some rows" in text and f"## {drop}: a pool without some rows" in text
    assert "Only pool row(s) 0 removed (`--drop`)" in text
    assert "python -m bench.experiments.heldout_why --smoke" in text and " → " in text
    assert text.count(heldout_why.MARKER) == 1
    report.write_text(text + "my notes\n")
    heldout_why.main(["--smoke", "--out", str(out), "--quiet", "--report-only"])
    again = report.read_text()
    assert again.endswith(heldout_why.MARKER + "\nmy notes\n")
    assert len(read_results(out / "results.csv")) == len(every)  # nothing re-run


def test_pool_percentile_and_leverage() -> None:
    values = np.arange(10, dtype=float)
    ref = np.arange(10)
    assert heldout_why.pool_percentile(values, np.array([9]), ref) == 95.0
    assert heldout_why.pool_percentile(values, np.array([0]), ref) == 5.0
    # leverage: a row far along a rare direction scores highest; the mean leverage is about the rank
    rng = np.random.default_rng(0)
    phi = rng.standard_normal((200, 3))
    phi[0] = [0.0, 0.0, 12.0]
    lev = heldout_why.leverage(phi)
    assert int(np.argmax(lev)) == 0
    assert abs(lev.mean() - 3.0) < 0.05


def test_seeds_needed() -> None:
    # mean 1, sd 1: ((1.96 + 0.84) * 1 / 1)^2 = 7.85 -> 8 seeds
    assert heldout_why.seeds_needed(np.array([0.0, 1.0, 2.0])) == 8.0
    assert heldout_why.seeds_needed(np.array([-1.0, 1.0])) == float("inf")

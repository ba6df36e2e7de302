"""The cold-start benchmark at smoke size: every (config, strategy, seed) has one finite row, the picks are
new rows of the right number, strategies of a seed start from the same labels, and a rerun resumes."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.experiments import cold_start
from bench.experiments.common import read_results


def test_cold_start_smoke_end_to_end(tmp_path: Path) -> None:
    out = cold_start.main(["--smoke", "--out", str(tmp_path), "--quiet"])
    rows = read_results(out / "results.csv")
    configs = {"wine-m0-B6", "wine-m1pc-B6", "diabetes-m0-B6"}
    assert {r["config"] for r in rows} == configs
    by_config = defaultdict(set)
    for r in rows:
        by_config[r["config"]].add(r["strategy"])
        assert r["round"] == 1 and np.isfinite(r["value"])
        assert r["metric"] == ("rmse" if r["config"].startswith("diabetes") else "accuracy")
        assert r["labels"] == 6 + (3 if "m1pc" in r["config"] else 0)
    assert by_config["wine-m0-B6"] == {"random", "typiclust", "kmeanspp", "bait", "badge"}
    assert by_config["diabetes-m0-B6"] == {"random", "typiclust", "kmeanspp", "bait"}
    assert len(rows) == (5 + 5 + 4) * 2  # two seeds
    # same initial labels for every strategy of a (config, seed)
    hashes = defaultdict(set)
    for r in rows:
        hashes[(r["config"], r["seed"])].add(r["init_hash"])
    assert all(len(h) == 1 for h in hashes.values())
    picks = [json.loads(line) for line in (out / "picks.jsonl").read_text().splitlines()]
    assert len(picks) == len(rows)
    assert all(len(set(p["picked"])) == 6 for p in picks)
    summary = (out / "summary.md").read_text()
    assert "| wine-m0-B6 | accuracy | 2 |" in summary and "typiclust vs random:" in summary
    # a rerun finds every row done and writes nothing new
    before = (out / "results.csv").read_text()
    cold_start.main(["--smoke", "--out", str(tmp_path), "--quiet"])
    assert (out / "results.csv").read_text() == before


def test_initial_labels_per_class_are_stratified() -> None:
    data = cold_start.load("wine", 0)
    rows = cold_start.initial(data, "2pc", seed=3)
    assert np.bincount(data.y_pool[rows], minlength=3).tolist() == [2, 2, 2]
    assert cold_start.initial(data, "0", seed=3).shape == (0,)
    assert rows.tolist() == cold_start.initial(data, "2pc", seed=3).tolist()

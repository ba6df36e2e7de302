"""The binary-text experiment at smoke size: on a synthetic stand-in (always), on the suite's fine-foods and
austen-pair embeddings (when fetched), and its BAIT-vs-others verdicts on hand-made results."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from bench import suite
from bench.experiments import text_binary
from bench.experiments.common import read_results

STRATEGIES = {"bait", "badge", "margin", "coreset", "typiclust", "random"}
SMOKE_LABELS = [10, 20, 30]  # m0 10, two rounds of 10


def _check_outputs(out: Path, datasets: list[str], seeds: int = 2) -> list[dict]:
    rows = read_results(out / "results.csv")
    assert {r["config"] for r in rows} == set(datasets)
    assert {r["strategy"] for r in rows} == STRATEGIES
    got: dict[tuple[str, str], dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    for r in rows:
        assert r["experiment"] == "text_binary" and r["metric"] == "accuracy"
        assert 0.0 <= r["value"] <= 1.0
        got[(r["config"], r["strategy"])][r["labels"]].add(r["seed"])
    for d in datasets:
        for s in STRATEGIES:  # every strategy: a row per budget, for every seed
            assert sorted(got[(d, s)]) == SMOKE_LABELS, (d, s)
            assert all(seen == set(range(seeds)) for seen in got[(d, s)].values()), (d, s)
    # the same initial labels for every strategy of a (dataset, seed)
    hashes: dict[tuple[str, int], set[str]] = defaultdict(set)
    for r in rows:
        hashes[(r["config"], r["seed"])].add(r["init_hash"])
    assert all(len(h) == 1 for h in hashes.values())
    # picks: a batch of new, distinct rows per selection round
    picks = [json.loads(line) for line in (out / "picks.jsonl").read_text().splitlines()]
    assert len(picks) == len(datasets) * len(STRATEGIES) * seeds * 2
    assert all(len(set(p["picked"])) == 10 for p in picks)
    run = json.loads((out / "runs.jsonl").read_text().splitlines()[-1])
    assert run["command"].startswith("python -m bench.experiments.text_binary --smoke")
    assert run["m0"] == 10 and run["batch"] == 10 and run["rounds"] == 2
    summary = (out / "summary.md").read_text()
    for d in datasets:
        assert f"## {d}" in summary
        section = summary.split(f"## {d}", 1)[1].split("\n## ", 1)[0]
        acc_head = "| labels | " + " | ".join(f"{s} (n={seeds})" for s in text_binary._order(list(STRATEGIES)))
        assert acc_head in section
        for lab in SMOKE_LABELS:  # a mean ± s.e. cell for every strategy at every budget
            line = next(ln for ln in section.splitlines() if ln.startswith(f"| {lab} | ") and "±" in ln)
            assert line.count("±") == len(STRATEGIES)
        comp_head = "| labels | " + " | ".join(f"vs {s}" for s in ["badge", "margin", "coreset", "typiclust", "random"])
        assert comp_head in section
        for lab in SMOKE_LABELS[1:]:  # BAIT vs each of the 5 others, at every budget after the initial labels
            after = section.split(comp_head, 1)[1]
            line = next(ln for ln in after.splitlines() if ln.startswith(f"| {lab} | "))
            assert line.count("(") == 5
    assert "## Tally" in summary
    return rows


def test_text_binary_smoke_synthetic(tmp_path: Path) -> None:
    out = text_binary.main(["--smoke", "--datasets", "synthetic", "--out", str(tmp_path), "--quiet"])
    rows = _check_outputs(out, ["synthetic"])
    final = [r["value"] for r in rows if r["labels"] == 30 and r["strategy"] == "random"]
    assert np.mean(final) > 0.7  # the stand-in is learnable: the head does train
    before = (out / "results.csv").read_text()
    text_binary.main(["--smoke", "--datasets", "synthetic", "--out", str(tmp_path), "--quiet"])
    assert (out / "results.csv").read_text() == before  # a rerun resumes: nothing recomputed


def test_text_binary_smoke_real_data(tmp_path: Path) -> None:
    missing = [d for d in text_binary.DATASETS if not suite.available(d)]
    if missing:
        pytest.skip(
            f"suite datasets {missing} not fetched into {suite.cache_dir()}: run "
            f"`python -m bench.suite fetch {' '.join(missing)}` (the synthetic smoke test still ran)"
        )
    out = text_binary.main(["--smoke", "--out", str(tmp_path), "--quiet"])
    rows = _check_outputs(out, list(text_binary.DATASETS))
    split = text_binary.load_split("fine-foods", 120, 80)
    assert split.X_pool.shape == (120, 384) and split.X_test.shape == (80, 384)
    assert np.allclose(np.linalg.norm(split.X_pool, axis=1), 1.0, atol=1e-3)  # MiniLM: unit length
    assert len(rows) == 2 * len(STRATEGIES) * 2 * 3


def _row(strategy: str, seed: int, rnd: int, value: float) -> dict:
    return {
        "experiment": "text_binary",
        "config": "toy",
        "strategy": strategy,
        "seed": seed,
        "round": rnd,
        "labels": 10 + 20 * rnd,
        "value": value,
    }


def test_comparisons_verdicts() -> None:
    rows = []
    for seed in range(5):
        noise = 0.01 * seed
        for rnd in range(3):
            base = 0.6 + 0.05 * rnd
            rows.append(_row("random", seed, rnd, base + noise))
            # bait: same at round 0, clearly better at 30 labels, clearly worse at 50
            rows.append(_row("bait", seed, rnd, base + noise + [0.0, 0.1 + 0.002 * seed, -0.1][rnd]))
            # margin: bait's equal up to noise that flips sign across seeds
            rows.append(_row("margin", seed, rnd, base + noise + (0.01 if seed % 2 else -0.01)))
    comp = text_binary.comparisons(rows)["toy"]
    assert set(comp) == {"random", "margin"}
    assert sorted(comp["random"]) == [30, 50]  # the initial-label budget is not compared
    diff, t, verdict, n = comp["random"][30]
    assert verdict == "better" and diff == pytest.approx(0.104) and t > 2.776 and n == 5
    assert comp["random"][50][2] == "worse" and comp["random"][50][1] < -2.776
    assert comp["margin"][30][2] == "better"
    assert comp["margin"][50][2] == "worse"
    # differences of +0.05 and -0.05 alternating over seeds: tied
    noisy = [_row("margin", s, 1, 0.6 + (0.05 if s % 2 else -0.05)) for s in range(5)]
    noisy += [_row("bait", s, 1, 0.6) for s in range(5)] + [_row("bait", s, 0, 0.5) for s in range(5)]
    assert text_binary.comparisons(noisy)["toy"]["margin"][30][2] == "tied"
    summary = text_binary.summarise([{**r, "metric": "accuracy"} for r in rows])
    assert "| toy | 1 / 0 / 1 | 1 / 0 / 1 |" in summary  # vs margin, vs random: 1 better, 0 tied, 1 worse

"""The stopping rule's offline replay (issue 28): its stops equal auto_heldout's (stop_recommendation on the
predictions) for every rule, its choice follows the stated rule on the tune half only, and its outputs carry the
command that made them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from bench.experiments import auto_heldout as ah
from bench.experiments import stopping_replay as sr

LABELS = [10, 20, 30, 40, 50, 60, 70, 80]
# the seed-mean curve reaches 95 % and 98 % of its final 0.9 at 50 labels: ok means a stop at 50 or 60
FLAT_AT_50 = [0.5, 0.7, 0.8, 0.85, 0.9, 0.9, 0.9, 0.9]
Runs = dict[tuple[str, str, int], tuple[list[float], list[np.ndarray]]]  # per run: validation, stop-set predictions


def _write_half(folder: Path, runs: Runs) -> None:
    """A results folder as auto_heldout writes it: results.csv (the tasks) and rounds.jsonl."""
    folder.mkdir(parents=True)
    log = ah.RoundLog(folder / "rounds.jsonl")
    fields = ["experiment", "config", "strategy", "seed", "round", "labels", "metric", "value", "train_epochs"]
    fields += ["stop_reason", "train_s", "select_s", "round_s", "init_hash"]
    with (folder / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for (cfg, strategy, seed), (vals, preds) in runs.items():
            metric = "rmse" if preds[0].dtype.kind == "f" else "accuracy"
            for i, (v, p) in enumerate(zip(vals, preds, strict=True)):
                log.add(
                    {
                        "config": cfg,
                        "strategy": strategy,
                        "seed": seed,
                        "round": i,
                        "labels": LABELS[i],
                        "validation": v,
                        "stop_preds": ah.encode(p),
                        "auto": None,
                        "cold": None,
                    }
                )
                w.writerow(
                    {
                        "experiment": "auto",
                        "config": cfg,
                        "strategy": strategy,
                        "seed": seed,
                        "round": i,
                        "labels": LABELS[i],
                        "metric": metric,
                        "value": 0.5,
                        "train_epochs": 1,
                        "stop_reason": "",
                        "train_s": 0.0,
                        "select_s": 0.0,
                        "round_s": 0.0,
                        "init_hash": "x",
                    }
                )


def _noisy_runs(seed: int) -> Runs:
    """Runs whose predictions change less every round (classification: flips; regression: shrinking noise)
    and whose validation curves rise with noise."""
    rng = np.random.default_rng(seed)
    runs: Runs = {}
    for s in range(3):
        base = rng.integers(0, 3, size=60).astype(np.int16)
        preds, vals = [], []
        for i in range(len(LABELS)):
            p = base.copy()
            flip = rng.random(60) < 0.3 / (i + 1)
            p[flip] = rng.integers(0, 3, size=int(flip.sum()))
            preds.append(p)
            vals.append(float(0.9 - 0.4 / (i + 1) + 0.02 * rng.standard_normal()))
        runs[("cls", "bait", s)] = (vals, preds)
        target = rng.standard_normal(60)
        rpreds = [(target + rng.standard_normal(60) * 0.5 / (i + 1)).astype(np.float32) for i in range(len(LABELS))]
        runs[("reg", "random", s)] = ([float(0.8 - 0.5 / (i + 1)) for i in range(len(LABELS))], rpreds)
    return runs


def _flat_runs() -> Runs:
    """Identical predictions every round (kappa 1) and a curve flat from 50 labels on."""
    same = np.array([0, 1, 2, 1, 0, 2, 2, 1, 0, 1] * 4, dtype=np.int16)
    return {("d", "bait", s): (FLAT_AT_50, [same] * len(LABELS)) for s in range(2)}


RULES = [
    sr.library_defaults(),
    {"threshold": 0.8, "window": 1, "slope_points": 3, "min_gain": 1.0},
    {"threshold": 0.9, "window": 2, "slope_points": 4, "min_gain": 0.3},
    {"threshold": 0.95, "window": 3, "slope_points": 5, "min_gain": 0.05},
    {"threshold": 0.6, "window": 5, "slope_points": 3, "min_gain": 10.0},
]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_replay_equals_stop_runs_for_every_rule(tmp_path: Path, seed: int) -> None:
    _write_half(tmp_path / "h", _noisy_runs(seed))
    half = sr.load_half(tmp_path / "h", "h")
    assert half.tasks == {"cls": "classification", "reg": "regression"}
    stops = set()
    for rule in RULES:
        records = sr.replay(half, rule)
        assert records == ah.stop_runs(half.log, half.tasks, rule), rule
        sr.verify(half, rule, records)
        stops |= {r["stop"] for r in records}
    assert None in stops and len(stops) > 2  # the rules stop the runs at different rounds, or not at all


def test_verify_catches_a_replay_that_differs(tmp_path: Path) -> None:
    _write_half(tmp_path / "h", _flat_runs())
    half = sr.load_half(tmp_path / "h", "h")
    rule = {"threshold": 0.9, "window": 4, "slope_points": 3, "min_gain": 10.0}
    records = sr.replay(half, rule)
    bad = [dict(records[0], stop=None), *records[1:]]
    with pytest.raises(RuntimeError, match="differs from stop_runs"):
        sr.verify(half, rule, bad)


def test_verdicts_of_hand_made_runs(tmp_path: Path) -> None:
    _write_half(tmp_path / "h", _flat_runs())
    half = sr.load_half(tmp_path / "h", "h")
    assert half.marks[("d", "bait")]["L95"] == 50 and half.marks[("d", "bait")]["L98"] == 50
    flat = {"threshold": 0.99, "slope_points": 3, "min_gain": 10.0}  # the slope never holds it back
    by_window = {w: sr.replay(half, {**flat, "window": w}) for w in (1, 4, 6)}
    assert {(r["stop"], r["verdict"]) for r in by_window[1]} == {(30.0, "early")}  # the first with 3 scored rounds
    assert {(r["stop"], r["verdict"]) for r in by_window[4]} == {(50.0, "ok")}
    assert {(r["stop"], r["verdict"]) for r in by_window[6]} == {(70.0, "late")}  # past 1.25 x 50
    # an agreement equal to the threshold is stable (kappa 1 against 1.0), as in stop_recommendation
    exact = sr.replay(half, {**flat, "window": 4, "threshold": 1.0})
    assert exact == ah.stop_runs(half.log, half.tasks, {**flat, "window": 4, "threshold": 1.0})
    assert {(r["stop"], r["verdict"]) for r in exact} == {(50.0, "ok")}
    # a slope that must be small keeps it labeling: the curve rose 10 points over the last 3 rounds at 50
    strict = sr.replay(half, {"threshold": 0.99, "window": 4, "slope_points": 3, "min_gain": 0.01})
    assert {(r["stop"], r["verdict"]) for r in strict} == {(70.0, "late")}


def test_rounds_without_new_labels_are_refused(tmp_path: Path) -> None:
    _write_half(tmp_path / "h", _flat_runs())
    lines = (tmp_path / "h" / "rounds.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    recs[3]["labels"] = recs[2]["labels"]
    (tmp_path / "h" / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(ValueError, match="rounds without new labels"):
        sr.load_half(tmp_path / "h", "h")


def test_choice_key_orders_early_then_ok_then_late_then_the_most_conservative() -> None:
    base = {"threshold": 0.9, "window": 3, "slope_points": 5, "min_gain": 0.1}
    rows = [
        {**base, "early": 1, "ok": 50, "late": 0},
        {**base, "early": 0, "ok": 10, "late": 30},
        {**base, "early": 0, "ok": 20, "late": 40},
        {**base, "early": 0, "ok": 20, "late": 35},
        {**base, "early": 0, "ok": 20, "late": 35, "threshold": 0.95},
        {**base, "early": 0, "ok": 20, "late": 35, "threshold": 0.95, "min_gain": 0.05},
    ]
    order = sorted(range(len(rows)), key=lambda i: sr.choice_key(rows[i]))
    assert order == [5, 4, 3, 2, 1, 0]


def test_main_chooses_on_tune_and_writes_its_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_half(tmp_path / "tune", _flat_runs())
    _write_half(tmp_path / "held", _noisy_runs(2))
    out = tmp_path / "out"
    argv = ["--tune", str(tmp_path / "tune"), "--heldout", str(tmp_path / "held"), "--out", str(out)]
    argv += ["--thresholds", "0.9,0.99", "--windows", "1,4,6", "--slope-points", "3", "--min-gains", "10"]
    choice = sr.main(argv)
    # window 1 stops early, 6 late, 4 in the target; both thresholds tie (kappa 1): the higher one is chosen
    assert choice["chosen"] == {"threshold": 0.99, "window": 4, "slope_points": 3, "min_gain": 10.0}
    assert choice["tune"]["chosen"]["ok"] == 2 and choice["tune"]["chosen"]["early"] == 0
    assert choice["heldout"]["chosen"]["runs"] == 6
    printed = capsys.readouterr().out
    assert "CHOSEN on the tune half: threshold 0.99, window 4, slope_points 3, min_gain 10.0" in printed
    assert "HELD-OUT half" in printed and "identical" in printed
    command = "python -m bench.experiments.stopping_replay " + " ".join(argv)
    assert json.loads((out / "choice.json").read_text())["command"] == command
    for name in ("tune_grid.csv", "heldout_runs.csv"):
        first, *rest = (out / name).read_text().splitlines()
        assert first == "# " + command
        rows = list(csv.DictReader(rest))
        assert len(rows) == 6  # 2 x 3 settings; 6 held-out runs
    grid = list(csv.DictReader((out / "tune_grid.csv").read_text().splitlines()[1:]))
    assert [(r["threshold"], r["window"], r["ok"], r["early"]) for r in grid[:2]] == [
        ("0.99", "4", "2", "0"),
        ("0.9", "4", "2", "0"),
    ]
    assert (out / "summary.txt").read_text().splitlines()[0] == command


def test_help_describes_the_choice_rule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        sr.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "The choice rule" in text and "--min-gains" in text and "--slope-points" in text


def test_out_of_reach_counts_runs_whose_ok_window_closes_before_the_rule_can_stop(tmp_path: Path) -> None:
    """A rule needs ``window`` compared rounds and 3 scored ones before it can stop: with L98 at 20 labels (1.25
    L98 = 25) the first possible stop (30 labels for window <= 2, 40 for 3) is late for every rule; with L98 at
    50 it is in reach up to window 5 (60 labels <= 62.5) and out of reach at window 6 (70 labels)."""
    same = np.zeros(60, dtype=np.int16)
    early = [0.5, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]  # the seed-mean curve is at 98 % of 0.9 at 20 labels
    _write_half(tmp_path / "e", {("e", "bait", 0): (early, [same] * len(LABELS))})
    _write_half(tmp_path / "f", {("f", "bait", 0): (FLAT_AT_50, [same] * len(LABELS))})
    e, f = sr.load_half(tmp_path / "e", "e"), sr.load_half(tmp_path / "f", "f")
    assert e.marks[("e", "bait")]["L98"] == 20 and f.marks[("f", "bait")]["L98"] == 50
    assert sr.first_possible(e.curves[("e", "bait", 0)], 1) == 30.0
    assert sr.first_possible(e.curves[("e", "bait", 0)], 3) == 40.0
    assert sr.first_possible(e.curves[("e", "bait", 0)], 8) is None  # the run is shorter
    assert sr.out_of_reach(e, 1) == (1, 1)
    assert sr.out_of_reach(f, 5) == (0, 1) and sr.out_of_reach(f, 6) == (1, 1)

    # the bound is the replay's: identical predictions and a slope bound nothing reaches stop the rule there,
    # and a real slope bound waits for the flat part (the jump from 10 to 20 labels leaves the fit at 40)
    def stop(min_gain: float) -> float | None:
        rule = {"threshold": 0.99, "window": 1, "slope_points": 3, "min_gain": min_gain}
        return sr.first_stop(e.agreements[("e", "bait", 0)], e.curves[("e", "bait", 0)], "classification", rule)

    assert stop(100.0) == 30.0 and stop(0.01) == 40.0

"""The auto-vs-fixed experiment (issue 28) at smoke size on a synthetic stand-in: every run, every round record,
auto's history actually steering the bandit, and a report whose rows are complete and finite; plus the
stopping verdicts on hand-made curves."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bench.experiments import auto_heldout
from bench.experiments.common import read_results
from selection.auto import GAMMA, WARM_ARMS, bandit, check_history

STRATEGIES = {"bait", "badge", "margin", "random", "auto"}
SEEDS = 2
ROUNDS = auto_heldout.SMOKE["rounds"]
LABELS = [10, 15, 20, 25]  # m0 10, three rounds of 5


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("auto") / "out"
    auto_heldout.main(["--smoke", "--out", str(out), "--quiet"])
    return out


def test_every_run_and_round_is_recorded(smoke: Path) -> None:
    rows = read_results(smoke / "results.csv")
    assert {r["config"] for r in rows} == set(auto_heldout.SMOKE_DATASETS)
    assert {r["strategy"] for r in rows} == STRATEGIES
    assert len(rows) == len(STRATEGIES) * SEEDS * (ROUNDS + 1)
    for s in STRATEGIES:
        assert sorted({r["labels"] for r in rows if r["strategy"] == s}) == LABELS
    log = auto_heldout.RoundLog(smoke / "rounds.jsonl")
    assert len(log.records) == len(rows)
    for (cfg, strategy, seed, rnd), rec in log.records.items():
        assert 0.0 <= rec["validation"] <= 1.0
        preds = auto_heldout.decode(rec["stop_preds"])
        assert preds.shape == (auto_heldout.SMOKE["stop"],) and preds.min() >= 0 and preds.max() < 4
        # auto's history entry on every selecting round, nothing for the fixed strategies
        assert (rec["auto"] is not None) == (strategy == "auto" and rnd < ROUNDS), (cfg, strategy, seed, rnd)


def test_auto_history_is_kept_as_a_library_caller_keeps_it(smoke: Path) -> None:
    log = auto_heldout.RoundLog(smoke / "rounds.jsonl")
    cfg = auto_heldout.SMOKE_DATASETS[0]
    for seed in range(SEEDS):
        run = log.run((cfg, "auto", seed))
        assert [r["round"] for r in run] == list(range(ROUNDS + 1))
        # round 1's bandit saw one round (no reward yet: the prior's start); round 2's saw a validation gain
        start, _ = bandit([], WARM_ARMS["classification"], GAMMA, "classification")
        assert run[1]["auto"]["probabilities"] == pytest.approx(start)
        assert start["bait"] > max(v for a, v in start.items() if a != "bait")
        # the history the hook builds is valid for the library and carries labels, validation and n_labels
        setting, X_val, y_val, stop_rows = auto_heldout.make_setting(cfg, auto_heldout.SMOKE, 1e-2)
        hook = auto_heldout.AutoHook(setting, X_val, y_val, stop_rows, log)
        spec = SimpleNamespace(strategy="auto", name="auto", params={})
        state = SimpleNamespace(spec=spec, seed=seed, rnd=2)  # what it reads
        params = hook.select_params(state)  # type: ignore[arg-type]
        history = params["history"]
        assert "outlier_embeddings" not in params  # auto's default: no outlier check
        spec.params = dict(auto_heldout.auto_spec("auto-exclude-outliers", "classification").params)
        assert spec.params == {"exclude_outliers": True, "explore_validated": None}  # as it was measured
        on = hook.select_params(state)  # type: ignore[arg-type]
        assert on["outlier_embeddings"] is setting.split.X_pool  # the pool's own inputs, as the service checks
        spec.params = dict(auto_heldout.auto_spec("auto-keep-outliers", "classification").params)
        assert spec.params == {"exclude_outliers": False, "explore_validated": None}
        assert "outlier_embeddings" not in hook.select_params(state)  # type: ignore[arg-type]
        spec.params = {}
        rounds = check_history(history)
        assert [r.n_labels for r in rounds] == LABELS[:2]
        assert all(r.validation is not None for r in rounds)
        assert all(
            lab == int(setting.split.y_pool[p]) for r in rounds for p, lab in zip(r.picks, r.labels, strict=True)
        )
        # round 2's recorded distribution is the bandit's after that history: one validation reward (the gain
        # from round 0's head to round 1's), not the start of an empty history
        q, ev = bandit(rounds, WARM_ARMS["classification"], GAMMA, "classification")  # auto's defaults
        assert ev.mode == "validation" and len(ev.rewards) == 1
        assert run[2]["auto"]["probabilities"] == pytest.approx(q)


def test_report_rows_are_complete_and_finite(smoke: Path) -> None:
    rep = json.loads((smoke / "report.json").read_text())
    cfg = auto_heldout.SMOKE_DATASETS[0]
    assert {(r["dataset"], r["strategy"]) for r in rep["strategies"]} == {(cfg, s) for s in STRATEGIES}
    for r in rep["strategies"]:
        assert r["n_seeds"] == SEEDS and r["labels"] == LABELS[-1]
        for k in ("final", "final_se", "area", "norm_area"):
            assert math.isfinite(r[k]), (r["strategy"], k)
        assert r["labels_to_random_final"] is None or r["labels_to_random_final"] > 0
    random_row = next(r for r in rep["strategies"] if r["strategy"] == "random")
    assert random_row["norm_area"] == 0.0 and random_row["labels_to_random_final"] == 1.0
    (cmp_,) = rep["auto_vs"]
    assert cmp_["dataset"] == cfg and cmp_["best_fixed"] in STRATEGIES - {"auto"}
    for role in ("best", "random"):
        assert math.isfinite(cmp_[role]["diff"]) and not math.isnan(cmp_[role]["t"])
        assert cmp_[role]["verdict"] in ("better", "tied", "worse") and cmp_[role]["n_seeds"] == SEEDS
    (shares,) = rep["arm_shares"]
    assert shares["rounds"] == SEEDS * ROUNDS
    for key in ("round_share", "pick_share"):
        assert set(shares[key]) <= {"bait", "badge", "margin", "random", "typiclust", "kmeanspp"}
        assert sum(shares[key].values()) == pytest.approx(1.0)
    assert len(rep["stop_runs"]) == len(STRATEGIES) * SEEDS
    for r in rep["stop_runs"]:
        assert r["verdict"] in ("ok", "early", "late", "censored")
        assert r["L95"] is not None and r["L98"] is not None and r["L95"] <= r["L98"] <= LABELS[-1]
        assert r["stop"] is None or r["stop"] in LABELS
    by = {(s["dataset"], s["strategy"]): s for s in rep["stop_summary"]}
    assert by[("all", "all")]["runs"] == len(STRATEGIES) * SEEDS
    for s in rep["stop_summary"]:
        assert sum(s[v] for v in ("ok", "early", "late", "censored", "undefined")) == s["runs"]
    assert "## Stopping rule" in (smoke / "summary.md").read_text()


def test_rerun_resumes_without_recomputing(smoke: Path) -> None:
    before = (smoke / "rounds.jsonl").read_text()
    auto_heldout.main(["--smoke", "--out", str(smoke), "--quiet"])
    assert (smoke / "rounds.jsonl").read_text() == before
    assert len(read_results(smoke / "results.csv")) == len(STRATEGIES) * SEEDS * (ROUNDS + 1)


def test_a_run_added_to_a_committed_folder_reads_the_gzipped_rounds_too(smoke: Path, tmp_path: Path) -> None:
    """A committed folder keeps rounds.jsonl.gz; a new variant run appends to a plain rounds.jsonl beside it,
    and the log (and so the report and the stopping replay) must see both, the plain one winning a clash."""
    import gzip

    lines = (smoke / "rounds.jsonl").read_text().splitlines()
    folder = tmp_path / "committed"
    folder.mkdir()
    (folder / "rounds.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines[:-3]) + "\n").encode()))
    changed = {**json.loads(lines[-4]), "validation": 0.123}  # the gz's last record, recomputed
    (folder / "rounds.jsonl").write_text("".join(x + "\n" for x in lines[-3:]) + json.dumps(changed) + "\n")
    both = auto_heldout.RoundLog(folder / "rounds.jsonl")
    whole = auto_heldout.RoundLog(smoke / "rounds.jsonl")
    assert set(both.records) == set(whole.records) and len(both.records) == len(lines)
    key = (changed["config"], changed["strategy"], int(changed["seed"]), int(changed["round"]))
    assert both.records[key]["validation"] == 0.123


def _log_with(tmp_path: Path, vals: list[float], preds: list[list[int]], labels: list[int]) -> auto_heldout.RoundLog:
    log = auto_heldout.RoundLog(tmp_path / "rounds.jsonl")
    for i, (v, p, n) in enumerate(zip(vals, preds, labels, strict=True)):
        log.add(
            {
                "config": "d",
                "strategy": "bait",
                "seed": 0,
                "round": i,
                "labels": n,
                "validation": v,
                "stop_preds": auto_heldout.encode(np.array(p, dtype=np.int16)),
                "auto": None,
                "cold": None,
            }
        )
    return log


def test_stop_verdicts_on_hand_made_curves(tmp_path: Path) -> None:
    same = [0, 1, 0, 1, 1, 0, 0, 1] * 4  # identical predictions every round: kappa 1
    cls = {"d": "classification"}
    # L98 = L95 = 160; flat and stable by 180 (<= 1.25 x 160): ok
    log = _log_with(tmp_path / "a", [0.5, 0.9, 0.9, 0.9, 0.9, 0.9], [same] * 6, [100, 160, 165, 170, 175, 180])
    (run,) = auto_heldout.stop_runs(log, cls)
    assert (run["L98"], run["L95"], run["stop"], run["verdict"]) == (160, 160, 180, "ok")
    assert run["ratio_to_L98"] == pytest.approx(180 / 160)
    # flat from the start (L98 = 100) but the rule needs 3 compared rounds: stops at 400 > 125: late
    log = _log_with(tmp_path / "b", [0.9] * 6, [same] * 6, [100, 200, 300, 400, 500, 600])
    (run,) = auto_heldout.stop_runs(log, cls)
    assert (run["L98"], run["stop"], run["verdict"]) == (100, 400, "late")
    # still climbing at the last budget: never stops, and 1.25 L98 lies beyond it: censored
    log = _log_with(tmp_path / "c", [0.3, 0.4, 0.5, 0.6, 0.7, 0.9], [same] * 6, [100, 200, 300, 400, 500, 600])
    (run,) = auto_heldout.stop_runs(log, cls)
    assert (run["L98"], run["stop"], run["verdict"]) == (600, None, "censored")
    assert auto_heldout.first_reaching([1, 2, 3], [0.5, 0.97, 1.0], 0.98) == 3.0
    assert auto_heldout.first_reaching([1, 2], [0.2, -0.1], 0.98) is None


def test_auto_variant_names_give_their_parameters() -> None:
    """The variants measured before explore_validated keep explore's share (None); auto-ev<share> sets it."""
    spec = auto_heldout.auto_spec
    assert spec("auto", "classification").params == {}
    assert spec("auto-ev0.1", "classification").params == {"explore_validated": 0.1}
    assert spec("auto-ev0", "regression").params == {"explore_validated": 0.0}
    assert spec("auto-uniform", "regression").params == {"prior_bait": 0.5, "gamma": 0.2, "explore_validated": None}
    assert spec("auto-p0.9-g0.1", "classification").params == {
        "prior_bait": 0.9, "gamma": 0.1, "explore_validated": None,
    }  # fmt: skip
    assert spec("auto-exclude-outliers", "classification").params == {
        "exclude_outliers": True, "explore_validated": None,
    }  # fmt: skip
    for bad in ("auto-evx", "auto-p0.9", "auto-nonsense"):
        with pytest.raises(SystemExit, match="unknown auto variant"):
            spec(bad, "classification")


def test_seeds_that_give_no_seed_are_refused_before_anything_runs(tmp_path: Path) -> None:
    """'--seeds 0' is a count of none: it ran nothing and wrote no rows; now it says so."""
    from bench.experiments.common import parse_seeds

    assert parse_seeds("3") == [0, 1, 2] and parse_seeds("0-0") == [0] and parse_seeds("0,") == [0]
    assert parse_seeds("2-4") == [2, 3, 4] and parse_seeds("1,5") == [1, 5]
    for text in ("0", "5-4", ","):
        with pytest.raises(ValueError, match="gives no seed"):
            parse_seeds(text)
    with pytest.raises(ValueError, match="gives no seed"):
        auto_heldout.main(["--smoke", "--seeds", "0", "--out", str(tmp_path / "none"), "--quiet"])
    assert not (tmp_path / "none" / "results.csv").exists()

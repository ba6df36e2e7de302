"""The held-out lam check at smoke size (tune on scikit-learn's bundled sets, "hold out" synthetic
stand-ins), and its statistics on hand-made curves."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench import suite
from bench.experiments import heldout
from bench.experiments.common import read_results


@pytest.fixture()
def bundled_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private suite cache holding the scikit-learn-bundled tune sets (converted offline, no download)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("BAIT_DATASETS_DIR", str(cache))
    suite.fetch(list(heldout.SMOKE_TUNE), progress=False)
    return cache


def test_heldout_smoke_all_phases(tmp_path: Path, bundled_cache: Path) -> None:
    out = tmp_path / "out"
    heldout.main(["--smoke", "--phase", "all", "--out", str(out), "--quiet"])

    # choice.json: a lam from the grid for every task type, from the scores it lists
    choice = json.loads((out / "choice.json").read_text())
    assert set(choice["choice"]) == {"binary", "multiclass", "regression"}
    grid = set(heldout.LAM_GRID)
    assert choice["grid"] == list(heldout.LAM_GRID)
    for tt, lam in choice["choice"].items():
        assert lam in grid, (tt, lam)
        scores = choice["scores"][tt]
        assert set(scores) == {f"{x:g}" for x in heldout.LAM_GRID}
        assert scores[f"{lam:g}"] == max(scores.values())  # the best-scoring lam was picked
    assert choice["datasets"] == {"binary": ["breast-cancer"], "multiclass": ["wine"], "regression": ["diabetes"]}

    # tune: every grid lam and random, every seed, rounds 0..2 (10 -> 20 labels)
    tune = read_results(out / "tune" / "results.csv")
    assert {r["config"] for r in tune} == set(heldout.SMOKE_TUNE)
    assert {r["strategy"] for r in tune} == {heldout.lam_name(x) for x in heldout.LAM_GRID} | {"random"}
    assert len(tune) == 3 * 5 * 2 * 3
    assert sorted({r["labels"] for r in tune}) == [10, 15, 20]
    assert {r["metric"] for r in tune if r["config"] == "diabetes"} == {"rmse"}

    # heldout: the default and the chosen lam of the dataset's task type, plus random
    held = read_results(out / "heldout" / "results.csv")
    assert {r["config"] for r in held} == set(heldout.SMOKE_HELDOUT)
    for ds, tt in heldout.SYNTHETIC.items():
        want = {heldout.lam_name(0.01), heldout.lam_name(choice["choice"][tt]), "random"}
        assert {r["strategy"] for r in held if r["config"] == ds} == want
    for ds, chance in (("synthetic-binary", 0.5), ("synthetic-multiclass", 0.25)):  # the head does train
        acc = [r["value"] for r in held if r["config"] == ds and r["strategy"] == "random" and r["labels"] == 20]
        assert np.mean(acc) > chance + 0.1, (ds, acc)

    # summary: one overview row per held-out dataset per lam role, with numbers in it
    summary = (out / "summary.md").read_text()
    for ds, tt in heldout.SYNTHETIC.items():
        lam = choice["choice"][tt]
        rows = [ln for ln in summary.splitlines() if ln.startswith(f"| {ds} | {tt} |")]
        roles = sorted(ln.split(" | ")[3].split(" ")[0] for ln in rows)
        assert roles == ["chosen", "default"], rows
        default_row = next(ln for ln in rows if " | default | " in ln)
        chosen_row = next(ln for ln in rows if " | chosen" in ln)
        assert " | 0.01 | " in default_row
        assert f" | {lam:g} | " in chosen_row
        assert ("(= default)" in chosen_row) == (lam == 0.01)
        assert all("±" in ln and "%" in ln for ln in rows)
        assert f"## {ds}" in summary

    readme = (out / "README.md").read_text()
    assert readme.count("Verdict:") == 1
    assert "## Head, stop rule" not in readme  # no --variants, no variant section
    for ds in heldout.SYNTHETIC:
        assert any(ln.startswith(f"| {ds} | ") for ln in readme.splitlines())
    assert "| tune | `python -m bench.experiments.heldout --smoke --phase all" in readme
    assert "| heldout | `python -m bench.experiments.heldout --smoke --phase all" in readme
    runs = [json.loads(ln) for ln in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in runs] == ["tune", "heldout"]
    assert all(r["wall_s"] > 0 and len(r["load_start"]) == 3 for r in runs)

    before = (out / "heldout" / "results.csv").read_text()
    heldout.main(["--smoke", "--phase", "heldout", "--out", str(out), "--quiet"])
    assert (out / "heldout" / "results.csv").read_text() == before  # a rerun resumes: nothing recomputed


def test_heldout_smoke_variants(tmp_path: Path, bundled_cache: Path) -> None:
    out = tmp_path / "out"
    heldout.main(["--smoke", "--phase", "all", "--variants", "--out", str(out), "--quiet"])

    # tune: the grid and random as before, plus the six variant strategies, every seed and round
    tune = read_results(out / "tune" / "results.csv")
    variants = {
        heldout.LINEAR_BAIT,
        heldout.LINEAR_RANDOM,
        heldout.RAW_BAIT,
        heldout.PAPER_BAIT,
        heldout.SHORT_BAIT,
        heldout.SHORT_RANDOM,
    }
    assert variants == {
        "bait-lam0.01-linear",
        "random-linear",
        "bait-lam0.01-raw",
        "bait-lam0.01-paper",
        "bait-lam0.01-short",
        "random-short",
    }
    assert {r["strategy"] for r in tune} == {heldout.lam_name(x) for x in heldout.LAM_GRID} | {"random"} | variants
    assert len(tune) == 3 * 11 * 2 * 3
    for name in variants:
        got = {(r["config"], r["seed"], r["round"]) for r in tune if r["strategy"] == name}
        assert len(got) == 3 * 2 * 3, name
    # the variants really differ from the default: raw features and the paper convention pick other rows,
    # the linear head and the short budget score otherwise
    picks = [json.loads(ln) for ln in (out / "tune" / "picks.jsonl").read_text().splitlines()]
    by = {(p["strategy"], p["config"], p["seed"], p["round"]): p["picked"] for p in picks}
    default = heldout.lam_name(0.01)
    keys = [k[1:] for k in by if k[0] == default]
    assert any(by[(heldout.RAW_BAIT, *k)] != by[(default, *k)] for k in keys)
    assert any(by[(heldout.PAPER_BAIT, *k)] != by[(default, *k)] for k in keys)
    value = {(r["strategy"], r["config"], r["seed"], r["round"]): r["value"] for r in tune}
    assert any(value[("random-linear", *k)] != value[("random", *k)] for k in keys)
    assert any(value[("random-short", *k)] != value[("random", *k)] for k in keys)
    # the short head stops at a quarter of the smoke size's 15 epochs; the default's cap is the full 15
    epochs = {(r["strategy"], r["config"], r["seed"], r["round"]): r["train_epochs"] for r in tune}
    cap = heldout.short_epochs(heldout.SMOKE)
    assert cap == 3
    for name in (heldout.SHORT_BAIT, heldout.SHORT_RANDOM):
        assert max(epochs[(name, *k)] for k in keys) == cap
    assert max(epochs[(default, *k)] for k in keys) > cap
    # held-out phase: each task type's tune-half candidate (if any) runs on that type's held-out stand-in, as
    # a check beside the default; no other variant does
    held = read_results(out / "heldout" / "results.csv")
    cand = heldout.tune_picks(out)
    assert cand == {
        tt: r["candidate"] for tt, r in heldout.variant_scores(tune)["by_type"].items() if r["candidate"] != "default"
    }
    for ds, tt in heldout.SYNTHETIC.items():
        ran = variants & {r["strategy"] for r in held if r["config"] == ds}
        want = (
            {cand[tt], *([heldout.OWN_RANDOM[cand[tt]]] if cand[tt] in heldout.OWN_RANDOM else [])}
            if tt in cand
            else set()
        )
        assert ran == want, (ds, ran)
    runs = [json.loads(ln) for ln in (out / "runs.jsonl").read_text().splitlines()]
    assert sorted(runs[0]["variants"]) == sorted(variants) and "variants" not in runs[1]

    # report: the variant section, one row per task type with a pick, one row per tune dataset, one verdict
    readme = (out / "README.md").read_text()
    title = "## Head, stop rule, features and convention, chosen on the tune half (`--variants`)"
    assert readme.count(title) == 1
    section = readme[readme.index(title) : readme.index("## Held-out results")]
    lines = section.splitlines()
    scores = heldout.variant_scores(tune)
    for tt, ds in (("binary", "breast-cancer"), ("multiclass", "wine"), ("regression", "diabetes")):
        row = next(ln for ln in lines if ln.startswith(f"| {tt} | {ds} | "))
        assert row.count("%") == 5  # the default and the four variants
        pick, cand = scores["by_type"][tt]["pick"], scores["by_type"][tt]["candidate"]
        cand_label = "—" if cand == "default" else heldout.VARIANTS[cand]
        assert row.endswith(f" | {cand_label} | **{'default' if pick == 'default' else heldout.VARIANTS[pick]}** |")
        ds_row = next(ln for ln in lines if ln.startswith(f"| {ds} | {tt} | "))
        # default, four variants, two variants against random with their own head; a paired t per variant
        assert ds_row.count("%") == 7 and ds_row.count(", t ") == 4
        assert set(scores["per_dataset"][ds]["vs_own_random"]) == {heldout.LINEAR_BAIT, heldout.SHORT_BAIT}
    header = next(ln for ln in lines if ln.startswith("| dataset | task | default | "))
    assert "convention=paper" in header and "stop=max_epochs/4 vs random-short" in header
    verdict = [ln for ln in lines if ln.startswith("Variant verdict: ")]
    assert len(verdict) == 1 and all(f"{tt}: " in verdict[0] for tt in heldout.TASK_TYPES)

    with pytest.raises(SystemExit, match="tune phase"):
        heldout.main(["--smoke", "--phase", "heldout", "--variants", "--out", str(out), "--quiet"])


def test_variant_pick_only_when_it_beats_the_default() -> None:
    d = heldout.lam_name(0.01)
    base = {
        ("synthetic-binary", "random"): [[0.5, 0.6, 0.7]] * 2,
        ("synthetic-binary", d): [[0.5, 0.7, 0.8]] * 2,  # normalised area (0.75 - 0.65) / 0.65
        ("synthetic-binary", heldout.LINEAR_BAIT): [[0.5, 0.6, 0.7]] * 2,
        ("synthetic-binary", heldout.LINEAR_RANDOM): [[0.5, 0.5, 0.6]] * 2,
        ("synthetic-binary", heldout.RAW_BAIT): [[0.5, 0.7, 0.8]] * 2,  # ties the default: no new pick
    }
    got = heldout.variant_scores(_rows(base))
    r = got["by_type"]["binary"]
    assert r["pick"] == "default"
    assert r["mean"][d] == pytest.approx(0.1 / 0.65)
    assert r["mean"][heldout.LINEAR_BAIT] == pytest.approx(0.0)
    assert got["per_dataset"]["synthetic-binary"]["vs_own_random"] == {heldout.LINEAR_BAIT: pytest.approx(0.1 / 0.55)}
    better = base | {("synthetic-binary", heldout.RAW_BAIT): [[0.5, 0.75, 0.85]] * 2}
    assert heldout.variant_scores(_rows(better))["by_type"]["binary"]["pick"] == heldout.RAW_BAIT
    md = heldout.variants_md(_rows(better))
    assert any(ln.startswith("| binary | synthetic-binary | ") and ln.endswith(" | **features=raw** |") for ln in md)
    # the stop-rule variant: picked when it beats the default against the MLP head's random, and scored
    # against random with its own short-budget head; the paper convention, below the default, is not
    short = base | {
        ("synthetic-binary", heldout.SHORT_BAIT): [[0.5, 0.72, 0.85]] * 2,  # (0.785 - 0.65) / 0.65
        ("synthetic-binary", heldout.SHORT_RANDOM): [[0.5, 0.55, 0.65]] * 2,
        ("synthetic-binary", heldout.PAPER_BAIT): [[0.5, 0.65, 0.75]] * 2,  # (0.7 - 0.65) / 0.65
    }
    got = heldout.variant_scores(_rows(short))
    assert got["by_type"]["binary"]["pick"] == heldout.SHORT_BAIT
    assert got["by_type"]["binary"]["mean"][heldout.PAPER_BAIT] == pytest.approx(0.05 / 0.65)
    assert got["per_dataset"]["synthetic-binary"]["vs_own_random"][heldout.SHORT_BAIT] == pytest.approx(0.185 / 0.6)
    md = heldout.variants_md(_rows(short))
    row = next(ln for ln in md if ln.startswith("| binary | synthetic-binary | "))
    assert row.endswith(" | **stop=max_epochs/4** |")
    # RMSE: the variant with the lower errors is the better one
    reg = {
        ("synthetic-regression", "random"): [[1.0, 0.9, 0.8]] * 2,
        ("synthetic-regression", d): [[1.0, 0.7, 0.6]] * 2,
        ("synthetic-regression", heldout.LINEAR_BAIT): [[1.0, 0.6, 0.5]] * 2,
        ("synthetic-regression", heldout.RAW_BAIT): [[1.0, 0.8, 0.7]] * 2,
    }
    assert heldout.variant_scores(_rows(reg, "rmse"))["by_type"]["regression"]["pick"] == heldout.LINEAR_BAIT
    assert heldout.variants_md(_rows({k: v for k, v in base.items() if "bait-lam0.01-" not in k[1]})) == []


def test_phases_refuse_the_other_half(tmp_path: Path, bundled_cache: Path) -> None:
    with pytest.raises(SystemExit, match="tune-half datasets only"):
        heldout.main(["--smoke", "--phase", "tune", "--datasets", "sonar", "--out", str(tmp_path), "--quiet"])
    with pytest.raises(SystemExit, match="heldout-half datasets only"):
        heldout.main(["--smoke", "--phase", "heldout", "--datasets", "wine", "--out", str(tmp_path), "--quiet"])


def test_a_variant_replaces_the_default_only_with_significant_evidence() -> None:
    d = heldout.lam_name(0.01)
    # three seeds; raw features ahead of the default on the mean but not consistently across seeds
    noisy = {
        ("synthetic-binary", "random"): [[0.5, 0.6, 0.7]] * 3,
        ("synthetic-binary", d): [[0.5, 0.7, 0.8], [0.5, 0.7, 0.8], [0.5, 0.7, 0.8]],
        ("synthetic-binary", heldout.RAW_BAIT): [[0.5, 0.9, 0.9], [0.5, 0.6, 0.7], [0.5, 0.72, 0.82]],
    }
    r = heldout.variant_scores(_rows(noisy))["by_type"]["binary"]
    assert r["mean"][heldout.RAW_BAIT] > r["mean"][d]
    assert (r["candidate"], r["pick"]) == (heldout.RAW_BAIT, "default")
    row = next(ln for ln in heldout.variants_md(_rows(noisy)) if ln.startswith("| binary | "))
    assert row.endswith(" | features=raw | **default** |")
    # consistently ahead on every seed: significant, and it replaces the default
    steady = noisy | {("synthetic-binary", heldout.RAW_BAIT): [[0.5, 0.75, 0.85], [0.5, 0.76, 0.85], [0.5, 0.75, 0.86]]}
    r = heldout.variant_scores(_rows(steady))["by_type"]["binary"]
    assert (r["candidate"], r["pick"]) == (heldout.RAW_BAIT, heldout.RAW_BAIT)


def _rows(curves: dict[tuple[str, str], list[list[float]]], metric: str = "accuracy") -> list[dict]:
    """Results rows from config/strategy -> per-seed curves at labels 10, 20, 30."""
    out = []
    for (cfg, strat), per in curves.items():
        for seed, vals in enumerate(per):
            for rnd, v in enumerate(vals):
                out.append(
                    {"config": cfg, "strategy": strat, "seed": seed, "round": rnd, "labels": 10 + 10 * rnd}
                    | {"metric": metric, "value": v, "experiment": "heldout-tune"}
                )
    return out


def test_choose_picks_best_normalised_area_per_task_type() -> None:
    b1, b2 = heldout.lam_name(0.1), heldout.lam_name(1.0)
    d, s = heldout.lam_name(0.01), heldout.lam_name(0.001)
    curves = {
        ("synthetic-binary", "random"): [[0.5, 0.6, 0.7]] * 2,
        ("synthetic-binary", d): [[0.5, 0.6, 0.7]] * 2,
        ("synthetic-binary", s): [[0.5, 0.5, 0.6]] * 2,
        ("synthetic-binary", b1): [[0.5, 0.75, 0.8]] * 2,  # best: area 0.775 vs 0.65
        ("synthetic-binary", b2): [[0.5, 0.7, 0.7]] * 2,
    }
    got = heldout.choose(_rows(curves))
    assert got["choice"] == {"binary": 0.1}
    assert got["per_dataset"]["synthetic-binary"]["0.1"] == pytest.approx((0.775 - 0.65) / 0.65)
    assert got["per_dataset"]["synthetic-binary"]["0.01"] == pytest.approx(0.0)
    # RMSE: lower is better, so the lam with the smallest errors wins; an exact tie keeps the default
    reg = {
        ("synthetic-regression", "random"): [[1.0, 0.9, 0.8]] * 2,
        ("synthetic-regression", d): [[1.0, 0.7, 0.6]] * 2,
        ("synthetic-regression", s): [[1.0, 0.7, 0.6]] * 2,
        ("synthetic-regression", b1): [[1.0, 0.95, 0.9]] * 2,
        ("synthetic-regression", b2): [[1.0, 0.8, 0.8]] * 2,
    }
    got = heldout.choose(_rows(reg, "rmse"))
    assert got["choice"] == {"regression": 0.01}
    assert got["scores"]["regression"]["0.1"] < 0 < got["scores"]["regression"]["0.01"]


def test_labels_to_reach_interpolates() -> None:
    labels = np.array([10, 20, 30, 40])
    assert heldout.labels_to_reach(labels, np.array([0.5, 0.6, 0.8, 0.9]), 0.7, "accuracy") == pytest.approx(25.0)
    assert heldout.labels_to_reach(labels, np.array([0.5, 0.6, 0.65, 0.69]), 0.7, "accuracy") == math.inf
    assert heldout.labels_to_reach(labels, np.array([1.0, 0.8, 0.6, 0.5]), 0.7, "rmse") == pytest.approx(25.0)
    assert heldout.labels_to_reach(labels, np.array([0.9, 0.95, 0.9, 0.9]), 0.8, "accuracy") == 10.0


def test_paired_budgets_sign_follows_metric() -> None:
    mine = {0: {10: 1.0, 20: 0.50}, 1: {10: 1.0, 20: 0.52}, 2: {10: 1.0, 20: 0.49}}
    theirs = {0: {10: 1.0, 20: 0.80}, 1: {10: 1.0, 20: 0.81}, 2: {10: 1.0, 20: 0.79}}
    rmse = heldout.paired_budgets(mine, theirs, 10, "rmse")
    assert list(rmse) == [20] and rmse[20][2] == "better" and rmse[20][0] == pytest.approx(-0.2967, abs=1e-3)
    assert heldout.paired_budgets(mine, theirs, 10, "accuracy")[20][2] == "worse"


def test_posthoc_grid_only_when_extra_lams_ran() -> None:
    d, b = heldout.lam_name(0.01), heldout.lam_name(0.1)
    base = {
        ("synthetic-binary", "random"): [[0.5, 0.6, 0.7], [0.5, 0.62, 0.7], [0.5, 0.6, 0.71]],
        ("synthetic-binary", d): [[0.5, 0.6, 0.7], [0.5, 0.6, 0.72], [0.5, 0.61, 0.7]],
    }
    assert heldout.posthoc_grid_md(_rows(base), {"binary": 0.01}) == []  # only the official lams: no supplement
    extra = base | {("synthetic-binary", b): [[0.5, 0.7, 0.8], [0.5, 0.71, 0.8], [0.5, 0.7, 0.82]]}
    lines = heldout.posthoc_grid_md(_rows(extra), {"binary": 0.01})
    assert lines[0].startswith("## Supplementary, post hoc")
    row = next(ln for ln in lines if ln.startswith("| synthetic-binary | binary |"))
    assert row.endswith(" | 0.1 |") and "**better**" in row  # 0.1 beats 0.01 on every seed by ~0.1
    type_row = next(ln for ln in lines if ln.startswith("| binary | "))
    assert type_row.endswith(" | 0.1 | 0.01 |")  # best on held-out 0.1, chosen on tune 0.01
    assert "1 are significantly better and 0 significantly worse" in lines[-2]
    assert lines[-2].endswith("for binary (0.1).")


def test_machines_line_names_every_machine() -> None:
    one = {"machine": "box; torch (2 threads)", "started": "t0"}
    assert heldout.machines_line([one, one | {"started": "t1"}]) == "Machine: box; torch (2 threads)."
    two = heldout.machines_line([one, {"machine": "box; torch (1 threads)", "started": "t2"}])
    assert two == "Machines: box; torch (2 threads) (runs started t0); box; torch (1 threads) (runs started t2)."

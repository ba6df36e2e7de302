"""Why BAIT loses to random on two held-out datasets (issue 14): diagnostics of the batches it picks.

The held-out check (:mod:`bench.experiments.heldout`) found BAIT (lam = 0.01, MLP head, 20 -> 80 labels,
batches of 10) never reaching random's final metric on **diamonds** (regression) and **sonar** (binary).
This experiment re-runs that setting -- the same :func:`~bench.experiments.heldout.make_setting` sizes,
:func:`~bench.experiments.heldout.load_split` data and :func:`~bench.experiments.common.run_grid` loop, so
seeds 0-2 pick the held-out check's rows (test metrics equal up to float rounding across torch thread
counts) -- with more seeds (default 20), and then *replays*
every run: for each round it rebuilds the labeled set from ``picks.jsonl``, retrains the head with the
round's seed (bitwise the same head, which the replay checks against the stored test metric) and records

per picked batch (compared with the pool's unlabeled rows at that round):
    * ``feat_norm_pct``: mean pool percentile of the norm of the head's penultimate features of the picks
      (random picks average about 50);
    * ``lev_pct``: mean pool percentile of their leverage ``phi^T (Phi^T Phi / n + eps I)^-1 phi`` in
      those features (``Phi`` the whole pool's features, ``eps`` = 1e-3 of the mean eigenvalue);
    * ``dist_pct``: mean pool percentile of the raw inputs' distance to the pool mean;
    * ``outlier``: fraction of picks with some input coordinate more than 3 pool s.d. from its mean;
    * regression: ``y_pct`` (mean pool percentile of the target), ``tail_lo`` / ``tail_hi`` (fractions
      below the pool's 5 % / above its 95 % target quantile; 0.05 each for random), ``abs_y`` (mean
      ``|y - pool mean|`` in target s.d.);
    * classification: ``class1`` (fraction of class 1), ``margin`` (mean ``|p1 - p0|`` of the head that
      picked, the pool's unlabeled mean in ``pool_margin``), ``correct`` (fraction the head already
      classified right);

per round, on the test set:
    * the metric (checked against ``results.csv``);
    * regression: RMSE per target bin (bins at the pool's 5 / 25 / 50 / 75 / 95 % target quantiles;
      ``mid90`` and ``tails`` split at 5 / 95 %) and the mean distance of the bin's test rows to their
      nearest labeled row (raw inputs: how well the labeled set covers them);
    * classification: accuracy per true class.

Then, to test whether the input outliers BAIT picks are what costs it: the last round's head retrained
without the picked outliers (and, as a control, without as many other picks), a leave-one-out over each
picked outlier row, and both strategies re-run on the pool with its input outliers removed (``--clean``,
config ``<dataset>-no-outliers``) and with only given rows removed (``--drop``, config
``<dataset>-minus-<rows>``); the test set is unchanged.

The report (``why.md``) gives, per dataset: BAIT and random per budget over all seeds (mean difference,
paired t, the 5 % critical value, and how many seeds a 5 %-level test with 80 % power would need for the
observed difference), the pick diagnostics (mean over rounds; BAIT minus random paired over seeds), the
per-round tail / leverage fractions, and the test error per bin. The text below the marker line
``<!-- hand-written ... -->`` in an existing ``why.md`` is kept when the report is regenerated.

    python -m bench.experiments.heldout_why                 # diamonds + sonar, 20 seeds
    python -m bench.experiments.heldout_why --seeds 0-19 --datasets sonar
    python -m bench.experiments.heldout_why --smoke --out /tmp/why   # < 60 s, synthetic stand-ins
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.experiments.common import (
    RESULTS_ROOT,
    ResultStore,
    Setting,
    initial_labels,
    parse_seeds,
    plot_curves,
    read_results,
    recorded_run,
    round_seed,
    run_grid,
    run_timing,
)
from bench.experiments.heldout import (
    DEFAULT_LAM,
    FULL,
    LR,
    RANDOM,
    SMOKE,
    bait_spec,
    lower_is_better,
    make_setting,
    paired_budgets,
    per_seed,
)
from bench.experiments.penalty_matrix import paired_t, t_threshold
from selection.heads import evaluate, predict, train_head

EXPERIMENT = "heldout_why"
DATASETS = ("diamonds", "sonar")
SMOKE_DATASETS = ("synthetic-regression", "synthetic-binary")
BAIT = bait_spec(DEFAULT_LAM)
SPECS = (BAIT, RANDOM)
DEFAULT_SEEDS = "20"
SMOKE_SEEDS = "2"
#: target bins (edges are pool quantiles, in %)
BIN_EDGES = (5, 25, 50, 75, 95)
BIN_NAMES = ("<5", "5-25", "25-50", "50-75", "75-95", ">95")
#: input names where known (diamonds: ``feature_names`` of shared/data/diamonds.npz)
FEATURE_NAMES = {"diamonds": ("carat", "cut", "color", "clarity", "depth", "table", "x", "y", "z")}
MARKER = "<!-- hand-written below this line: kept when the report is regenerated -->"
#: normal quantiles for the seeds-needed estimate (5 % two-sided, 80 % power)
Z_ALPHA, Z_POWER = 1.959964, 0.841621


# --------------------------------------------------------------------------------------------------
# Diagnostics
# --------------------------------------------------------------------------------------------------


def pool_percentile(values: np.ndarray, picked: np.ndarray, reference: np.ndarray) -> float:
    """Mean percentile (0-100) of ``values[picked]`` among ``values[reference]``."""
    ref = np.sort(values[reference])
    ranks = np.searchsorted(ref, values[picked], side="left") + np.searchsorted(ref, values[picked], side="right")
    return float(np.mean(ranks / 2.0 / len(ref)) * 100.0)


def leverage(features: np.ndarray) -> np.ndarray:
    """``phi_i^T (Phi^T Phi / n + eps I)^-1 phi_i`` of every row (``eps`` = 1e-3 of the mean eigenvalue)."""
    phi = features.astype(np.float64)
    cov = phi.T @ phi / phi.shape[0]
    eps = 1e-3 * max(float(np.trace(cov)) / cov.shape[0], 1e-12)
    inv = np.linalg.inv(cov + eps * np.eye(cov.shape[0]))
    return np.einsum("ij,jk,ik->i", phi, inv, phi)


def outliers(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` with some coordinate more than 3 s.d. (of ``x``'s own columns) from its mean."""
    z = np.abs(x - x.mean(axis=0)) / (x.std(axis=0) + 1e-12)
    return np.asarray(z.max(axis=1) > 3.0)


def cleaned(setting: Setting) -> Setting:
    """``setting`` with the pool's input outliers (:func:`outliers`) removed; config ``<config>-no-outliers``."""
    keep = ~outliers(setting.split.X_pool)
    split = replace(setting.split, X_pool=setting.split.X_pool[keep], y_pool=setting.split.y_pool[keep])
    return replace(setting, config=f"{setting.config}-no-outliers", split=split)


def without_rows(setting: Setting, rows: Sequence[int]) -> Setting:
    """``setting`` with the given pool rows removed; config ``<config>-minus-<rows>``."""
    keep = np.ones(setting.split.X_pool.shape[0], dtype=bool)
    keep[list(rows)] = False
    split = replace(setting.split, X_pool=setting.split.X_pool[keep], y_pool=setting.split.y_pool[keep])
    return replace(setting, config=f"{setting.config}-minus-{'-'.join(str(r) for r in rows)}", split=split)


def pick_stats(
    split_x: np.ndarray,
    y_pool: np.ndarray,
    features: np.ndarray,
    probs: np.ndarray | None,
    labeled: np.ndarray,
    picked: np.ndarray,
    regression: bool,
) -> dict[str, Any]:
    """Diagnostics of one picked batch against the pool's unlabeled rows (see the module docstring)."""
    n = split_x.shape[0]
    unl = np.setdiff1d(np.arange(n), labeled)
    mu, sd = split_x.mean(axis=0), split_x.std(axis=0) + 1e-12
    z = np.abs(split_x - mu) / sd
    dist = np.linalg.norm(split_x - mu, axis=1)
    out: dict[str, Any] = {
        "feat_norm_pct": pool_percentile(np.linalg.norm(features, axis=1), picked, unl),
        "lev_pct": pool_percentile(leverage(features), picked, unl),
        "dist_pct": pool_percentile(dist, picked, unl),
        "outlier": float(np.mean(z[picked].max(axis=1) > 3.0)),
        "pool_outlier": float(np.mean(z[unl].max(axis=1) > 3.0)),
        "outlier_dims": [float(v) for v in np.mean(z[picked] > 3.0, axis=0)],
        "pool_outlier_dims": [float(v) for v in np.mean(z[unl] > 3.0, axis=0)],
    }
    if regression:
        y = y_pool[:, 0].astype(np.float64)
        lo, hi = np.percentile(y, 5), np.percentile(y, 95)
        out.update(
            y_pct=pool_percentile(y, picked, unl),
            tail_lo=float(np.mean(y[picked] < lo)),
            tail_hi=float(np.mean(y[picked] > hi)),
            mid50=float(np.mean((y[picked] >= np.percentile(y, 25)) & (y[picked] <= np.percentile(y, 75)))),
            abs_y=float(np.mean(np.abs(y[picked] - y.mean()) / y.std())),
            pool_abs_y=float(np.mean(np.abs(y[unl] - y.mean()) / y.std())),
        )
    else:
        assert probs is not None
        pred = probs.argmax(axis=1)
        top2 = np.sort(probs, axis=1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
        out.update(
            class1=float(np.mean(y_pool[picked] == 1)),
            pool_class1=float(np.mean(y_pool[unl] == 1)),
            margin=float(np.mean(margin[picked])),
            pool_margin=float(np.mean(margin[unl])),
            correct=float(np.mean(pred[picked] == y_pool[picked])),
            pool_correct=float(np.mean(pred[unl] == y_pool[unl])),
        )
    return out


def target_bins(y_pool: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Bin index (0..5, :data:`BIN_NAMES`) of each target ``y`` at the pool's quantiles."""
    edges = np.percentile(y_pool[:, 0], BIN_EDGES)
    return np.searchsorted(edges, y[:, 0], side="right")


def test_stats(setting: Setting, trained: Any, labeled: np.ndarray) -> dict[str, Any]:
    """Per-round test diagnostics: RMSE and labeled-set coverage per target bin, or accuracy per class."""
    split = setting.split
    out = predict(trained, torch.from_numpy(split.X_test))
    if split.task == "regression":
        assert out.outputs is not None
        err = (out.outputs.numpy().astype(np.float64) - split.y_test.astype(np.float64))[:, 0]
        bins = target_bins(split.y_pool, split.y_test)
        d = np.linalg.norm(split.X_test[:, None, :] - split.X_pool[labeled][None, :, :], axis=2).min(axis=1)
        groups = {name: bins == i for i, name in enumerate(BIN_NAMES)}
        groups["mid90"] = (bins > 0) & (bins < len(BIN_NAMES) - 1)
        groups["tails"] = ~groups["mid90"]
        return {
            "rmse_bin": {k: float(np.sqrt(np.mean(err[m] ** 2))) if m.any() else math.nan for k, m in groups.items()},
            "cover_bin": {k: float(d[m].mean()) if m.any() else math.nan for k, m in groups.items()},
        }
    assert out.probs is not None
    pred = out.probs.numpy().argmax(axis=1)
    return {
        "acc_class": {
            str(c): float(np.mean(pred[split.y_test == c] == c))
            for c in range(split.n_outputs)
            if (split.y_test == c).any()
        }
    }


def replay(setting: Setting, name: str, seed: int, store: ResultStore) -> list[dict[str, Any]]:
    """One record per round of run ``(setting, name, seed)``: the retrained head's test diagnostics and,
    before the last round, the picked batch's diagnostics (see the module docstring)."""
    split = setting.split
    base = (setting.experiment, setting.config, name, int(seed))
    picks = store.picks(base)
    stored = {
        int(r["round"]): float(r["value"])
        for r in store.rows()
        if tuple(r[k] for k in ("experiment", "config", "strategy")) == base[:3] and int(r["seed"]) == seed
    }
    labeled = list(initial_labels(split.X_pool.shape[0], setting.m0, seed).tolist())
    regression = split.task == "regression"
    records: list[dict[str, Any]] = []
    for rnd in range(setting.rounds + 1):
        rows = np.asarray(labeled, dtype=np.int64)
        trained = train_head(setting.head, split.X_pool[rows], split.y_pool[rows], seed=round_seed(seed, rnd))
        scores = evaluate(trained, split.X_test, split.y_test)
        value = float(scores["rmse"] if regression else scores["accuracy"])
        rec: dict[str, Any] = {
            "dataset": setting.config,
            "strategy": name,
            "seed": int(seed),
            "round": rnd,
            "labels": int(rows.shape[0]),
            "value": value,
            "replay_matches": bool(rnd in stored and abs(stored[rnd] - value) <= 1e-6 * max(1.0, abs(value))),
            **test_stats(setting, trained, rows),
        }
        if rnd < setting.rounds:
            picked = np.asarray(picks[rnd], dtype=np.int64)
            out = predict(trained, torch.from_numpy(split.X_pool))
            probs = None if out.probs is None else out.probs.numpy()
            rec["picks"] = pick_stats(split.X_pool, split.y_pool, out.features.numpy(), probs, rows, picked, regression)
            labeled.extend(picked.tolist())
        records.append(rec)
    return records


def ablation(setting: Setting, seed: int, store: ResultStore) -> list[dict[str, Any]]:
    """The last round's head retrained without the picked input outliers (:func:`outliers` of the pool).

    Per strategy: ``all`` (the final labeled set, as run), ``no_outliers`` (its picked rows with an input
    coordinate > 3 pool s.d. removed; the shared initial rows stay); for BAIT also ``control`` (as many of
    its other picked rows removed, at random), so a gain is not just from having fewer labels. Same seed
    and head as the run's last round."""
    split = setting.split
    bad = outliers(split.X_pool)
    init = initial_labels(split.X_pool.shape[0], setting.m0, seed)
    regression = split.task == "regression"
    recs: list[dict[str, Any]] = []
    for spec in SPECS:
        got = store.picks((setting.experiment, setting.config, spec.name, int(seed)))
        picked = np.concatenate([np.asarray(got[r], dtype=np.int64) for r in sorted(got)])
        full = np.concatenate([init, picked])
        drop = picked[bad[picked]]
        variants = {"all": full, "no_outliers": np.setdiff1d(full, drop)}
        if spec.name == BAIT.name:
            inliers = picked[~bad[picked]]
            rng = np.random.default_rng([seed, 0xAB1])
            ctrl = rng.choice(inliers, size=min(len(drop), len(inliers)), replace=False)
            variants["control"] = np.setdiff1d(full, ctrl)
        for name, rows in variants.items():
            trained = train_head(
                setting.head, split.X_pool[rows], split.y_pool[rows], seed=round_seed(seed, setting.rounds)
            )
            scores = evaluate(trained, split.X_test, split.y_test)
            recs.append(
                {
                    "dataset": setting.config,
                    "strategy": spec.name,
                    "seed": int(seed),
                    "variant": name,
                    "labels": int(rows.shape[0]),
                    "dropped": int(full.shape[0] - rows.shape[0]),
                    "value": float(scores["rmse"] if regression else scores["accuracy"]),
                    **test_stats(setting, trained, rows),
                }
            )
    return recs


def influence(setting: Setting, seed: int, store: ResultStore) -> list[dict[str, Any]]:
    """Leave-one-out over BAIT's picked input outliers: for each such row of its final labeled set, the last
    round's head retrained (same seed) without that row alone; the change of the test metric (and, for
    regression, of the RMSE per target bin) against the set as run."""
    split = setting.split
    bad = outliers(split.X_pool)
    init = initial_labels(split.X_pool.shape[0], setting.m0, seed)
    got = store.picks((setting.experiment, setting.config, BAIT.name, int(seed)))
    picked = np.concatenate([np.asarray(got[r], dtype=np.int64) for r in sorted(got)])
    picked_at = {int(i): r for r in got for i in got[r]}
    full = np.concatenate([init, picked])
    regression = split.task == "regression"

    def fit(rows: np.ndarray) -> tuple[float, dict[str, Any]]:
        trained = train_head(
            setting.head, split.X_pool[rows], split.y_pool[rows], seed=round_seed(seed, setting.rounds)
        )
        scores = evaluate(trained, split.X_test, split.y_test)
        return float(scores["rmse"] if regression else scores["accuracy"]), test_stats(setting, trained, rows)

    base_value, base_stats = fit(full)
    recs: list[dict[str, Any]] = []
    for row in picked[bad[picked]]:
        value, stats = fit(full[full != row])
        rec: dict[str, Any] = {
            "dataset": setting.config,
            "seed": int(seed),
            "row": int(row),
            "round": picked_at[int(row)],
            "value": value,
            "delta": value - base_value,
        }
        if regression:
            rec["delta_bin"] = {k: stats["rmse_bin"][k] - base_stats["rmse_bin"][k] for k in base_stats["rmse_bin"]}
        recs.append(rec)
    return recs


# --------------------------------------------------------------------------------------------------
# Statistics for the report
# --------------------------------------------------------------------------------------------------


def seeds_for(mean: float, sd: float) -> float:
    """Seeds a paired 5 % two-sided test with 80 % power needs to detect a true mean difference ``mean``
    when the per-seed differences have s.d. ``sd`` (normal approximation ``((z_a + z_b) sd / mean)^2``,
    rounded up); ``inf`` for a zero mean."""
    if mean == 0.0:
        return math.inf
    return float(math.ceil(((Z_ALPHA + Z_POWER) * sd / abs(mean)) ** 2))


def seeds_needed(diffs: np.ndarray) -> float:
    """:func:`seeds_for` the observed mean and s.d. of the per-seed differences ``diffs``."""
    return seeds_for(float(np.mean(diffs)), float(np.std(diffs, ddof=1)))


def budget_table(rows: Sequence[Mapping[str, Any]], dataset: str) -> list[dict[str, Any]]:
    """Per budget after the initial labels: BAIT and random means, the difference, its paired t over
    seeds, the sd of the per-seed differences and the seeds needed for 80 % power."""
    per = per_seed([r for r in rows if r["config"] == dataset])[dataset]
    metric = next(str(r["metric"]) for r in rows if r["config"] == dataset)
    m0 = min(int(r["labels"]) for r in rows if r["config"] == dataset)
    comp = paired_budgets(per[BAIT.name], per[RANDOM.name], m0, metric)
    out = []
    for lab, (diff, t, verdict, n) in sorted(comp.items()):
        seeds = sorted(s for s in set(per[BAIT.name]) & set(per[RANDOM.name]) if lab in per[BAIT.name][s])
        a = np.array([per[BAIT.name][s][lab] for s in seeds])
        b = np.array([per[RANDOM.name][s][lab] for s in seeds])
        out.append(
            {
                "labels": lab,
                "bait": float(a.mean()),
                "random": float(b.mean()),
                "diff": diff,
                "sd_diff": float(np.std(a - b, ddof=1)),
                "t": t,
                "crit": t_threshold(n),
                "verdict": verdict,
                "n": n,
                "seeds_needed": seeds_needed(a - b),
                "first3_t": paired_t(a[:3], b[:3]) if n >= 3 else math.nan,
                "first3_diff": float(np.mean(a[:3] - b[:3])) if n >= 3 else math.nan,
                # seeds to detect a true difference the size of seeds 0-2's, at this budget's spread
                "seeds_for_first3": seeds_for(float(np.mean(a[:3] - b[:3])), float(np.std(a - b, ddof=1)))
                if n >= 3
                else math.nan,
            }
        )
    return out


def _seed_means(records: Sequence[Mapping[str, Any]], key: str, field: str) -> dict[int, float]:
    """seed -> mean over that seed's picked batches of ``records[...][key][field]``."""
    got: dict[int, list[float]] = {}
    for r in records:
        if key in r and field in r[key]:
            got.setdefault(int(r["seed"]), []).append(float(r[key][field]))
    return {s: float(np.mean(v)) for s, v in got.items()}


def paired(bait: Mapping[int, float], rand: Mapping[int, float]) -> tuple[float, float, float, float, float]:
    """(BAIT mean, its s.e., random mean, its s.e., paired t of BAIT - random) over common seeds."""
    seeds = sorted(set(bait) & set(rand))
    a = np.array([bait[s] for s in seeds])
    b = np.array([rand[s] for s in seeds])
    n = len(seeds)
    se_a, se_b = (float(np.std(x, ddof=1) / math.sqrt(n)) if n > 1 else 0.0 for x in (a, b))
    return float(a.mean()), se_a, float(b.mean()), se_b, paired_t(a, b)


PICK_FIELDS: dict[str, tuple[str, str]] = {
    # field -> (label, what random would give)
    "feat_norm_pct": ("penultimate-feature norm, pool percentile", "≈ 50"),
    "lev_pct": ("leverage in the penultimate features, pool percentile", "≈ 50"),
    "dist_pct": ("input distance to the pool mean, pool percentile", "≈ 50"),
    "outlier": ("fraction with an input > 3 s.d. out", "pool_outlier"),
    "y_pct": ("target, pool percentile", "≈ 50"),
    "tail_lo": ("fraction below the pool's 5 % target quantile", "0.05"),
    "tail_hi": ("fraction above the pool's 95 % target quantile", "0.05"),
    "mid50": ("fraction between the pool's 25 % and 75 % target quantiles", "0.50"),
    "abs_y": ("mean |y - pool mean| (target s.d.)", "pool_abs_y"),
    "class1": ("fraction of class 1", "pool_class1"),
    "margin": ("margin |p1 - p0| of the picking head", "pool_margin"),
    "correct": ("fraction the picking head already classified right", "pool_correct"),
}


def _fmt_need(n: float) -> str:
    return "—" if math.isnan(n) else ("> 1000" if n > 1000 else f"{n:.0f}")


def _fmt_t(t: float) -> str:
    return "—" if math.isnan(t) else f"{t:+.2f}"


def pick_table_md(records: Sequence[Mapping[str, Any]], n_seeds: int) -> list[str]:
    bait = [r for r in records if r["strategy"] == BAIT.name]
    rand = [r for r in records if r["strategy"] == RANDOM.name]
    lines = [
        f"Picked batches, mean over the {max(len({r['round'] for r in bait}) - 1, 0)} selection rounds, "
        f"then mean ± s.e. over {n_seeds} seeds; t = paired t of BAIT − random over seeds "
        f"(5 % critical value {t_threshold(n_seeds):.2f}). 'pool' = the same quantity over the unlabeled pool "
        "(the reference a random pick matches in expectation).",
        "",
        "| quantity | BAIT | random | pool | t (BAIT − random) |",
        "|---|---|---|---|---|",
    ]
    for f, (label, ref) in PICK_FIELDS.items():
        bm = _seed_means(bait, "picks", f)
        if not bm:
            continue
        b, bse, r, rse, t = paired(bm, _seed_means(rand, "picks", f))
        if ref.startswith("pool_"):
            pm = _seed_means(bait, "picks", ref)
            refs = f"{np.mean(list(pm.values())):.3f}"
        else:
            refs = ref
        lines.append(f"| {label} | {b:.3f} ± {bse:.3f} | {r:.3f} ± {rse:.3f} | {refs} | {_fmt_t(t)} |")
    return [*lines, ""]


def per_round_md(records: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> list[str]:
    rounds = sorted({int(r["round"]) for r in records if "picks" in r})
    head = " | ".join(f"{s} {f}" for f in fields for s in ("BAIT", "random"))
    lines = [
        "Per selection round (seed mean; labels before the pick):",
        "",
        f"| round | labels | {head} |",
        "|---|---|" + "---|" * (2 * len(fields)),
    ]
    for rnd in rounds:
        cells = []
        labels = next(int(r["labels"]) for r in records if r["round"] == rnd)
        for f in fields:
            for spec in (BAIT, RANDOM):
                v = [
                    r["picks"][f] for r in records if r["strategy"] == spec.name and r["round"] == rnd and "picks" in r
                ]
                cells.append(f"{np.mean(v):.3f}" if v else "—")
        lines.append(f"| {rnd} | {labels} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def bins_md(records: Sequence[Mapping[str, Any]], key: str, label: str, names: Sequence[str]) -> list[str]:
    """Per bin: BAIT and random at the last round and over rounds 1.. (seed means, paired t)."""
    last = max(int(r["round"]) for r in records)
    lines = [
        f"{label}: seed mean at the last round (labels {next(r['labels'] for r in records if r['round'] == last)}) "
        "and mean over rounds 1.. ; t = paired t of BAIT − random over seeds.",
        "",
        "| bin | BAIT (last) | random (last) | t (last) | BAIT (rounds 1..) | random (rounds 1..) | t (rounds 1..) |",
        "|---|---|---|---|---|---|---|",
    ]

    def per(strategy: str, name: str, rounds: Sequence[int]) -> dict[int, float]:
        got: dict[int, list[float]] = {}
        for r in records:
            if r["strategy"] == strategy and r["round"] in rounds and not math.isnan(r[key][name]):
                got.setdefault(int(r["seed"]), []).append(float(r[key][name]))
        return {s: float(np.mean(v)) for s, v in got.items()}

    for name in names:
        cells = []
        for rounds in ([last], list(range(1, last + 1))):
            pb, pr = per(BAIT.name, name, rounds), per(RANDOM.name, name, rounds)
            if not set(pb) & set(pr):
                cells += ["—", "—", "—"]
                continue
            b, _, r, _, t = paired(pb, pr)
            cells += [f"{b:.3f}", f"{r:.3f}", _fmt_t(t)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def overlap_md(store: ResultStore, setting: Setting, seeds: Sequence[int]) -> list[str]:
    """Jaccard overlap of BAIT's and random's final labeled sets (same initial labels)."""
    jac = []
    for seed in seeds:
        sets = []
        for spec in SPECS:
            base = (setting.experiment, setting.config, spec.name, int(seed))
            rows = set(initial_labels(setting.split.X_pool.shape[0], setting.m0, seed).tolist())
            for p in store.picks(base).values():
                rows |= set(p)
            sets.append(rows)
        jac.append(len(sets[0] & sets[1]) / len(sets[0] | sets[1]))
    n_final = setting.m0 + setting.rounds * setting.batch
    return [
        f"Pool {setting.split.X_pool.shape[0]} rows, test {setting.split.X_test.shape[0]} rows; the last budget "
        f"labels {n_final} rows ({n_final / setting.split.X_pool.shape[0] * 100:.0f} % of the pool). Overlap "
        f"(Jaccard) of BAIT's and random's final labeled sets: {np.mean(jac):.2f} (min {min(jac):.2f}, "
        f"max {max(jac):.2f}) over seeds, initial {setting.m0} included."
        + (
            f" One test row is {1 / setting.split.X_test.shape[0]:.3f} of accuracy."
            if setting.split.task == "classification"
            else ""
        ),
        "",
    ]


def ablation_md(records: Sequence[Mapping[str, Any]], regression: bool) -> list[str]:
    """The outlier ablation (:func:`ablation`): per variant the seed-mean test metric, the labels removed,
    and the paired t against random's final set as run."""
    if not records:
        return []
    cols = ["value"] + (["<5", "mid90", ">95"] if regression else [])

    def get(r: Mapping[str, Any], c: str) -> float:
        return float(r["value"]) if c == "value" else float(r["rmse_bin"][c])

    ref = {int(r["seed"]): r for r in records if r["strategy"] == RANDOM.name and r["variant"] == "all"}
    head = " | ".join(f"{'test metric' if c == 'value' else 'RMSE ' + c} (t vs random as run)" for c in cols)
    lines = [
        "Ablation: the last round's head retrained (same seed) on the final labeled set without the picked rows "
        "that have an input coordinate > 3 pool s.d. out (`no_outliers`); `control` removes as many of BAIT's "
        "other picks at random. Seed means; t = paired t against random's final set as run.",
        "",
        f"| strategy | variant | labels removed (mean) | {head} |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for spec in SPECS:
        for variant in ("all", "no_outliers", "control"):
            mine = {int(r["seed"]): r for r in records if r["strategy"] == spec.name and r["variant"] == variant}
            if not mine:
                continue
            seeds = sorted(set(mine) & set(ref))
            cells = []
            for c in cols:
                a = np.array([get(mine[s], c) for s in seeds])
                b = np.array([get(ref[s], c) for s in seeds])
                if np.isnan(a).any() or np.isnan(b).any():
                    cells.append("—")
                    continue
                t = "" if spec.name == RANDOM.name and variant == "all" else f" ({_fmt_t(paired_t(a, b))})"
                cells.append(f"{a.mean():.3f}{t}")
            dropped = np.mean([mine[s]["dropped"] for s in seeds])
            lines.append(f"| {spec.name} | {variant} | {dropped:.1f} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def outlier_dims_md(records: Sequence[Mapping[str, Any]], names: Sequence[str], top: int = 6) -> list[str]:
    """Per input coordinate: fraction of picks more than 3 pool s.d. out (BAIT, random, pool), the
    ``top`` coordinates by BAIT's fraction."""
    picks = {s.name: [r["picks"] for r in records if r["strategy"] == s.name and "picks" in r] for s in SPECS}
    if not picks[BAIT.name]:
        return []
    frac = {k: np.mean([p["outlier_dims"] for p in v], axis=0) for k, v in picks.items()}
    pool = np.mean([p["pool_outlier_dims"] for p in picks[BAIT.name]], axis=0)
    order = np.argsort(-frac[BAIT.name])[:top]
    lines = [
        "Which input coordinates the outlying picks are out on (fraction of picks with |z| > 3 on that "
        f"coordinate; the {len(order)} highest for BAIT):",
        "",
        "| input | BAIT | random | pool |",
        "|---|---|---|---|",
    ]
    for j in order:
        name = names[j] if j < len(names) else f"x{j}"
        lines.append(f"| {name} | {frac[BAIT.name][j]:.3f} | {frac[RANDOM.name][j]:.3f} | {pool[j]:.3f} |")
    return [*lines, ""]


def influence_md(
    records: Sequence[Mapping[str, Any]],
    setting: Setting,
    names: Sequence[str],
    random_final: Mapping[int, float],
    top: int = 8,
) -> list[str]:
    """The rows whose removal changes BAIT's final test metric most (:func:`influence`), mean over the
    seeds whose final set holds them."""
    if not records:
        return []
    split = setting.split
    z = (split.X_pool - split.X_pool.mean(axis=0)) / (split.X_pool.std(axis=0) + 1e-12)
    by: dict[int, list[Mapping[str, Any]]] = {}
    for r in records:
        by.setdefault(int(r["row"]), []).append(r)
    regression = split.task == "regression"
    sign = 1.0 if regression else -1.0  # rank by how much the removal helps
    order = sorted(by, key=lambda i: sign * float(np.mean([r["delta"] for r in by[i]])))[:top]
    n_seeds = len({int(r["seed"]) for r in records})
    lines = [
        f"Leave-one-out over BAIT's picked input outliers ({len(by)} distinct rows in {n_seeds} seeds' final "
        "sets): the last round's head retrained without that row alone; Δ = test metric without it − with it, "
        f"mean over the seeds whose final set holds it (the {len(order)} rows whose removal helps most).",
        "",
        "| pool row | in BAIT's final set (seeds) | picked in round (median) | inputs > 3 s.d. (z) | "
        "target pool percentile | Δ test metric |" + (" Δ RMSE <5 | Δ RMSE mid90 |" if regression else ""),
        "|---|---|---|---|---|---|" + ("---|---|" if regression else ""),
    ]
    for i in order:
        dims = ", ".join(
            f"{names[j] if j < len(names) else f'x{j}'} {z[i, j]:+.1f}"
            for j in np.flatnonzero(np.abs(z[i]) > 3.0).tolist()
        )
        if regression:
            ypct = f"{np.mean(split.y_pool[:, 0] < split.y_pool[i, 0]) * 100:.0f}"
        else:
            ypct = f"class {int(split.y_pool[i])}"
        cells = [f"{np.mean([r['delta'] for r in by[i]]):+.4f}"]
        if regression:
            cells += [f"{np.mean([r['delta_bin'][k] for r in by[i]]):+.4f}" for k in ("<5", "mid90")]
        rnd = float(np.median([r["round"] for r in by[i]]))
        lines.append(f"| {i} | {len(by[i])} | {rnd:g} | {dims} | {ypct} | " + " | ".join(cells) + " |")
    best = order[0]
    seeds = sorted(int(r["seed"]) for r in by[best] if int(r["seed"]) in random_final)
    if len(seeds) >= 2:
        a = np.array([next(float(r["value"]) for r in by[best] if int(r["seed"]) == sd) for sd in seeds])
        b = np.array([random_final[sd] for sd in seeds])
        lines += [
            "",
            f"Without row {best} alone, BAIT's last-round test metric is {a.mean():.3f} against random's "
            f"{b.mean():.3f} (paired t {_fmt_t(paired_t(a, b))} over the {len(seeds)} seeds whose final set "
            "holds the row).",
        ]
    return [*lines, ""]


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def reproduces_heldout(rows: Sequence[Mapping[str, Any]], out: Path, heldout_csv: Path) -> str:
    """Whether the shared seeds' rows equal the held-out experiment's (``heldout/heldout/results.csv``)."""
    if not heldout_csv.is_file():
        return "the held-out experiment's results.csv was not found, so not compared"
    theirs = {
        (r["config"], r["strategy"], int(r["seed"]), int(r["round"])): float(r["value"])
        for r in read_results(heldout_csv)
    }
    gaps = []
    for r in rows:
        k = (r["config"], r["strategy"], int(r["seed"]), int(r["round"]))
        if k in theirs:
            gaps.append(abs(theirs[k] - float(r["value"])))
    if not gaps:
        return "no rows in common with the held-out experiment's results.csv"
    mine_picks, their_picks = _picks_by_key(out / "picks.jsonl"), _picks_by_key(heldout_csv.parent / "picks.jsonl")
    shared = [k for k in mine_picks if k in their_picks]
    same_picks = sum(sorted(mine_picks[k]) == sorted(their_picks[k]) for k in shared)
    return (
        f"of the {len(gaps)} (dataset, strategy, seed, round) rows shared with `heldout/heldout/results.csv`, "
        f"{sum(g == 0.0 for g in gaps)} have the identical test metric and all differ by at most {max(gaps):.1e} "
        f"(float rounding: a different torch thread count); the picked rows are identical in {same_picks} of "
        f"{len(shared)} shared rounds"
    )


def _picks_by_key(path: Path) -> dict[tuple[str, str, int, int], list[int]]:
    """(config, strategy, seed, round) -> picked rows of a ``picks.jsonl``."""
    return {(r["config"], r["strategy"], int(r["seed"]), int(r["round"])): r["picked"] for r in _load_jsonl(path)}


def budget_md(rows: Sequence[Mapping[str, Any]], ds: str, n_seeds: int) -> list[str]:
    """The per-budget table of :func:`budget_table`."""
    lines = [
        f"BAIT vs random per budget over {n_seeds} seeds (diff = BAIT − random; sd = s.d. of the per-seed "
        "differences; seeds needed = paired 5 % test with 80 % power for this difference, normal "
        "approximation; seeds 0-2 = the held-out check's 3 seeds: their mean difference, their paired t, and "
        "the seeds needed to detect a true difference of that size at this spread):",
        "",
        "| labels | BAIT | random | diff | sd | t | 5 % crit | verdict | seeds needed | seeds 0-2: diff | "
        "seeds 0-2: t | seeds to detect the seeds-0-2 diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in budget_table(rows, ds):
        lines.append(
            f"| {b['labels']} | {b['bait']:.3f} | {b['random']:.3f} | {b['diff']:+.3f} | {b['sd_diff']:.3f} | "
            f"{_fmt_t(b['t'])} | {b['crit']:.2f} | {b['verdict']} | {_fmt_need(b['seeds_needed'])} | "
            f"{b['first3_diff']:+.3f} | {_fmt_t(b['first3_t'])} | {_fmt_need(b['seeds_for_first3'])} |"
        )
    return lines


def report_md(
    out: Path,
    settings: Sequence[Setting],
    seeds: Sequence[int],
    runs: Sequence[Mapping[str, Any]],
    clean: Sequence[Setting] = (),
) -> str:
    store = ResultStore(out)
    want = set(seeds)
    names = {spec.name for spec in SPECS}
    rows = [r for r in store.rows() if int(r["seed"]) in want and r["strategy"] in names]
    records = [r for r in _load_jsonl(out / "diagnostics.jsonl") if int(r["seed"]) in want]
    abl = [r for r in _load_jsonl(out / "ablation.jsonl") if int(r["seed"]) in want]
    infl = [r for r in _load_jsonl(out / "influence.jsonl") if int(r["seed"]) in want]
    n_seeds = len(seeds)
    s0 = settings[0]
    lines = [
        "# Why BAIT loses to random on diamonds and sonar (held-out check, issue 14)",
        "",
        "`bench/experiments/heldout_why.py` (its docstring defines every number) re-runs the held-out setting "
        "(`heldout.make_setting`, `heldout.load_split`, `common.run_grid`: MLP head, lam = 0.01, forward-backward "
        f"with `oversample=2`, {s0.m0} → {s0.m0 + s0.rounds * s0.batch} labels in batches of {s0.batch}) for BAIT "
        f"and random with {n_seeds} seeds, then "
        "replays every round to measure what BAIT picked.",
        "",
        f"Reproduction: {reproduces_heldout(rows, out, RESULTS_ROOT / 'heldout' / 'heldout' / 'results.csv')}; "
        f"replayed heads give the stored test metric in {sum(r['replay_matches'] for r in records)} of "
        f"{len(records)} rounds.",
        "",
    ]
    for s in settings:
        ds = s.config
        recs = [r for r in records if r["dataset"] == ds]
        metric = s.split.metric
        sense = "lower is better" if lower_is_better(metric) else "higher is better"
        lines += [f"## {ds} ({s.split.task}, {metric}: {sense})", "", *overlap_md(store, s, seeds)]
        lines += budget_md(rows, ds, n_seeds)
        lines += ["", *pick_table_md(recs, n_seeds)]
        lines += outlier_dims_md(recs, FEATURE_NAMES.get(ds, ()))
        lines += ablation_md([r for r in abl if r["dataset"] == ds], s.split.task == "regression")
        last = max(int(r["round"]) for r in rows if r["config"] == ds)
        rand_final = {
            int(r["seed"]): float(r["value"])
            for r in rows
            if r["config"] == ds and r["strategy"] == RANDOM.name and int(r["round"]) == last
        }
        lines += influence_md([r for r in infl if r["dataset"] == ds], s, FEATURE_NAMES.get(ds, ()), rand_final)
        if s.split.task == "regression":
            lines += per_round_md(recs, ("tail_lo", "tail_hi", "lev_pct"))
            lines += bins_md(
                recs, "rmse_bin", "Test RMSE per target bin (pool quantiles, %)", [*BIN_NAMES, "mid90", "tails"]
            )
            lines += bins_md(
                recs,
                "cover_bin",
                "Coverage: mean distance of the bin's test rows to their nearest labeled row (raw inputs)",
                [*BIN_NAMES, "mid90", "tails"],
            )
        else:
            lines += per_round_md(recs, ("class1", "margin", "lev_pct"))
            lines += bins_md(
                recs, "acc_class", "Test accuracy per true class", [str(c) for c in range(s.split.n_outputs)]
            )
    for c in clean:
        if not any(r["config"] == c.config for r in rows):
            continue
        n_orig = next(s.split.X_pool.shape[0] for s in settings if c.config.startswith(f"{s.config}-"))
        what = (
            f"The {n_orig - c.split.X_pool.shape[0]} of {n_orig} pool rows with an input coordinate > 3 pool s.d. "
            "out removed (`--clean`)"
            if c.config.endswith("-no-outliers")
            else f"Only pool row(s) {c.config.split('-minus-')[1].replace('-', ', ')} removed (`--drop`)"
        )
        lines += [
            f"## {c.config}: a pool without some rows",
            "",
            f"{what}; both strategies re-run from scratch on the rest of the pool (so new initial labels); the "
            "test set is unchanged.",
            "",
            *budget_md(rows, c.config, n_seeds),
            "",
        ]
    lines += ["## What was run", "", "| command | started | wall time | load average (1/5/15 min) start → end |"]
    lines += ["|---|---|---|---|"]
    for r in runs:
        wall, la0, la1 = run_timing(r)
        lines.append(f"| `{r['command']}` | {r['started']} | {wall} | {la0} → {la1} |")
    if runs:
        lines += [
            "",
            f"Machine: {runs[-1]['machine']}; sizes {json.dumps(runs[-1]['size'])}; seeds {runs[-1]['seeds']}.",
        ]
    lines += [
        "",
        f"Files: `{out.name}/results.csv`, `picks.jsonl` (the runs), `diagnostics.jsonl` (one record per "
        "(dataset, strategy, seed, round)), `ablation.jsonl`, `influence.jsonl`, `runs.jsonl`, `curves.png`.",
        "",
    ]
    return "\n".join(lines)


def _load_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def write_report(report: Path, text: str) -> None:
    """Write ``text`` to ``report``, keeping an existing hand-written tail below :data:`MARKER`."""
    tail = ""
    if report.is_file():
        old = report.read_text()
        if MARKER in old:
            tail = old[old.index(MARKER) :]
    report.write_text(text + "\n" + (tail or MARKER + "\n"))


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="synthetic stand-ins at smoke size: < 60 s")
    p.add_argument("--out", type=Path, default=None, help="output folder (default docs/results/heldout/why)")
    p.add_argument(
        "--report", type=Path, default=None, help="report path (default <out>/../why.md, smoke <out>/why.md)"
    )
    p.add_argument("--datasets", default=None, help="comma-separated (default diamonds,sonar)")
    p.add_argument(
        "--seeds", default=None, help=f"'10' (= 0-9), '0-19' or '0,3' (default {DEFAULT_SEEDS}; smoke {SMOKE_SEEDS})"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--report-only", action="store_true", help="only rewrite the report from the stored runs")
    p.add_argument(
        "--clean",
        default=None,
        help="datasets also run on the pool without its input outliers (default diamonds; smoke synthetic-regression;"
        " 'none' for none)",
    )
    p.add_argument(
        "--drop",
        default=None,
        help="DATASET:ROW,...: also run on the pool without these rows (pool row numbers of load_split; default "
        "diamonds:225, the zero-dimension record; smoke synthetic-regression:0; 'none' for none)",
    )
    return p


def _run_all(
    out: Path, settings: Sequence[Setting], clean: Sequence[Setting], seeds: Sequence[int], quiet: bool
) -> None:
    """The runs, then each stored round's diagnostics, the outlier ablation and the leave-one-out (each
    resumable: what is already in its file is not redone)."""
    store = ResultStore(out)
    run_grid([*settings, *clean], SPECS, seeds, store, desc="runs", quiet=quiet)
    plot_curves(store.rows(), out / "curves.png", title="held-out: why BAIT loses (BAIT lam=0.01 vs random)")
    # Each analysis appends its records per (dataset, [strategy,] seed) and skips the keys already in its file.
    _append_missing(
        out / "diagnostics.jsonl",
        ("dataset", "strategy", "seed"),
        {(s.config, spec.name, seed): functools.partial(replay, s, spec.name, seed, store)
         for s in settings for seed in seeds for spec in SPECS},
    )  # fmt: skip
    for name, analysis in (("ablation", ablation), ("influence", influence)):
        _append_missing(
            out / f"{name}.jsonl",
            ("dataset", "seed"),
            {(s.config, seed): functools.partial(analysis, s, seed, store) for s in settings for seed in seeds},
        )


def _append_missing(path: Path, key: Sequence[str], todo: Mapping[tuple[Any, ...], Callable[[], Any]]) -> None:
    """Run each job of ``todo`` whose key (the values of ``key`` in its records) is not yet in ``path``, in
    order, appending its records (an iterable of dicts) as JSON lines as soon as it returns."""
    have = {tuple(r[k] for k in key) for r in _load_jsonl(path)}
    for k, job in todo.items():
        if k not in have:
            recs = list(job())
            with path.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in recs)


def main(argv: Sequence[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    size = {k: v for k, v in (SMOKE if args.smoke else FULL).items() if k != "seeds"}
    seeds = parse_seeds(args.seeds or (SMOKE_SEEDS if args.smoke else DEFAULT_SEEDS))
    lr = LR["smoke" if args.smoke else "full"]
    datasets = [d for d in (args.datasets or ",".join(SMOKE_DATASETS if args.smoke else DATASETS)).split(",") if d]
    out: Path = args.out or RESULTS_ROOT / "heldout" / "why"
    report: Path = args.report or (out / "why.md" if args.smoke or args.out else out.parent / "why.md")
    out.mkdir(parents=True, exist_ok=True)
    argv_list = list(argv) if argv is not None else sys.argv[1:]
    settings = [make_setting("why", d, size, lr) for d in datasets]
    clean_names = (args.clean or ("synthetic-regression" if args.smoke else "diamonds")).split(",")
    clean = [cleaned(s) for s in settings if s.config in clean_names]
    drops: dict[str, list[int]] = {}
    for item in (args.drop or ("synthetic-regression:0" if args.smoke else "diamonds:225")).split(","):
        if ":" in item:
            ds, row = item.split(":")
            drops.setdefault(ds, []).append(int(row))
    clean += [without_rows(s, drops[s.config]) for s in settings if s.config in drops]
    if args.report_only:
        write_report(report, report_md(out, settings, seeds, _load_jsonl(out / "runs.jsonl"), clean))
        return report
    extra = {"datasets": datasets, "size": size, "seeds": seeds, "lr": lr, "clean": [c.config for c in clean]}
    with recorded_run(out, "bench.experiments.heldout_why", argv_list, **extra):
        _run_all(out, settings, clean, seeds, args.quiet)
    write_report(report, report_md(out, settings, seeds, _load_jsonl(out / "runs.jsonl"), clean))
    return report


if __name__ == "__main__":
    main()

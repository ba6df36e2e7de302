"""``auto`` against the fixed strategies on the held-out half, and where the stopping rule stops (issue 28).

The loop is the shared harness (:mod:`bench.experiments.common`, :func:`~bench.experiments.common.run_grid`)
on the held-out protocol's settings (:mod:`bench.experiments.heldout`: seeded subsamples of the suite's
cached splits, ``m0`` random initial labels shared by every strategy of a seed, ``rounds`` batches of
``batch``, the MLP head retrained from scratch every round and scored on the test set: accuracy, or RMSE in
units of the target's standard deviation). Two things are added per setting, through a
:class:`~bench.experiments.common.RunHook`:

* a **validation split**: ``min(val, pool // 5)`` rows drawn once (seeded, the same for every run) out of
  the loaded pool and removed from it (as a service user moves labeled items to the validation split; their
  labels are not counted in the curves). Every round's head is scored on it: accuracy, or R² for
  regression (``1 - MSE / variance`` of the validation targets);
* a **stop set**: ``min(stop, pool)`` rows of the remaining pool drawn once (seeded), fixed for the whole
  run (a row labeled later stays in it, as in the service). Every round's head predicts it (classes, or
  targets for regression).

Both go to ``rounds.jsonl`` (one record per round of every run, keyed like ``results.csv``) with, for
``auto``, the round's history entry ``diagnostics["auto"]["round"]``.

Strategies: ``bait``, ``badge``, ``margin``, ``random`` (fixed; ``bait`` and ``random`` on regression, the
arms ``auto`` has there), each with the library's default parameters, and ``auto``
(``selection.select(..., strategy="auto", history=...)`` with its default ``explore`` and ``gamma``). The
loop keeps ``auto``'s history the way ``docs/auto-and-stopping.md`` says a library caller does: after each
round it takes ``diagnostics["auto"]["round"]``, fills in ``labels`` (the picks' true labels, which the
harness reveals before the next round) and sets ``validation`` (the validation score of the head that
selected the round) and ``n_labels`` (the labels that head was trained on); the next round passes every
earlier entry as ``history``. So ``auto`` runs in its validation-gain mode from its second round on. ``auto``
runs with its default, ``exclude_outliers`` off, as the fixed strategies do; the variant
``auto-exclude-outliers`` turns the check on and passes the pool's own inputs as ``outlier_embeddings`` (as the
service's outlier check reads the pool's embeddings, not the head's features), so ``auto`` leaves the candidates
the robust outlier rule flags there out of the pool before its arm selects.
``auto`` is cold by the library's rule (only without ``probs``), so with ``m0`` initial labels it plays model
arms from the first round, as the fixed strategies do.

Report (``--phase report``, ``summary.md`` and ``report.json``):

* per dataset and strategy: final test metric (mean ± s.e. over seeds), **normalised area** over random
  (:func:`bench.experiments.heldout.normalised_area`: relative gain of the mean over rounds 1.. of the
  seed-mean test curve, higher is better for every metric) and **labels-to-random's-final** (fraction of
  random's final label count at which the seed-mean curve first reaches random's final value, interpolated;
  > 1 when not reached);
* per dataset: ``auto`` against the **best fixed strategy** (highest normalised area of the four, random
  included) and against random: difference of the per-seed areas and the paired t over seeds, *worse* /
  *better* when ``|t|`` exceeds the two-sided 5 % critical value — is ``auto`` significantly below it?
* per dataset: the **arm shares** ``auto`` chose (share of its rounds that drew each arm, and share of its
  picks per arm, exploration picks counted as ``random``);
* **stopping**: per run (every strategy and seed), the first round at which
  :func:`selection.stopping.stop_recommendation` (default thresholds: kappa, or R² of consecutive
  predictions, >= 0.99 for 3 rounds, and a flat validation curve) recommends stopping, computed on the run's
  stop-set predictions and validation curve up to that round; its labels against ``L98`` and ``L95``, the
  first budgets at which the seed-mean *validation* curve of that dataset and strategy reaches 98 % and 95 %
  of its final value. A run is ``early`` when it stops before ``L95``, ``ok`` when ``L95 <= stop <= 1.25
  L98`` (issue 28's target), ``late`` when it stops after ``1.25 L98`` or never stops although ``1.25 L98``
  is within the budget, ``censored`` when it never stops and ``1.25 L98`` lies beyond the last budget.

Datasets: the suite's held-out half (``python -m bench.suite list``), which holds both text tasks: the
binary ``fine-foods`` and the four-class ``austen-four`` (sentences of four Jane Austen novels embedded with
the service's ``text-minilm`` encoder, from Debian's ``r-cran-janeaustenr``). Nothing is downloaded here:
a dataset that is not in the suite's cache stops the run before it starts, with the fetch command.

    python -m bench.suite fetch fine-foods sonar ionosphere austen-four fashion-mnist dna shuttle letter \\
        diamonds boston                                       # once, where the network is reachable
    python -m bench.experiments.auto_heldout                  # run (resumable) + report, 10 seeds
    python -m bench.experiments.auto_heldout --phase report   # the report from the stored rows only
    python -m bench.experiments.auto_heldout --smoke --out /tmp/auto   # < 60 s, synthetic, no fetch
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import math
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.experiments import heldout
from bench.experiments.common import (
    RESULTS_ROOT,
    ResultStore,
    RoundState,
    Setting,
    Split,
    StrategySpec,
    curves,
    parse_seeds,
    plot_curves,
    read_results,
    recorded_run,
    run_grid,
    run_timing,
)
from bench.experiments.penalty_matrix import t_threshold
from selection import SelectionResult
from selection.heads import HeadConfig, evaluate, predict
from selection.stopping import stop_recommendation

EXPERIMENT = "auto"
MODULE = "bench.experiments.auto_heldout"
AUTO = "auto"
CLASSIFICATION_FIXED = ("bait", "badge", "margin", "random")
REGRESSION_FIXED = ("bait", "random")
#: Issue 28's stopping target: stop at most this many times the labels where the seed-mean validation curve
#: reaches 98 % of its final value, and never before it reaches 95 %.
STOP_LATE = 1.25
STOP_FRACTIONS = (0.98, 0.95)

FULL = {
    "pool": 1000,
    "test": 500,
    "val": 200,
    "stop": 500,
    "m0": 20,
    "batch": 10,
    "rounds": 10,
    "max_epochs": 100,
    "hidden": 128,
    "seeds": 10,
}
SMOKE = {
    "pool": 80,
    "test": 60,
    "val": 20,
    "stop": 40,
    "m0": 10,
    "batch": 5,
    "rounds": 3,
    "max_epochs": 15,
    "hidden": 16,
    "seeds": 2,
}
LR = {"full": 1e-3, "smoke": 1e-2}
SMOKE_DATASETS = ("synthetic-multiclass",)


def heldout_datasets(half: str = "heldout") -> list[str]:
    """The suite's held-out half (or its ``tune`` half), in registry order."""
    from bench.suite.registry import REGISTRY

    return [name for name, spec in REGISTRY.items() if spec.half == half]


def is_auto(name: str) -> bool:
    """Whether a strategy name of this experiment is ``auto`` or one of its variants (:func:`auto_spec`)."""
    return name == AUTO or name.startswith(AUTO + "-")


def auto_spec(name: str, task: str) -> StrategySpec:
    """``auto`` (library defaults) or a variant: ``auto-uniform`` (uniform prior: ``prior_bait = 1 / K``, gamma
    0.2, the bandit before the prior was chosen), ``auto-exclude-outliers`` (the defaults with the outlier check
    on), ``auto-keep-outliers`` (the check off, explicitly: the default since the check was measured),
    ``auto-ev0.1`` (the defaults before ``explore_validated``: 0.1 of each batch uniform throughout) or
    ``auto-p<prior_bait>-g<gamma>`` or ``auto-ev<share>`` (``explore_validated``: the uniform share once the
    evidence is validation gains). The variants measured before ``explore_validated`` existed (uniform, the
    ``p``/``g`` ones, the outlier ones) keep ``explore``'s share throughout, as they were run."""
    if name == AUTO:
        return StrategySpec(AUTO, "auto")
    # The variants measured before explore_validated existed keep explore's share throughout (None), as then.
    if name == AUTO + "-exclude-outliers":
        return StrategySpec(name, "auto", params={"exclude_outliers": True, "explore_validated": None})
    if name == AUTO + "-keep-outliers":
        return StrategySpec(name, "auto", params={"exclude_outliers": False, "explore_validated": None})
    if name.startswith(AUTO + "-ev"):  # auto-ev<share>: explore_validated
        try:
            return StrategySpec(name, "auto", params={"explore_validated": float(name[len(AUTO) + 3 :])})
        except ValueError:
            pass
    k = len(CLASSIFICATION_FIXED if task == "classification" else REGRESSION_FIXED)
    if name == AUTO + "-uniform":
        return StrategySpec(name, "auto", params={"prior_bait": 1.0 / k, "gamma": 0.2, "explore_validated": None})
    parts = name.split("-")
    try:
        if len(parts) != 3 or not parts[1].startswith("p") or not parts[2].startswith("g"):
            raise ValueError
        prior, gamma = float(parts[1][1:]), float(parts[2][1:])
        return StrategySpec(name, "auto", params={"prior_bait": prior, "gamma": gamma, "explore_validated": None})
    except ValueError:
        raise SystemExit(
            f"unknown auto variant {name!r}: use auto, auto-uniform, auto-exclude-outliers, auto-keep-outliers, "
            "auto-ev<share> or auto-p<prior>-g<gamma>"
        ) from None


def specs(task: str, names: Sequence[str] | None = None) -> list[StrategySpec]:
    """The fixed strategies of ``task`` (library defaults) and ``auto``; ``names`` keeps those named (fixed
    strategies the task does not have are left out) and adds the ``auto`` variants named."""
    fixed = CLASSIFICATION_FIXED if task == "classification" else REGRESSION_FIXED
    if names is None:
        return [*(StrategySpec(name, name) for name in fixed), StrategySpec(AUTO, "auto")]
    return [StrategySpec(n, n) if n in fixed else auto_spec(n, task) for n in names if n in fixed or is_auto(n)]


# --------------------------------------------------------------------------------------------------
# Settings: the held-out split with a validation split and a stop set
# --------------------------------------------------------------------------------------------------


def make_setting(
    dataset: str, size: Mapping[str, int], lr: float
) -> tuple[Setting, np.ndarray, np.ndarray, np.ndarray]:
    """(setting, validation inputs, validation targets, stop-set rows of the setting's pool) of ``dataset``.

    The validation rows leave the pool; ``rounds`` is capped so that the labels fit in what is left.
    """
    base = heldout.load_split(dataset, size["pool"], size["test"])
    n = base.X_pool.shape[0]
    rng = np.random.default_rng([0xA070, n])
    n_val = min(size["val"], n // 5)
    if n_val < 2:
        raise SystemExit(f"{dataset}: a pool of {n} rows leaves no validation split")
    val = np.zeros(n, dtype=bool)
    val[rng.choice(n, size=n_val, replace=False)] = True
    split = Split(base.X_pool[~val], base.y_pool[~val], base.X_test, base.y_test, base.task, base.n_outputs)
    n_pool = split.X_pool.shape[0]
    rounds = min(size["rounds"], (n_pool - size["m0"]) // size["batch"])
    if rounds < 1:
        raise SystemExit(f"{dataset}: {n_pool} pool rows leave no room for a round of {size['batch']}")
    stop_rows = np.sort(rng.choice(n_pool, size=min(size["stop"], n_pool), replace=False)).astype(np.int64)
    head = HeadConfig(
        input_dim=split.X_pool.shape[1],
        n_outputs=split.n_outputs,
        kind="mlp",
        task=split.task,  # type: ignore[arg-type]
        hidden=size["hidden"],
        lr=lr,
        max_epochs=size["max_epochs"],
    )
    setting = Setting(EXPERIMENT, dataset, split, head, m0=size["m0"], batch=size["batch"], rounds=rounds)
    return setting, base.X_pool[val], base.y_pool[val], stop_rows


# --------------------------------------------------------------------------------------------------
# The per-round records (rounds.jsonl) and the hook that writes them and keeps auto's history
# --------------------------------------------------------------------------------------------------

RunKey = tuple[str, str, int]  # (config, strategy, seed)


def encode(a: np.ndarray) -> dict[str, Any]:
    """A small array as JSON: dtype, shape and base64 bytes."""
    a = np.ascontiguousarray(a)
    return {"dtype": str(a.dtype), "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode()}


def decode(rec: Mapping[str, Any]) -> np.ndarray:
    """The inverse of :func:`encode`."""
    return np.frombuffer(base64.b64decode(rec["b64"]), dtype=rec["dtype"]).reshape(rec["shape"])


class RoundLog:
    """``rounds.jsonl``: per round of every run the validation score, the stop-set predictions and, for
    ``auto``, the round's history entry (labels still null; the hook fills them from the pool when it builds
    the history). A round recomputed after an interruption replaces its record. A committed results folder
    keeps it gzipped (``rounds.jsonl.gz``); a run appends to a plain ``rounds.jsonl`` beside it. Both are read,
    the gzipped one first, so a run added to a committed folder (a new variant) sees the committed rounds too."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.records: dict[tuple[str, str, int, int], dict[str, Any]] = {}
        packed = self.path.with_name(self.path.name + ".gz")
        texts = []
        if packed.is_file():
            texts.append(gzip.decompress(packed.read_bytes()).decode())
        if self.path.is_file():
            texts.append(self.path.read_text())
        for text in texts:
            for line in text.splitlines():
                if line.strip():
                    rec = json.loads(line)
                    self.records[(rec["config"], rec["strategy"], int(rec["seed"]), int(rec["round"]))] = rec

    def add(self, rec: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        self.records[(rec["config"], rec["strategy"], int(rec["seed"]), int(rec["round"]))] = rec

    def run(self, key: RunKey) -> list[dict[str, Any]]:
        """The records of run ``key``, by round."""
        return [r for k, r in sorted(self.records.items()) if k[:3] == key]


def r2(y: np.ndarray, mse: float) -> float:
    """``1 - MSE / variance`` of targets ``y`` (``n x m``; the variance averaged over outputs)."""
    var = float(np.mean(np.var(np.asarray(y, dtype=np.float64).reshape(len(y), -1), axis=0)))
    return 1.0 - mse / var if var > 0 else 0.0


class AutoHook:
    """Scores the validation split, predicts the stop set and keeps ``auto``'s history, for one setting."""

    def __init__(
        self, setting: Setting, X_val: np.ndarray, y_val: np.ndarray, stop_rows: np.ndarray, log: RoundLog
    ) -> None:
        self.setting = setting
        self.X_val, self.y_val = X_val, y_val
        self.stop_X = torch.from_numpy(setting.split.X_pool[stop_rows])
        self.log = log

    def _label(self, row: int) -> Any:
        y = self.setting.split.y_pool[row]
        return int(y) if self.setting.split.task == "classification" else [float(v) for v in np.atleast_1d(y)]

    def select_params(self, state: RoundState) -> Mapping[str, Any]:
        if state.spec.strategy != "auto":
            return {}
        history = []
        for t in range(state.rnd):
            rec = self.log.records.get((self.setting.config, state.spec.name, state.seed, t))
            if rec is None or rec.get("auto") is None:
                raise RuntimeError(
                    f"{self.setting.config}/{state.spec.name} seed {state.seed}: auto's round {t} is missing from "
                    f"{self.log.path}; delete that run's rows from results.csv to rerun it"
                )
            entry = dict(rec["auto"])
            entry["labels"] = [self._label(int(i)) for i in entry["picks"]]  # the labels came back
            entry["validation"] = rec["validation"]  # the score of the head that selected the round
            entry["n_labels"] = rec["labels"]  # the labels that head was trained on
            history.append(entry)
        if state.spec.params.get("exclude_outliers", False) is not True:
            return {"history": history}
        # the outlier rule reads the pool's own inputs, as the service's check does (not the head's features)
        return {"history": history, "outlier_embeddings": self.setting.split.X_pool}

    def after_round(self, state: RoundState, result: SelectionResult | None) -> None:
        split = self.setting.split
        scores = evaluate(state.trained, self.X_val, self.y_val)
        if split.task == "classification":
            validation = float(scores["accuracy"])
        else:
            validation = r2(self.y_val, float(scores["mse"]))
        out = predict(state.trained, self.stop_X)
        if out.probs is not None:
            preds = out.probs.argmax(dim=1).cpu().numpy().astype(np.int16)
        else:
            assert out.outputs is not None
            preds = out.outputs.cpu().numpy().astype(np.float32)
        diag = {} if result is None else result.diagnostics.get("auto") or {}
        self.log.add(
            {
                "config": self.setting.config,
                "strategy": state.spec.name,
                "seed": state.seed,
                "round": state.rnd,
                "labels": int(state.rows.shape[0]),
                "validation": validation,
                "stop_preds": encode(preds),
                "auto": diag.get("round"),
                "cold": diag.get("cold"),
            }
        )


# --------------------------------------------------------------------------------------------------
# Run
# --------------------------------------------------------------------------------------------------


def run(
    datasets: Sequence[str],
    size: Mapping[str, int],
    seeds: Sequence[int],
    out: Path,
    lr: float,
    quiet: bool,
    strategies: Sequence[str] | None = None,
) -> None:
    prepared = [make_setting(d, size, lr) for d in datasets]  # loads first: a missing dataset fails early
    store = ResultStore(out)
    log = RoundLog(out / "rounds.jsonl")
    for setting, X_val, y_val, stop_rows in prepared:
        hook = AutoHook(setting, X_val, y_val, stop_rows, log)
        run_grid(
            [setting],
            specs(setting.split.task, strategies),
            seeds,
            store,
            desc=setting.config,
            quiet=quiet,
            hooks={setting.config: hook},
        )
    plot_curves(store.rows(), out / "curves.png", title="auto against the fixed strategies (test metric)")


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def strategy_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per dataset and strategy: final, normalised area over random, labels-to-random's-final."""
    data = {k[1]: v for k, v in curves(rows).items()}
    metric = {str(r["config"]): str(r["metric"]) for r in rows}
    out: list[dict[str, Any]] = []
    for cfg in sorted(data):
        rand = data[cfg].get("random")
        if rand is None:
            continue
        target, last = float(rand.mean[-1]), float(rand.labels[-1])
        for name, c in sorted(data[cfg].items()):
            frac = heldout.labels_to_reach(c.labels, c.mean, target, metric[cfg]) / last
            out.append(
                {
                    "dataset": cfg,
                    "strategy": name,
                    "metric": metric[cfg],
                    "n_seeds": c.n_seeds,
                    "labels": int(c.labels[-1]),
                    "final": float(c.mean[-1]),
                    "final_se": float(c.se[-1]),
                    "area": heldout.area(c.mean),
                    "norm_area": heldout.normalised_area(heldout.area(c.mean), heldout.area(rand.mean), metric[cfg]),
                    "labels_to_random_final": _finite_or_none(frac),
                }
            )
    return out


def auto_comparisons(rows: Sequence[Mapping[str, Any]], table: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per dataset: auto's per-seed area against the best fixed strategy's and random's (paired t)."""
    seeds = heldout.per_seed(rows)
    m0 = {str(r["config"]): int(r["labels"]) for r in rows if int(r["round"]) == 0}
    out: list[dict[str, Any]] = []
    for cfg in sorted({str(r["dataset"]) for r in table}):
        mine = {str(r["strategy"]): r for r in table if r["dataset"] == cfg}
        fixed = [s for s in mine if not is_auto(s)]
        if not fixed or "random" not in mine:
            continue
        best = max(fixed, key=lambda s: float(mine[s]["norm_area"]))
        for variant in sorted(s for s in mine if is_auto(s)):
            rec: dict[str, Any] = {
                "dataset": cfg,
                "strategy": variant,
                "metric": mine[variant]["metric"],
                "best_fixed": best,
            }
            for role, other in (("best", best), ("random", "random")):
                diff, t, verdict, n = heldout.compare_areas(
                    seeds[cfg][variant], seeds[cfg][other], m0[cfg], mine[variant]["metric"]
                )
                rec[role] = {"diff": diff, "t": t, "verdict": verdict, "n_seeds": n}
            rec["t_critical"] = t_threshold(rec["best"]["n_seeds"]) if rec["best"]["n_seeds"] >= 2 else math.inf
            rec["any_above_random"] = any(float(mine[s]["norm_area"]) > 0 for s in fixed if s != "random")
            out.append(rec)
    return out


def arm_shares(log: RoundLog) -> list[dict[str, Any]]:
    """Per dataset: the share of auto's rounds that drew each arm, and of its picks per arm."""
    drawn: dict[tuple[str, str], dict[str, int]] = {}
    picked: dict[tuple[str, str], dict[str, int]] = {}
    cold: dict[tuple[str, str], int] = {}
    for (name, strategy, _, _), rec in log.records.items():
        if not is_auto(strategy) or rec.get("auto") is None:
            continue
        cfg = (name, strategy)
        a = rec["auto"]
        drawn.setdefault(cfg, {}).setdefault(a["arm"], 0)
        drawn[cfg][a["arm"]] += 1
        for arm in a["arms"]:
            picked.setdefault(cfg, {}).setdefault(arm, 0)
            picked[cfg][arm] += 1
        cold[cfg] = cold.get(cfg, 0) + int(bool(rec.get("cold")))
    out = []
    for cfg in sorted(drawn):
        n_rounds, n_picks = sum(drawn[cfg].values()), sum(picked[cfg].values())
        out.append(
            {
                "dataset": cfg[0],
                "strategy": cfg[1],
                "rounds": n_rounds,
                "cold_rounds": cold[cfg],
                "round_share": {a: c / n_rounds for a, c in sorted(drawn[cfg].items())},
                "pick_share": {a: c / n_picks for a, c in sorted(picked[cfg].items())},
            }
        )
    return out


def first_reaching(labels: Sequence[int], mean: Sequence[float], fraction: float) -> float | None:
    """The first budget at which a (higher-is-better) seed-mean curve reaches ``fraction`` of its final
    value; None when the final value is not positive (a fraction of it means nothing)."""
    final = float(mean[-1])
    if not final > 0:
        return None
    for lab, v in zip(labels, mean, strict=True):
        if v >= fraction * final:
            return float(lab)
    return float(labels[-1])


def run_tasks(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Per dataset (``results.csv``'s ``config``): ``classification`` when its test metric is accuracy, else
    ``regression``."""
    return {str(r["config"]): ("classification" if r["metric"] == "accuracy" else "regression") for r in rows}


def run_records(log: RoundLog) -> dict[RunKey, list[dict[str, Any]]]:
    """The round records of every run in ``log``, by run and then by round."""
    runs: dict[RunKey, list[dict[str, Any]]] = {}
    for (cfg, strategy, seed, _), rec in sorted(log.records.items()):
        runs.setdefault((cfg, strategy, seed), []).append(rec)
    return runs


def stop_marks(runs: Mapping[RunKey, Sequence[Mapping[str, Any]]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (dataset, strategy): ``L98`` and ``L95`` of the seed-mean validation curve (over the rounds every
    seed has), its last budget and final value."""
    groups: dict[tuple[str, str], list[Sequence[Mapping[str, Any]]]] = {}
    for (cfg, strategy, _), recs in runs.items():
        groups.setdefault((cfg, strategy), []).append(recs)
    marks: dict[tuple[str, str], dict[str, Any]] = {}
    for key, members in groups.items():
        n = min(len(m) for m in members)
        labels = [int(members[0][i]["labels"]) for i in range(n)]
        mean = [float(np.mean([m[i]["validation"] for m in members])) for i in range(n)]
        marks[key] = {
            "L98": first_reaching(labels, mean, STOP_FRACTIONS[0]),
            "L95": first_reaching(labels, mean, STOP_FRACTIONS[1]),
            "last": labels[-1],
            "final_validation": mean[-1],
        }
    return marks


def stop_metric(task: str) -> str:
    """The validation metric the rule reads: accuracy for classification, R² for regression."""
    return "accuracy" if task == "classification" else "r2"


def first_stop(recs: Sequence[Mapping[str, Any]], task: str, rule: Mapping[str, Any] | None = None) -> float | None:
    """The labels at the first round of a run (its records, by round) at which
    :func:`selection.stopping.stop_recommendation` recommends stopping, on the run's stop-set predictions and
    validation curve up to that round; ``rule``: its keyword options (default: the library's). None: never."""
    preds = [decode(r["stop_preds"]) for r in recs]
    curve = [(int(r["labels"]), float(r["validation"])) for r in recs]
    for i in range(len(recs)):
        rec = stop_recommendation(preds[: i + 1], curve[: i + 1], task=task, metric=stop_metric(task), **(rule or {}))
        if rec.recommended:
            return float(curve[i][0])
    return None


def stop_verdict(stop: float | None, mark: Mapping[str, Any]) -> str:
    """``early`` / ``ok`` / ``late`` / ``censored`` (``undefined`` without L98 / L95) of a run that stopped at
    ``stop`` labels (None: never), against its dataset and strategy's ``mark`` (:func:`stop_marks`)."""
    l98, l95 = mark["L98"], mark["L95"]
    if l98 is None or l95 is None:
        return "undefined"
    if stop is None:
        return "late" if STOP_LATE * l98 < mark["last"] else "censored"
    if stop < l95:
        return "early"
    if stop <= STOP_LATE * l98:
        return "ok"
    return "late"


def stop_record(key: RunKey, task: str, stop: float | None, mark: Mapping[str, Any]) -> dict[str, Any]:
    """One row of ``stop_runs``: the run, where it stopped, its marks, stop / L98 and the verdict."""
    cfg, strategy, seed = key
    l98 = mark["L98"]
    return {
        "dataset": cfg,
        "strategy": strategy,
        "seed": seed,
        "metric": stop_metric(task),
        "stop": stop,
        "L98": l98,
        "L95": mark["L95"],
        "last": mark["last"],
        "ratio_to_L98": None if stop is None or not l98 else stop / l98,
        "verdict": stop_verdict(stop, mark),
    }


def stop_runs(log: RoundLog, tasks: Mapping[str, str], rule: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per run: where the stopping rule (``rule``: :func:`~selection.stopping.stop_recommendation`'s keyword
    options, default the library's) first recommends stopping, against L98 / L95 of the seed-mean validation
    curve of its dataset and strategy."""
    runs = run_records(log)
    marks = stop_marks(runs)
    out = []
    for key, recs in runs.items():
        task = tasks.get(key[0], "classification")
        out.append(stop_record(key, task, first_stop(recs, task, rule), marks[(key[0], key[1])]))
    return out


def stop_summary(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per dataset and strategy (and ``all`` / ``all``): the verdict counts and the stop / L98 ratios."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in runs:
        groups.setdefault((str(r["dataset"]), str(r["strategy"])), []).append(r)
        groups.setdefault(("all", str(r["strategy"])), []).append(r)
        groups.setdefault(("all", "all"), []).append(r)
    out = []
    for (cfg, strategy), members in sorted(groups.items()):
        ratios = [float(r["ratio_to_L98"]) for r in members if r["ratio_to_L98"] is not None]
        counts = {v: sum(r["verdict"] == v for r in members) for v in ("ok", "early", "late", "censored", "undefined")}
        out.append(
            {
                "dataset": cfg,
                "strategy": strategy,
                "runs": len(members),
                "stopped": sum(r["stop"] is not None for r in members),
                **counts,
                "ratio_min": min(ratios) if ratios else None,
                "ratio_median": float(np.median(ratios)) if ratios else None,
                "ratio_max": max(ratios) if ratios else None,
            }
        )
    return out


def _pct(x: float) -> str:
    return f"{x * 100:+.2f} %"


def _num(x: float | None, fmt: str = ".2f", none: str = "—") -> str:
    return none if x is None else format(x, fmt)


def summary_md(report: Mapping[str, Any]) -> str:
    lines = [
        "# auto against the fixed strategies, and the stopping rule (issue 28)",
        "",
        "Generated by `python -m bench.experiments.auto_heldout --phase report` from `results.csv` and "
        "`rounds.jsonl`; the module's docstring defines every number.",
        "",
        "## Strategies per dataset",
        "",
        "| dataset | metric | strategy | seeds | final (± s.e.) | normalised area over random | "
        "labels-to-random's-final |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["strategies"]:
        frac = r["labels_to_random_final"]
        lines.append(
            f"| {r['dataset']} | {r['metric']} | {r['strategy']} | {r['n_seeds']} | {r['final']:.3f} ± "
            f"{r['final_se']:.3f} | {_pct(r['norm_area'])} | {'> 1 (not reached)' if frac is None else f'{frac:.2f}'} |"
        )
    lines += [
        "",
        "## auto against the best fixed strategy and random (per-seed areas, paired t)",
        "",
        "| dataset | auto variant | best fixed | auto − best (t) | verdict | auto − random (t) | verdict | "
        "t critical | a fixed strategy above random |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["auto_vs"]:
        b, rnd = c["best"], c["random"]
        lines.append(
            f"| {c['dataset']} | {c.get('strategy', AUTO)} | {c['best_fixed']} | {b['diff']:+.4f} ({b['t']:+.2f}) | "
            f"{b['verdict']} | "
            f"{rnd['diff']:+.4f} ({rnd['t']:+.2f}) | {rnd['verdict']} | {c['t_critical']:.2f} | "
            f"{'yes' if c['any_above_random'] else 'no'} |"
        )
    lines += [
        "",
        "## Arms auto chose",
        "",
        "| dataset | auto variant | rounds (cold) | share of rounds | share of picks |",
        "|---|---|---|---|---|",
    ]
    for a in report["arm_shares"]:
        rs = ", ".join(f"{k} {v:.0%}" for k, v in a["round_share"].items())
        ps = ", ".join(f"{k} {v:.0%}" for k, v in a["pick_share"].items())
        lines.append(
            f"| {a['dataset']} | {a.get('strategy', AUTO)} | {a['rounds']} ({a['cold_rounds']}) | {rs} | {ps} |"
        )
    lines += [
        "",
        "## Stopping rule",
        "",
        f"Per run, the labels at the first round the rule recommends stopping, against L98 / L95 (the first budget "
        f"at which the seed-mean validation curve of the dataset and strategy reaches 98 % / 95 % of its final "
        f"value). Target: L95 <= stop <= {STOP_LATE} L98 (`ok`).",
        "",
        "| dataset | strategy | runs | stopped | ok | early | late | censored | undefined | "
        "stop / L98 min / median / max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in report["stop_summary"]:
        lines.append(
            f"| {s['dataset']} | {s['strategy']} | {s['runs']} | {s['stopped']} | {s['ok']} | {s['early']} | "
            f"{s['late']} | {s['censored']} | {s['undefined']} | {_num(s['ratio_min'])} / {_num(s['ratio_median'])} / "
            f"{_num(s['ratio_max'])} |"
        )
    lines += ["", "Per run: `report.json` (`stop_runs`).", "", "## What was run", ""]
    lines += ["| command | started | wall time | load average at start → end |", "|---|---|---|---|"]
    for r in report["runs"]:
        wall, la0, la1 = run_timing(r)
        lines.append(f"| `{r['command']}` | {r['started']} | {wall} | {la0} → {la1} |")
    if report["runs"]:
        last = report["runs"][-1]
        lines += [
            "",
            f"Machine: {last['machine']}.",
            f"Sizes: {json.dumps(last.get('size', {}))}; seeds {last.get('seeds')}.",
        ]
    return "\n".join(lines) + "\n"


def report(out: Path) -> dict[str, Any]:
    """``summary.md`` and ``report.json`` from ``results.csv`` and ``rounds.jsonl`` in ``out``."""
    rows = read_results(out / "results.csv")
    log = RoundLog(out / "rounds.jsonl")
    tasks = run_tasks(rows)
    table = strategy_table(rows)
    runs = stop_runs(log, tasks)
    invocations = heldout._load_runs(out)
    rep = {
        "strategies": table,
        "auto_vs": auto_comparisons(rows, table),
        "arm_shares": arm_shares(log),
        "stop_runs": runs,
        "stop_summary": stop_summary(runs),
        "runs": [r for r in invocations if r.get("phase") == "run"],
    }
    (out / "report.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    (out / "summary.md").write_text(summary_md(rep))
    return rep


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", choices=("run", "report", "all"), default="all")
    p.add_argument("--smoke", action="store_true", help="one synthetic dataset, 2 seeds, 3 rounds, tiny sizes: < 60 s")
    p.add_argument("--out", type=Path, default=None, help=f"output folder (default {RESULTS_ROOT / EXPERIMENT})")
    p.add_argument("--datasets", default=None, help="comma-separated (default: the suite's held-out half)")
    p.add_argument(
        "--half",
        choices=("heldout", "tune"),
        default="heldout",
        help="the suite's half whose datasets run by default (tune: to choose auto's defaults)",
    )
    p.add_argument(
        "--strategies",
        default=None,
        help="comma-separated: fixed strategies and auto variants (auto, auto-uniform, auto-exclude-outliers, "
        "auto-keep-outliers, auto-p<prior>-g<gamma>); "
        "default: the fixed strategies and auto",
    )
    p.add_argument("--seeds", default=None, help="'10' (= 0-9), '0-9' or '0,3' (default 10; smoke 2)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--lr", type=float, default=None, help="Adam learning rate of the head (default 1e-3; smoke 1e-2)")
    for name in FULL:
        if name != "seeds":
            p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=None)
    return p


def main(argv: Sequence[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    preset = SMOKE if args.smoke else FULL
    size = {
        k: (getattr(args, k) if getattr(args, k, None) is not None else v) for k, v in preset.items() if k != "seeds"
    }
    seeds = parse_seeds(args.seeds or str(preset["seeds"]))
    lr = args.lr if args.lr is not None else LR["smoke" if args.smoke else "full"]
    default_out = Path(tempfile.gettempdir()) / "auto_heldout_smoke" if args.smoke else RESULTS_ROOT / EXPERIMENT
    out: Path = args.out or default_out
    out.mkdir(parents=True, exist_ok=True)
    datasets = (
        [d for d in args.datasets.split(",") if d]
        if args.datasets
        else list(SMOKE_DATASETS if args.smoke else heldout_datasets(args.half))
    )
    strategies = [x for x in args.strategies.split(",") if x] if args.strategies else None
    argv_list = list(argv) if argv is not None else sys.argv[1:]
    if args.phase in ("run", "all"):
        extra = {"phase": "run", "datasets": datasets, "size": size, "seeds": seeds, "lr": lr}
        with recorded_run(out, MODULE, argv_list, **extra):
            run(datasets, size, seeds, out, lr, args.quiet, strategies)
    if args.phase in ("report", "all"):
        report(out)
    return out


if __name__ == "__main__":
    main()

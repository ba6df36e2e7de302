"""Cold start: the first batch of a pool with no or very few labels, scored by an independent learner.

For each dataset, number of initial labels ``m0`` and budget ``B``, every strategy picks ``B`` rows
once; an independent learner (scikit-learn's ``LogisticRegression``, or ``Ridge`` for regression, on
the standardised features) is trained on the ``m0 + B`` labeled rows and scored on a held-out test
split (accuracy, RMSE). Strategies:

* ``random``; ``typiclust`` and ``kmeanspp`` on the embeddings themselves (no model, as the service
  runs them on a cold pool);
* ``bait`` and ``badge`` (classification), and ``bait`` (regression), as the service runs them
  without the cold-start rule: on the features and probabilities of the pool's MLP head trained on the
  ``m0`` labels (its random initialisation when ``m0 = 0``).

Initial labels: ``0`` none, ``Npc`` N per class (stratified, drawn from the seed), ``N`` (regression) N
random rows. Each (config, strategy, seed) is one row of ``results.csv`` (round 1, the picks in
``picks.jsonl``), so reruns resume. ``summary.md`` gets mean ± sd over seeds, the difference to random
and its paired t (two-sided 5 %), the same for typiclust vs bait.

    python -m bench.experiments.cold_start
    python -m bench.experiments.cold_start --smoke --out /tmp/cold
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from bench.experiments.common import (
    ResultStore,
    experiment_parser,
    labels_hash,
    round_seed,
    start_run,
)
from bench.experiments.penalty_matrix import paired_t, t_threshold
from bench.suite.shared_data import load_npz
from selection import select
from selection.heads import HeadConfig, predict, train_head
from selection.problem import Task

EXPERIMENT = "cold_start"
MODEL_FREE = ("random", "typiclust", "kmeanspp")
MODEL_BASED = {"classification": ("bait", "badge"), "regression": ("bait",)}


@dataclass(frozen=True)
class Data:
    name: str
    task: str
    X_pool: np.ndarray  # standardised by the pool
    y_pool: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray

    @property
    def k(self) -> int:
        return int(self.y_pool.max()) + 1 if self.task == "classification" else 1


def _standardise(Xp: np.ndarray, Xt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu, sd = Xp.mean(0), Xp.std(0)
    sd[sd == 0] = 1.0
    return ((Xp - mu) / sd).astype(np.float32), ((Xt - mu) / sd).astype(np.float32)


def _split(name: str, task: str, X: np.ndarray, y: np.ndarray, test_frac: float = 0.3) -> Data:
    perm = np.random.default_rng(12345).permutation(X.shape[0])
    t = round(test_frac * X.shape[0])
    te, po = perm[:t], perm[t:]
    Xp, Xt = _standardise(X[po].astype(np.float64), X[te].astype(np.float64))
    return Data(name, task, Xp, y[po], Xt, y[te])


def load(name: str, pool: int) -> Data:
    """A dataset by name: ``digits``, ``wine``, ``breast_cancer``, ``diabetes`` (scikit-learn's bundled
    sets), ``mnist`` (the first 10,000 training images of MNIST), ``fashion`` (Fashion-MNIST); the image
    sets are subsampled to ``pool`` pool rows and ``pool // 2`` test rows and scaled to [0, 1]."""
    if name in ("digits", "wine", "breast_cancer", "diabetes"):
        from sklearn import datasets

        loader = getattr(datasets, f"load_{name}")
        X, y = loader(return_X_y=True)
        task = "regression" if name == "diabetes" else "classification"
        return _split(name, task, X, y.astype(np.float32) if task == "regression" else y.astype(np.int64))
    rng = np.random.default_rng(777)
    if name == "mnist":
        arr = load_npz("mnist10k.npz")
        X = arr["X"].reshape(arr["X"].shape[0], -1)
        y = arr["y"].astype(np.int64)
        rows = rng.permutation(X.shape[0])[: pool + pool // 2]
        Xp, Xt, yp, yt = X[rows[:pool]], X[rows[pool:]], y[rows[:pool]], y[rows[pool:]]
    elif name == "fashion":
        arr = load_npz("fashion_mnist.npz")
        p = rng.permutation(arr["X"].shape[0])[:pool]
        t = rng.permutation(arr["X_test"].shape[0])[: pool // 2]
        Xp, yp = arr["X"][p].reshape(pool, -1), arr["y"][p].astype(np.int64)
        Xt, yt = arr["X_test"][t].reshape(t.shape[0], -1), arr["y_test"][t].astype(np.int64)
    else:
        raise ValueError(f"unknown dataset {name!r}")
    return Data(name, "classification", (Xp / 255.0).astype(np.float32), yp, (Xt / 255.0).astype(np.float32), yt)


def initial(data: Data, m0: str, seed: int) -> np.ndarray:
    """The initial labeled rows: ``"0"``, ``"<N>pc"`` (N per class, stratified) or ``"<N>"`` (random)."""
    rng = np.random.default_rng([seed, 0xC01D])
    if m0 == "0":
        return np.zeros(0, dtype=np.int64)
    if m0.endswith("pc"):
        per = int(m0[:-2])
        rows = [rng.choice(np.flatnonzero(data.y_pool == c), size=per, replace=False) for c in range(data.k)]
        return np.sort(np.concatenate(rows)).astype(np.int64)
    return np.sort(rng.choice(data.X_pool.shape[0], size=int(m0), replace=False)).astype(np.int64)


def score(data: Data, rows: np.ndarray) -> float:
    """Test accuracy (or RMSE) of the independent learner trained on ``rows``."""
    X, y = data.X_pool[rows], data.y_pool[rows]
    if data.task == "regression":
        from sklearn.linear_model import Ridge

        pred = Ridge(alpha=1.0).fit(X, y).predict(data.X_test)
        return float(np.sqrt(np.mean((pred - data.y_test) ** 2)))
    classes = np.unique(y)
    if classes.shape[0] == 1:  # one class seen: the learner can only predict it
        return float(np.mean(data.y_test == classes[0]))
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=2000).fit(X, y)
    return float(np.mean(model.predict(data.X_test) == data.y_test))


def pick(data: Data, strategy: str, labeled: np.ndarray, B: int, seed: int) -> tuple[list[int], dict[str, Any]]:
    """The strategy's first batch; model-based ones on the pool's MLP head trained on ``labeled``."""
    info: dict[str, Any] = {"train_epochs": 0, "stop_reason": "", "train_s": 0.0}
    if strategy in MODEL_FREE:
        res = select(strategy, embeddings=data.X_pool, labeled=labeled, batch_size=B, task=data.task, seed=seed)
        return [int(i) for i in res.indices], info
    t = time.perf_counter()
    m = data.k if data.task == "classification" else 1
    task: Task = "classification" if data.task == "classification" else "regression"
    config = HeadConfig(input_dim=data.X_pool.shape[1], n_outputs=m, task=task, kind="mlp")
    y = data.y_pool[labeled] if data.task == "classification" else data.y_pool[labeled].reshape(-1, 1)
    trained = train_head(config, data.X_pool[labeled], y, seed=seed)
    out = predict(trained, torch.from_numpy(data.X_pool))
    info.update(
        train_epochs=int(trained.metrics.get("epochs", 0)),
        stop_reason=str(trained.metrics.get("stop_reason", "")),
        train_s=time.perf_counter() - t,
    )
    probs = None if out.probs is None else out.probs.numpy()
    res = select(
        strategy,
        embeddings=out.features.numpy(),
        probs=probs,
        labeled=labeled,
        batch_size=B,
        task=data.task,
        seed=seed,
    )
    return [int(i) for i in res.indices], info


def run(
    datasets: Sequence[Data],
    m0s: dict[str, Sequence[str]],
    budgets: Sequence[int],
    seeds: Sequence[int],
    strategies: Sequence[str] | None,
    store: ResultStore,
    *,
    quiet: bool,
) -> None:
    jobs: list[tuple[Data, str, int, int, str]] = []
    for data in datasets:
        names = [*MODEL_FREE, *MODEL_BASED[data.task]]
        names = [s for s in names if strategies is None or s in strategies]
        for m0 in m0s[data.task]:
            for B in budgets:
                for seed in seeds:
                    jobs.extend((data, m0, B, seed, s) for s in names)
    with tqdm(total=len(jobs), desc="cold start", unit="run", disable=quiet, dynamic_ncols=True) as bar:
        for data, m0, B, seed, strategy in jobs:
            config = f"{data.name}-m{m0}-B{B}"
            base = (EXPERIMENT, config, strategy, int(seed))
            bar.set_postfix_str(f"{config} {strategy} seed={seed}")
            if store.done_rounds(base):
                bar.update(1)
                continue
            labeled = initial(data, m0, seed)
            t0 = time.perf_counter()
            picked, info = pick(data, strategy, labeled, B, round_seed(seed, 0))
            t1 = time.perf_counter()
            rows = np.concatenate([labeled, np.asarray(picked, dtype=np.int64)])
            value = score(data, rows)
            store.add_picks(base, 1, picked)
            store.add_row(
                {
                    "experiment": EXPERIMENT,
                    "config": config,
                    "strategy": strategy,
                    "seed": int(seed),
                    "round": 1,
                    "labels": int(rows.shape[0]),
                    "metric": "accuracy" if data.task == "classification" else "rmse",
                    "value": value,
                    "train_epochs": info["train_epochs"],
                    "stop_reason": info["stop_reason"],
                    "train_s": round(info["train_s"], 4),
                    "select_s": round(t1 - t0 - info["train_s"], 4),
                    "round_s": round(time.perf_counter() - t0, 4),
                    "init_hash": labels_hash(labeled),
                }
            )
            bar.update(1)


def summarise(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: per config, mean ± sd of each strategy, and paired t against random and typiclust vs bait."""
    table: dict[str, dict[str, dict[int, float]]] = {}
    metric: dict[str, str] = {}
    for r in rows:
        table.setdefault(r["config"], {}).setdefault(r["strategy"], {})[int(r["seed"])] = float(r["value"])
        metric[r["config"]] = r["metric"]
    order = ["random", "typiclust", "kmeanspp", "bait", "badge"]
    lines = [
        "| config | metric | seeds | " + " | ".join(order) + " | typiclust - random (t) | kmeanspp - random (t) "
        "| typiclust - bait (t) |",
        "|---|---|---|" + "---|" * len(order) + "---|---|---|",
    ]
    wins = {"typiclust": [0, 0, 0], "kmeanspp": [0, 0, 0]}  # better, tie, worse than random (significance)
    incomplete = []
    for config in sorted(table, key=_config_key):
        strat = table[config]
        seeds = sorted(set.intersection(*(set(v) for v in strat.values())))
        if len(seeds) < 2 or len(strat) < 2:  # an interrupted run: nothing to compare yet
            incomplete.append(config)
            continue
        sign = -1.0 if metric[config] == "rmse" else 1.0
        cells = []
        for name in order:
            if name in strat:
                v = np.array([strat[name][s] for s in seeds])
                cells.append(f"{v.mean():.3f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.3f}")
            else:
                cells.append("—")
        diffs = []
        for a, b in (("typiclust", "random"), ("kmeanspp", "random"), ("typiclust", "bait")):
            if a not in strat or b not in strat or len(seeds) < 2:
                diffs.append("—")
                continue
            va = np.array([strat[a][s] for s in seeds])
            vb = np.array([strat[b][s] for s in seeds])
            t = paired_t(va, vb)
            sig = abs(t) > t_threshold(len(seeds))
            diffs.append(f"{va.mean() - vb.mean():+.3f} ({t:+.2f}){' *' if sig else ''}")
            if b == "random":
                better = sign * t > 0
                wins[a][0 if sig and better else 2 if sig else 1] += 1
        lines.append(f"| {config} | {metric[config]} | {len(seeds)} | " + " | ".join(cells + diffs) + " |")
    lines.append("")
    if incomplete:
        lines.append(f"Incomplete (fewer than 2 seeds or strategies, left out): {', '.join(incomplete)}.")
        lines.append("")
    lines.append(
        "`*`: paired t over seeds beyond the two-sided 5 % critical value; RMSE: lower is better. "
        + "; ".join(f"{k} vs random: {w[0]} better, {w[1]} tied, {w[2]} worse" for k, w in wins.items())
    )
    lines += ["", *by_labels(table, metric, incomplete)]
    return "\n".join(lines) + "\n"


def by_labels(table: dict[str, dict[str, dict[int, float]]], metric: dict[str, str], skip: Sequence[str]) -> list[str]:
    """Per task and initial labels, over datasets and budgets: how often each model-free strategy is
    significantly better / tied / worse than bait and than random (the evidence for the cold-start rule)."""
    counts: dict[tuple[str, str, str, str], list[int]] = {}
    for config, strat in table.items():
        if config in skip:
            continue
        task = "regression" if metric[config] == "rmse" else "classification"
        m0 = config.rsplit("-", 2)[1][1:]
        seeds = sorted(set.intersection(*(set(v) for v in strat.values())))
        sign = -1.0 if metric[config] == "rmse" else 1.0
        for a in ("typiclust", "kmeanspp"):
            for b in ("bait", "random"):
                if a not in strat or b not in strat:
                    continue
                t = paired_t(np.array([strat[a][x] for x in seeds]), np.array([strat[b][x] for x in seeds]))
                sig = abs(t) > t_threshold(len(seeds))
                c = counts.setdefault((task, m0, a, b), [0, 0, 0])
                c[0 if sig and sign * t > 0 else 2 if sig else 1] += 1
    out = [
        "| task | initial labels | typiclust vs bait | typiclust vs random | kmeanspp vs bait | kmeanspp vs random |",
        "|---|---|---|---|---|---|",
    ]
    keys = sorted({(k[0], k[1]) for k in counts}, key=lambda tm: (tm[0], _m0_key(tm[1])))
    for task, m0 in keys:
        cells = []
        for a, b in (("typiclust", "bait"), ("typiclust", "random"), ("kmeanspp", "bait"), ("kmeanspp", "random")):
            got = counts.get((task, m0, a, b))
            cells.append("—" if got is None else f"{got[0]} / {got[1]} / {got[2]}")
        out.append(f"| {task} | {m0} | " + " | ".join(cells) + " |")
    out += ["", "Cells: significantly better / tied / significantly worse, over datasets x budgets."]
    return out


def _m0_key(m0: str) -> int:
    return int(m0[:-2]) * 1000 if m0.endswith("pc") else int(m0)


def _config_key(config: str) -> tuple[str, int, int]:
    name, m0, b = config.rsplit("-", 2)
    return name, _m0_key(m0[1:]), int(b[1:])


PRESETS: dict[str, dict[str, Any]] = {
    "full": {
        "datasets": ["digits", "wine", "breast_cancer", "mnist", "fashion", "diabetes"],
        "pool": 3000,
        "m0": {"classification": ["0", "1pc", "2pc", "4pc"], "regression": ["0", "5", "20"]},
        "budgets": [10, 20, 50],
    },
    "smoke": {
        "datasets": ["wine", "diabetes"],
        "pool": 300,
        "m0": {"classification": ["0", "1pc"], "regression": ["0"]},
        "budgets": [6],
    },
}


def main(argv: Sequence[str] | None = None) -> Path:
    p = experiment_parser(__doc__, EXPERIMENT, "two small datasets, one budget, two seeds")
    p.add_argument("--datasets", default=None, help="comma-separated subset of the preset's datasets")
    p.add_argument("--budgets", default=None, help="comma-separated budgets B (default 10,20,50)")
    p.add_argument("--m0", default=None, help="initial labels per task, e.g. '0,1pc,2pc' (classification)")
    p.add_argument("--strategies", default=None, help="subset of random,typiclust,kmeanspp,bait,badge")
    p.add_argument("--pool", type=int, default=None, help="pool rows of the image datasets (default 3000)")
    args = p.parse_args(argv)
    preset = dict(PRESETS["smoke" if args.smoke else "full"])
    names = args.datasets.split(",") if args.datasets else preset["datasets"]
    budgets = [int(b) for b in args.budgets.split(",")] if args.budgets else preset["budgets"]
    m0s = dict(preset["m0"])
    if args.m0:
        m0s["classification"] = [m for m in args.m0.split(",") if m == "0" or m.endswith("pc")]
    pool = args.pool or preset["pool"]
    strategies = args.strategies.split(",") if args.strategies else None
    out, seeds = start_run(
        args,
        EXPERIMENT,
        argv,
        {"datasets": names, "budgets": budgets, "m0": m0s, "pool": pool, "seeds": seeds_of(args)},
    )
    datasets = [load(n, pool) for n in names]
    store = ResultStore(out)
    run(datasets, m0s, budgets, seeds, strategies, store, quiet=args.quiet)
    text = summarise(store.rows())
    (out / "summary.md").write_text(text)
    if not args.quiet:
        print(text)
    return out


def seeds_of(args: Any) -> str:
    return str(args.seeds or ("2" if args.smoke else "5"))


if __name__ == "__main__":
    main()

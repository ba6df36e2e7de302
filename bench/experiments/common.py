"""The active-learning loop shared by every experiment, and its resumable results store.

One *run* is (experiment, config, strategy, seed): starting from ``m0`` random labels drawn from the
seed alone (the same rows for every strategy), it repeats for ``rounds + 1`` rounds

1. train the head from a fresh initialisation on the labeled rows (:func:`selection.heads.train_head`),
2. evaluate it on the test set (accuracy, or RMSE for regression) and time the round,
3. unless it is the last round: penultimate features and probabilities on the pool
   (:func:`selection.heads.predict`), ``select(...)`` a batch, and reveal the true labels of the picks.

Round ``t`` is evaluated with ``m0 + t * batch`` labels. Each round appends one row to
``results.csv`` and, before it, its picks to ``picks.jsonl``; both are keyed by
(experiment, config, strategy, seed, round), so a rerun skips finished rounds and resumes an
interrupted run from its last finished round with exactly the labeled set it had.

The head's initial weights and the strategy's random choices at round ``t`` are seeded by
``(seed, t)`` only, so two strategies differ only through the rows they picked.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
from tqdm import tqdm

from selection import SelectionResult, select
from selection.heads import HeadConfig, TrainedHead, evaluate, predict, train_head

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_ROOT = REPO_ROOT / "docs" / "results"

#: Columns of ``results.csv``, in order; the first five are the key.
COLUMNS: tuple[str, ...] = (
    "experiment",
    "config",
    "strategy",
    "seed",
    "round",
    "labels",
    "metric",
    "value",
    "train_epochs",
    "stop_reason",
    "train_s",
    "select_s",
    "round_s",
    "init_hash",
)
KEY: tuple[str, ...] = COLUMNS[:5]
#: Metrics where lower is better; every other metric (accuracy) is higher-is-better.
LOWER_IS_BETTER: frozenset[str] = frozenset({"rmse", "mse", "error"})

Key = tuple[str, str, str, int, int]


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """A pool to label and a test set.

    Attributes:
        X_pool: ``n x d`` float32 inputs of the head.
        y_pool: ``(n,)`` int64 classes, or ``n x m`` float32 regression targets.
        X_test: ``t x d`` float32.
        y_test: ``(t,)`` or ``t x m``, like ``y_pool``.
        task: ``"classification"`` or ``"regression"``.
        n_outputs: classes ``k`` or regression outputs ``m``.
    """

    X_pool: np.ndarray
    y_pool: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    task: str
    n_outputs: int

    @property
    def metric(self) -> str:
        return "accuracy" if self.task == "classification" else "rmse"


# --------------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StrategySpec:
    """A named strategy of an experiment: the ``select`` strategy and its parameters.

    Attributes:
        name: the label in the CSV and the plots (``"bait"``, ``"bait-paper-lam0.01"``, ...).
        strategy: the registered strategy passed to ``select``.
        params: its keyword parameters.
        inputs: what ``select`` reads: ``"head"`` (default) the penultimate features and probabilities of
            the head trained this round; ``"pool"`` the pool's own inputs and no probabilities, as the
            service runs its model-free strategies (``typiclust``, ``kmeanspp``); ``"pool+probs"`` the
            pool's own inputs as the features with the trained head's probabilities (BAIT on raw
            embeddings, issue 14).
    """

    name: str
    strategy: str
    params: Mapping[str, Any] = field(default_factory=dict)
    inputs: Literal["head", "pool", "pool+probs"] = "head"


@dataclass(frozen=True)
class Setting:
    """One configuration of an experiment (one learning-curve panel).

    Attributes:
        experiment: experiment name (``"linear_mnist"``, ...).
        config: configuration name within it (``"random"``, ``"mnist-B100"``, ...).
        split: pool and test set.
        head: head architecture and training settings (``input_dim``, ``n_outputs``, task match ``split``).
        m0: initial random labels.
        batch: labels added per round.
        rounds: selection rounds; ``rounds + 1`` rows per run (round 0 = the initial labels).
    """

    experiment: str
    config: str
    split: Split
    head: HeadConfig
    m0: int
    batch: int
    rounds: int

    def __post_init__(self) -> None:
        n = self.split.X_pool.shape[0]
        if self.m0 + self.rounds * self.batch > n:
            raise ValueError(
                f"{self.experiment}/{self.config}: {self.m0} + {self.rounds} x {self.batch} labels "
                f"exceed the pool ({n})"
            )


@dataclass(frozen=True)
class RoundState:
    """What a :class:`RunHook` sees of a round: the run, the round, the labeled rows and the head trained on them."""

    setting: Setting
    spec: StrategySpec
    seed: int
    rnd: int
    rows: np.ndarray
    trained: TrainedHead


class RunHook(Protocol):
    """Per-round additions to :func:`run_one` for an experiment that needs more than the test metric (the
    ``auto`` experiment keeps the bandit's history, scores a validation split and predicts a stop set).
    A hook that keeps state across rounds persists it itself: a resumed run calls it only for the rounds
    it computes."""

    def select_params(self, state: RoundState) -> Mapping[str, Any]:
        """Extra ``select`` parameters of this round (called before selecting, not at the last round)."""
        ...

    def after_round(self, state: RoundState, result: SelectionResult | None) -> None:
        """Called once the round is computed (``result`` None at the last round), before its row is stored."""
        ...


def initial_labels(n: int, m0: int, seed: int) -> np.ndarray:
    """``m0`` distinct pool rows drawn from ``seed`` alone (the same for every strategy), sorted."""
    rng = np.random.default_rng([seed, 0x1AB])
    return np.sort(rng.choice(n, size=m0, replace=False)).astype(np.int64)


def labels_hash(indices: np.ndarray) -> str:
    """Short digest of a set of row indices (order-free)."""
    return hashlib.sha1(np.sort(np.asarray(indices, dtype=np.int64)).tobytes()).hexdigest()[:12]


def round_seed(seed: int, rnd: int) -> int:
    """Seed of the head initialisation and of the strategy at round ``rnd`` of run ``seed``."""
    return seed * 100_003 + rnd


def _targets(split: Split, rows: np.ndarray) -> np.ndarray:
    return split.y_pool[rows]


def run_one(
    setting: Setting,
    spec: StrategySpec,
    seed: int,
    store: ResultStore,
    *,
    on_round: Callable[[], None] | None = None,
    hook: RunHook | None = None,
) -> None:
    """Run (or resume) one active-learning run, writing a row per round to ``store``.

    Args:
        setting: the configuration.
        spec: the strategy.
        seed: the run's seed (initial labels, head initialisations, strategy randomness).
        store: where finished rounds are read from and new ones appended.
        on_round: called after every round that is computed or skipped (progress bars).
        hook: per-round additions (:class:`RunHook`), called for the rounds computed.
    """
    split = setting.split
    n = split.X_pool.shape[0]
    init = initial_labels(n, setting.m0, seed)
    init_hash = labels_hash(init)
    base = (setting.experiment, setting.config, spec.name, int(seed))
    done = store.done_rounds(base)
    labeled = list(init.tolist())
    start = 0
    if done:
        last = max(done)
        if done != set(range(last + 1)):
            raise RuntimeError(f"{base}: rounds {sorted(done)} are not contiguous; delete that run's rows")
        picks = store.picks(base)
        for r in range(min(last + 1, setting.rounds)):
            if r not in picks:
                raise RuntimeError(f"{base}: picks of round {r} missing from {store.picks_path}")
            labeled.extend(picks[r])
        start = last + 1
        for _ in range(start):
            if on_round is not None:
                on_round()
    pool_t = torch.from_numpy(split.X_pool)
    for rnd in range(start, setting.rounds + 1):
        t0 = time.perf_counter()
        rows = np.asarray(labeled, dtype=np.int64)
        if rows.shape[0] != setting.m0 + rnd * setting.batch or np.unique(rows).shape[0] != rows.shape[0]:
            raise RuntimeError(f"{base}: round {rnd} has {rows.shape[0]} labeled rows, some repeated or missing")
        rs = round_seed(seed, rnd)
        trained = train_head(setting.head, split.X_pool[rows], _targets(split, rows), seed=rs)
        scores = evaluate(trained, split.X_test, split.y_test)
        value = float(scores["accuracy"] if split.task == "classification" else scores["rmse"])
        t1 = time.perf_counter()
        picked: list[int] = []
        state = RoundState(setting, spec, int(seed), rnd, rows, trained) if hook is not None else None
        result: SelectionResult | None = None
        if rnd < setting.rounds:
            if spec.inputs == "pool":
                embeddings, probs = split.X_pool, None
            else:
                out = predict(trained, pool_t)
                embeddings, probs = out.features.numpy(), (None if out.probs is None else out.probs.numpy())
                if spec.inputs == "pool+probs":
                    embeddings = split.X_pool
            result = select(
                spec.strategy,
                embeddings=embeddings,
                probs=probs,
                labeled=rows,
                batch_size=setting.batch,
                task=split.task,
                seed=rs,
                **dict(spec.params),
                **(dict(hook.select_params(state)) if hook is not None and state is not None else {}),
            )
            picked = [int(i) for i in result.indices]
            store.add_picks(base, rnd, picked)
        t2 = time.perf_counter()
        if hook is not None and state is not None:
            hook.after_round(state, result)
        store.add_row(
            {
                "experiment": setting.experiment,
                "config": setting.config,
                "strategy": spec.name,
                "seed": int(seed),
                "round": rnd,
                "labels": int(rows.shape[0]),
                "metric": split.metric,
                "value": value,
                "train_epochs": int(trained.metrics.get("epochs", 0)),
                "stop_reason": str(trained.metrics.get("stop_reason", "")),
                "train_s": round(t1 - t0, 4),
                "select_s": round(t2 - t1, 4),
                "round_s": round(t2 - t0, 4),
                "init_hash": init_hash,
            }
        )
        labeled.extend(picked)
        if on_round is not None:
            on_round()


def run_grid(
    settings: Sequence[Setting],
    specs: Sequence[StrategySpec],
    seeds: Iterable[int],
    store: ResultStore,
    *,
    desc: str = "rounds",
    quiet: bool = False,
    hooks: Mapping[str, RunHook] | None = None,
) -> None:
    """Every (setting, seed, strategy) run, seeds in the outer loop so partial results stay balanced.

    A tqdm bar counts rounds over the whole grid; finished rounds found in ``store`` tick at once.
    ``hooks``: config name -> the :class:`RunHook` of that setting's runs.
    """
    seeds = list(seeds)
    total = sum((s.rounds + 1) * len(specs) * len(seeds) for s in settings)
    with tqdm(total=total, desc=desc, unit="round", disable=quiet, dynamic_ncols=True) as bar:
        for setting in settings:
            for seed in seeds:
                for spec in specs:
                    bar.set_postfix_str(f"{setting.config} {spec.name} seed={seed}")
                    hook = None if hooks is None else hooks.get(setting.config)
                    run_one(setting, spec, seed, store, on_round=lambda: bar.update(1), hook=hook)


# --------------------------------------------------------------------------------------------------
# Store
# --------------------------------------------------------------------------------------------------


class ResultStore:
    """``results.csv`` (one row per round) plus ``picks.jsonl`` (rows picked per round), append-only.

    Rows are flushed as they are written, so a killed run loses at most the round in progress.
    """

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.out_dir / "results.csv"
        self.picks_path = self.out_dir / "picks.jsonl"
        self._rows: dict[Key, dict[str, Any]] = {k_row[0]: k_row[1] for k_row in _read_keyed(self.csv_path)}
        self._picks: dict[Key, list[int]] = {}
        if self.picks_path.is_file():
            with self.picks_path.open() as f:
                for line in f:
                    if line.strip():
                        rec = json.loads(line)
                        self._picks[_key(rec)] = [int(i) for i in rec["picked"]]

    def done_rounds(self, base: tuple[str, str, str, int]) -> set[int]:
        """Rounds of run ``base = (experiment, config, strategy, seed)`` already in the CSV."""
        return {k[4] for k in self._rows if k[:4] == base}

    def picks(self, base: tuple[str, str, str, int]) -> dict[int, list[int]]:
        """Round -> picked rows, for run ``base``."""
        return {k[4]: v for k, v in self._picks.items() if k[:4] == base}

    def add_picks(self, base: tuple[str, str, str, int], rnd: int, picked: list[int]) -> None:
        key: Key = (*base, rnd)
        self._picks[key] = picked
        rec = dict(zip(KEY, key, strict=True))
        rec["picked"] = picked
        with self.picks_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")

    def add_row(self, row: dict[str, Any]) -> None:
        key = _key(row)
        if key in self._rows:
            raise RuntimeError(f"row {key} is already in {self.csv_path}")
        new = not self.csv_path.is_file() or self.csv_path.stat().st_size == 0
        with self.csv_path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
            if new:
                writer.writeheader()
            writer.writerow(row)
        self._rows[key] = row

    def rows(self) -> list[dict[str, Any]]:
        return list(self._rows.values())


def _key(rec: Mapping[str, Any]) -> Key:
    return (str(rec["experiment"]), str(rec["config"]), str(rec["strategy"]), int(rec["seed"]), int(rec["round"]))


def _read_keyed(path: Path) -> list[tuple[Key, dict[str, Any]]]:
    return [(_key(r), r) for r in read_results(path)] if path.is_file() else []


def read_results(path: Path | str) -> list[dict[str, Any]]:
    """Rows of a ``results.csv`` with numeric columns parsed (``seed``, ``round``, ``labels`` int;
    ``value`` and the timings float)."""
    out: list[dict[str, Any]] = []
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            rec: dict[str, Any] = dict(row)
            for name in ("seed", "round", "labels", "train_epochs"):
                rec[name] = int(rec[name])
            for name in ("value", "train_s", "select_s", "round_s"):
                rec[name] = float(rec[name])
            out.append(rec)
    return out


# --------------------------------------------------------------------------------------------------
# Curves and plots
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Curve:
    """Mean and standard error over seeds of one strategy in one configuration.

    Attributes:
        labels: ``(r,)`` labels used at each round (rounds every seed has).
        mean: ``(r,)`` mean metric.
        se: ``(r,)`` standard error (``std / sqrt(n_seeds)``, ``ddof=1``; 0 with one seed).
        n_seeds: seeds averaged.
    """

    labels: np.ndarray
    mean: np.ndarray
    se: np.ndarray
    n_seeds: int


def curves(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, Curve]]:
    """(experiment, config) -> strategy -> :class:`Curve`, over the rounds that all its seeds reached."""
    table: dict[tuple[str, str], dict[str, dict[int, dict[int, tuple[int, float]]]]] = {}
    for r in rows:
        cfg = table.setdefault((str(r["experiment"]), str(r["config"])), {})
        cfg.setdefault(str(r["strategy"]), {}).setdefault(int(r["seed"]), {})[int(r["round"])] = (
            int(r["labels"]),
            float(r["value"]),
        )
    out: dict[tuple[str, str], dict[str, Curve]] = {}
    for cfg_key, strategies in table.items():
        out[cfg_key] = {}
        for name, seeds in strategies.items():
            common = sorted(set.intersection(*(set(v) for v in seeds.values())))
            rounds = [r for i, r in enumerate(common) if r == i]  # the contiguous prefix 0..r
            if not rounds:
                continue
            vals = np.array([[seeds[s][r][1] for r in rounds] for s in sorted(seeds)])  # seeds x rounds
            labels = np.array([seeds[min(seeds)][r][0] for r in rounds])
            n_seeds = vals.shape[0]
            se = vals.std(axis=0, ddof=1) / math.sqrt(n_seeds) if n_seeds > 1 else np.zeros(len(rounds))
            out[cfg_key][name] = Curve(labels=labels, mean=vals.mean(axis=0), se=se, n_seeds=n_seeds)
    return out


def plot_curves(rows: Sequence[Mapping[str, Any]], path: Path, *, title: str = "") -> Path:
    """Learning curves (mean over seeds, shaded ± one standard error), one panel per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = curves(rows)
    metrics = {(str(r["experiment"]), str(r["config"])): str(r["metric"]) for r in rows}
    keys = sorted(data)
    ncols = min(3, max(1, len(keys)))
    nrows = max(1, math.ceil(len(keys) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.9 * nrows), squeeze=False)
    names = sorted({name for k in keys for name in data[k]})
    colors = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(names)}
    for ax, key in zip(axes.flat, keys, strict=False):
        for name, c in sorted(data[key].items()):
            ax.plot(c.labels, c.mean, label=f"{name} (n={c.n_seeds})", color=colors[name], lw=1.4)
            ax.fill_between(c.labels, c.mean - c.se, c.mean + c.se, color=colors[name], alpha=0.2, lw=0)
        ax.set_title(f"{key[0]} / {key[1]}", fontsize=10)
        ax.set_xlabel("labels used")
        ax.set_ylabel(f"test {metrics[key]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------
# Command-line plumbing
# --------------------------------------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` -> [0..4], ``"0,2,5"`` -> [0, 2, 5], ``"3"`` -> [0, 1, 2] (a count).

    Raises:
        ValueError: text that gives no seed (``"0"`` is a count of none: one seed is ``"0-0"`` or ``"0,"``).
    """
    text = text.strip()
    if "-" in text:
        lo, hi = text.split("-", 1)
        seeds = list(range(int(lo), int(hi) + 1))
    elif "," in text:
        seeds = [int(s) for s in text.split(",") if s]
    else:
        seeds = list(range(int(text)))
    if not seeds:
        raise ValueError(f"--seeds {text!r} gives no seed: a count ('5' = 0-4), a range ('0-0') or a list ('0,3')")
    return seeds


def experiment_parser(doc: str | None, experiment: str, smoke_help: str) -> argparse.ArgumentParser:
    """The options every experiment takes: ``--smoke``, ``--out``, ``--seeds``, ``--quiet``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help=smoke_help)
    p.add_argument("--out", type=Path, default=None, help=f"output folder (default {RESULTS_ROOT / experiment})")
    p.add_argument("--seeds", default=None, help="'5' (= 0-4), '0-4' or '0,3' (default 5; smoke 2)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def add_strategy_options(p: argparse.ArgumentParser, lr_help: str) -> None:
    """``--strategies`` (a subset), ``--lr`` of the head, ``--lam`` (BAIT's ridge)."""
    p.add_argument("--strategies", default=None, help="subset of the strategies, comma-separated")
    p.add_argument("--lr", type=float, default=1e-3, help=lr_help)
    p.add_argument("--lam", type=float, default=None, help="BAIT's ridge (default: the library's)")


def add_size_options(p: argparse.ArgumentParser, sizes: Mapping[str, int]) -> None:
    """One integer option per size (``--pool``, ``--m0``, ...); unset ones keep the preset."""
    for name in sizes:
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=None)


def sizes_from(args: argparse.Namespace, base: Mapping[str, int]) -> dict[str, int]:
    """``base`` overridden by the size options given on the command line."""
    return {k: (getattr(args, k) if getattr(args, k, None) is not None else v) for k, v in base.items()}


def chosen_strategies(specs: Sequence[StrategySpec], wanted: str | None) -> list[StrategySpec]:
    """The specs named in ``--strategies`` (all when not given)."""
    if not wanted:
        return list(specs)
    names = wanted.split(",")
    return [s for s in specs if s.name in names]


def bait_params(lam: float | None, convention: str, oversample: float) -> dict[str, Any]:
    """BAIT's parameters in an experiment (``lam=None``: the library's default ridge)."""
    return {**({} if lam is None else {"lam": lam}), "convention": convention, "oversample": oversample}


def run_and_plot(
    grid: Sequence[Setting],
    specs: Sequence[StrategySpec],
    seeds: Sequence[int],
    out: Path,
    *,
    desc: str,
    quiet: bool,
    title: str,
) -> Path:
    """Run (or resume) the grid into ``out``, then draw its learning curves to ``out/curves.png``."""
    store = ResultStore(out)
    run_grid(grid, specs, seeds, store, desc=desc, quiet=quiet)
    plot_curves(store.rows(), out / "curves.png", title=title)
    return out


def start_run(
    args: argparse.Namespace, experiment: str, argv: Sequence[str] | None, info: Mapping[str, Any]
) -> tuple[Path, list[int]]:
    """The output folder and seeds of this invocation; its command, machine and ``info`` are recorded."""
    out: Path = args.out or RESULTS_ROOT / experiment
    seeds = parse_seeds(args.seeds or ("2" if args.smoke else "5"))
    write_run_info(out, [f"bench.experiments.{experiment}", *(argv if argv is not None else sys.argv[1:])], info)
    return out, seeds


def machine_info() -> str:
    """One line naming the machine the results came from."""
    return (
        f"{platform.platform()}; {platform.processor() or platform.machine()}; {os.cpu_count()} CPUs; "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads); Python {sys.version.split()[0]}"
    )


def write_run_info(out_dir: Path, argv: Sequence[str], extra: Mapping[str, Any]) -> None:
    """Append the exact command, machine and settings of this invocation to ``<out>/runs.jsonl``."""
    rec = {
        "command": "python -m " + " ".join(argv),
        "machine": machine_info(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        **extra,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "runs.jsonl").open("a") as f:
        f.write(json.dumps(rec, default=str) + "\n")


@contextmanager
def recorded_run(out_dir: Path, module: str, argv: Sequence[str], **extra: Any) -> Iterator[dict[str, Any]]:
    """Time one invocation and, when it completes, append it to ``<out_dir>/runs.jsonl``: ``extra``, the
    command (``python -m <module> <argv>``), machine, start time, 1-minute load at start and end, wall seconds.
    Keys added to the yielded record meanwhile are written too; a run that raises is not recorded."""
    rec: dict[str, Any] = {
        **extra,
        "command": f"python -m {module} " + " ".join(argv),
        "machine": machine_info(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "load_start": list(os.getloadavg()),
    }
    t0 = time.perf_counter()
    yield rec
    rec["wall_s"] = round(time.perf_counter() - t0, 1)
    rec["load_end"] = list(os.getloadavg())
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "runs.jsonl").open("a") as f:
        f.write(json.dumps(rec, default=str) + "\n")


def run_timing(rec: Mapping[str, Any]) -> tuple[str, str, str]:
    """(wall time, load at start, load at end) of a :func:`recorded_run` record, as report cells."""
    la0 = "/".join(f"{x:.2f}" for x in rec.get("load_start", []))
    la1 = "/".join(f"{x:.2f}" for x in rec.get("load_end", []))
    wall = f"{rec['wall_s']:.0f} s" if "wall_s" in rec else "(unfinished)"
    return wall, la0, la1


def with_epochs(config: HeadConfig, max_epochs: int) -> HeadConfig:
    """``config`` with another epoch cap."""
    return replace(config, max_epochs=max_epochs)

"""Replay the stopping rule offline on ``auto_heldout``'s recorded rounds: choose its settings on the tune half,
judge them on the held-out half (issue 28).

:mod:`bench.experiments.auto_heldout` records, for every round of every run, the validation score of the
round's head and its predictions on the run's fixed stop set (``rounds.jsonl.gz`` of ``docs/results/auto/tune``
and ``docs/results/auto/heldout``). This module replays :func:`selection.stopping.stop_recommendation` on
those records for every setting of a grid of its options (``threshold``, ``window``, ``slope_points``,
``min_gain``), without retraining anything, and classifies every run with ``auto_heldout``'s own functions
(:func:`~bench.experiments.auto_heldout.stop_marks`, :func:`~bench.experiments.auto_heldout.stop_verdict`,
:func:`~bench.experiments.auto_heldout.stop_record`): ``early`` (stops before L95), ``ok`` (L95 <= stop
<= 1.25 L98, issue 28's target), ``late`` (stops after 1.25 L98, or never although 1.25 L98 is within the
budget), ``censored`` (never stops and 1.25 L98 lies past the last budget). L95 / L98: the first budget at
which the seed-mean validation curve of the run's dataset and strategy reaches 95 % / 98 % of its final value.

How a setting is replayed: per run, the agreement of every round's stop-set predictions with the previous
round's is computed once (:func:`selection.stopping.prediction_agreement`, as ``stop_recommendation`` does:
every round of these runs has more labels than the one before), and for each setting the first round at
which :func:`selection.stopping.stop_from_agreements` (the function ``stop_recommendation`` hands those
agreements to) recommends stopping on the run's records up to that round is the run's stop. Rounds where the
agreements alone rule out a stable verdict (fewer than ``window`` compared rounds, or one of the last
``window`` below ``threshold``) are skipped without a call; that shortcut is checked: for the library's
defaults and for the chosen setting, on both halves, the verdicts must equal
:func:`bench.experiments.auto_heldout.stop_runs` (which calls ``stop_recommendation`` on the predictions
themselves), or the module stops with an error.

**The choice rule** (fixed before the held-out half was replayed): on the tune half only, the setting with
the fewest ``early`` runs (issue 28: never before L95), then the most ``ok``, then the fewest ``late``; a tie
goes to the most conservative setting: the highest ``threshold``, then the longest ``window``, then the most
``slope_points``, then the smallest ``min_gain``. That one setting, and the library's defaults beside it, is
then replayed on the held-out half.

Outputs (``--out``, default ``docs/results/auto/stopping``), each headed by the command that made it:
``tune_grid.csv`` (every setting's counts on the tune half, in the order of the choice rule),
``choice.json`` (the rule, the chosen setting, the defaults, and both halves' counts for each),
``heldout_runs.csv`` (per held-out run: where the chosen setting and the defaults stop, L95, L98, verdicts)
and ``summary.txt`` (what the command prints: the tune table, the chosen setting, the held-out tables and
the distribution of stop / L98).

    python -m bench.experiments.stopping_replay                    # the grid below, about 1 min on one core
    python -m bench.experiments.stopping_replay --thresholds 0.9,0.95 --windows 3 --out /tmp/stop
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.experiments import auto_heldout as ah
from bench.experiments.common import REPO_ROOT, RESULTS_ROOT, read_results
from selection.stopping import (
    MIN_GAIN,
    MIN_SLOPE_POINTS,
    SLOPE_POINTS,
    THRESHOLD,
    WINDOW,
    prediction_agreement,
    stop_from_agreements,
)

MODULE = "bench.experiments.stopping_replay"
OUT = RESULTS_ROOT / "auto" / "stopping"
TUNE = RESULTS_ROOT / "auto" / "tune"
HELDOUT = RESULTS_ROOT / "auto" / "heldout"
KNOBS = ("threshold", "window", "slope_points", "min_gain")
#: The grid replayed on the tune half.
GRID: dict[str, tuple[float, ...] | tuple[int, ...]] = {
    "threshold": (0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99),
    "window": (1, 2, 3, 4, 5),
    "slope_points": (3, 4, 5, 6),
    "min_gain": (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0),
}
VERDICTS = ("ok", "early", "late", "censored", "undefined")
RATIO_QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)

Rule = dict[str, Any]


def library_defaults() -> Rule:
    """The rule's options as :mod:`selection.stopping` sets them by default."""
    return {"threshold": THRESHOLD, "window": WINDOW, "slope_points": SLOPE_POINTS, "min_gain": MIN_GAIN}


@dataclass
class Half:
    """One half's recorded runs: the round log, each dataset's task, every run's records, the L95 / L98 marks
    per (dataset, strategy), and per run its agreements (one per round, None for the first) and validation
    curve ``[(labels, value), ...]``."""

    name: str
    log: ah.RoundLog
    tasks: dict[str, str]
    runs: dict[ah.RunKey, list[dict[str, Any]]]
    marks: dict[tuple[str, str], dict[str, Any]]
    agreements: dict[ah.RunKey, list[float | None]]
    curves: dict[ah.RunKey, list[tuple[int, float]]]


def load_half(folder: Path, name: str) -> Half:
    """``folder``'s ``results.csv`` (the tasks) and ``rounds.jsonl[.gz]``, with every run's agreements.

    Raises:
        ValueError: a run with no records, or two rounds of a run with the same number of labels (the
            replay compares consecutive records, which ``stop_recommendation`` does only across rounds).
    """
    tasks = ah.run_tasks(read_results(folder / "results.csv"))
    log = ah.RoundLog(folder / "rounds.jsonl")
    runs = ah.run_records(log)
    if not runs:
        raise ValueError(f"{folder}: no round records (rounds.jsonl or rounds.jsonl.gz)")
    agreements: dict[ah.RunKey, list[float | None]] = {}
    curves: dict[ah.RunKey, list[tuple[int, float]]] = {}
    for key, recs in runs.items():
        task = tasks.get(key[0], "classification")
        curve = [(int(r["labels"]), float(r["validation"])) for r in recs]
        labels = [n for n, _ in curve]
        if any(b <= a for a, b in itertools.pairwise(labels)):
            raise ValueError(f"{folder}: run {key} has rounds without new labels: {labels}")
        preds = [ah.decode(r["stop_preds"]) for r in recs]
        agreements[key] = [None] + [prediction_agreement(a, b, task) for a, b in itertools.pairwise(preds)]
        curves[key] = curve
    return Half(name, log, tasks, runs, ah.stop_marks(runs), agreements, curves)


def first_stop(
    agreements: Sequence[float | None], curve: Sequence[tuple[int, float]], task: str, rule: Rule
) -> float | None:
    """The labels at the first round where ``stop_from_agreements`` recommends stopping on the run up to that
    round (None: never); rounds the agreements already rule out are not asked."""
    threshold, window = float(rule["threshold"]), int(rule["window"])
    measure = "kappa" if task == "classification" else "r2"
    for i in range(len(curve)):
        recent = agreements[max(1, i - window + 1) : i + 1]
        if i < window or any(a is None or a < threshold for a in recent):
            continue  # not `window` compared rounds at or above the threshold: the rule cannot be stable
        rec = stop_from_agreements(
            agreements[: i + 1], curve[: i + 1], agreement=measure, metric=ah.stop_metric(task), **rule
        )
        if rec.recommended:
            return float(curve[i][0])
    return None


def replay(half: Half, rule: Rule) -> list[dict[str, Any]]:
    """Per run of ``half``: ``auto_heldout``'s stop record (stop, L95, L98, verdict) under ``rule``."""
    out = []
    for key in half.runs:
        task = half.tasks.get(key[0], "classification")
        stop = first_stop(half.agreements[key], half.curves[key], task, rule)
        out.append(ah.stop_record(key, task, stop, half.marks[(key[0], key[1])]))
    return out


def first_possible(curve: Sequence[tuple[int, float]], window: int) -> float | None:
    """The labels of the first round at which a rule with ``window`` can recommend stopping at all: it needs
    ``window`` compared rounds and the slope of :data:`~selection.stopping.MIN_SLOPE_POINTS` scored ones (every
    round of these runs is scored); None when the run is shorter."""
    i = max(window, MIN_SLOPE_POINTS - 1)
    return float(curve[i][0]) if i < len(curve) else None


def out_of_reach(half: Half, window: int) -> tuple[int, int]:
    """``(runs, with_L98)``: the runs of ``half`` whose ``1.25 L98`` lies before the first round a rule with
    ``window`` can stop at (no setting with that window can be ``ok`` there), and the runs with an L98."""
    late_bound, n, with_mark = ah.STOP_LATE, 0, 0
    for key, curve in half.curves.items():
        l98 = half.marks[(key[0], key[1])].get("L98")
        if not l98:
            continue
        with_mark += 1
        first = first_possible(curve, window)
        n += first is None or first > late_bound * float(l98)
    return n, with_mark


def verify(half: Half, rule: Rule, records: Sequence[Mapping[str, Any]]) -> None:
    """Raise RuntimeError unless ``records`` (the replay) equal ``auto_heldout.stop_runs`` under ``rule``."""
    direct = ah.stop_runs(half.log, half.tasks, rule)
    if [dict(r) for r in records] != direct:
        bad = next(
            (a["dataset"], a["strategy"], a["seed"], a["stop"], b["stop"])
            for a, b in zip(records, direct, strict=True)
            if dict(a) != b
        )
        raise RuntimeError(f"{half.name}: the replay of {rule} differs from stop_runs at {bad}")


def totals(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``auto_heldout.stop_summary``'s ``all`` / ``all`` row: runs, stopped, the verdict counts, stop / L98."""
    row = next(r for r in ah.stop_summary(records) if r["dataset"] == "all" and r["strategy"] == "all")
    return {k: v for k, v in row.items() if k not in ("dataset", "strategy")}


def choice_key(row: Mapping[str, Any]) -> tuple[float, ...]:
    """The choice rule as a sort key (smallest first)."""
    return (
        row["early"],
        -row["ok"],
        row["late"],
        -row["threshold"],
        -row["window"],
        -row["slope_points"],
        row["min_gain"],
    )


def tune_grid(half: Half, grid: Mapping[str, Sequence[float]]) -> list[dict[str, Any]]:
    """Every setting of ``grid`` replayed on ``half``: the setting and its totals, in the choice rule's order."""
    rows = []
    for values in itertools.product(*(grid[k] for k in KNOBS)):
        rule = dict(zip(KNOBS, values, strict=True))
        rows.append({**rule, **totals(replay(half, rule))})
    return sorted(rows, key=choice_key)


def distribution(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Where the runs stopped: verdict counts, stop / L98 quantiles over the runs that stopped, and the stops
    below L95, in [L95, L98), in [L98, 1.25 L98] and past 1.25 L98."""
    stopped = [r for r in records if r["stop"] is not None and r["L98"]]
    ratios = np.asarray([r["stop"] / r["L98"] for r in stopped], dtype=np.float64)
    bands = {
        "below_L95": sum(r["stop"] < r["L95"] for r in stopped),
        "L95_to_L98": sum(r["L95"] <= r["stop"] < r["L98"] for r in stopped),
        "L98_to_1.25L98": sum(r["L98"] <= r["stop"] <= ah.STOP_LATE * r["L98"] for r in stopped),
        "past_1.25L98": sum(r["stop"] > ah.STOP_LATE * r["L98"] for r in stopped),
    }
    return {
        "runs": len(records),
        "stopped": len(stopped),
        "verdicts": {v: sum(r["verdict"] == v for r in records) for v in VERDICTS},
        "stop_over_L98_quantiles": {
            f"q{int(q * 100)}": float(np.quantile(ratios, q)) for q in RATIO_QUANTILES if ratios.size
        },
        "stops": bands,
    }


# --------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------


def _rule_text(rule: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {rule[k]}" for k in KNOBS)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def grid_table(rows: Sequence[Mapping[str, Any]], top: int, marked: Mapping[str, Rule]) -> list[str]:
    """The first ``top`` rows of the grid, plus the rows of ``marked`` (label: rule) wherever they rank."""
    head = "rank  threshold window slope_points min_gain |  ok early late censored stopped | stop/L98 min med max"
    lines = [head, "-" * len(head)]
    for i, r in enumerate(rows):
        labels = [name for name, rule in marked.items() if all(rule[k] == r[k] for k in KNOBS)]
        if i >= top and not labels:
            continue
        lines.append(
            f"{i + 1:>4}  {r['threshold']:>9} {r['window']:>6} {r['slope_points']:>12} {r['min_gain']:>8} | "
            f"{r['ok']:>3} {r['early']:>5} {r['late']:>4} {r['censored']:>8} {r['stopped']:>7} | "
            f"{_num(r['ratio_min'])} {_num(r['ratio_median'])} {_num(r['ratio_max'])}"
            + (f"  <- {', '.join(labels)}" if labels else "")
        )
    return lines


def per_dataset_table(by_rule: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Per dataset, for each named rule: ok / early / late / censored over its runs (every strategy)."""
    names = list(by_rule)
    head = f"{'dataset':<14} {'runs':>4} | " + " | ".join(f"{n:^27}" for n in names)
    sub = f"{'':<14} {'':>4} | " + " | ".join(
        f"{'ok':>5} {'early':>5} {'late':>5} {'cens.':>5} {'stop':>4}" for _ in names
    )
    lines = [head, sub, "-" * len(sub)]
    datasets = sorted({str(r["dataset"]) for recs in by_rule.values() for r in recs})
    for d in [*datasets, "all"]:
        cells = []
        n = 0
        for name in names:
            members = [r for r in by_rule[name] if d in ("all", r["dataset"])]
            n = len(members)
            c = {v: sum(r["verdict"] == v for r in members) for v in VERDICTS}
            stopped = sum(r["stop"] is not None for r in members)
            cells.append(f"{c['ok']:>5} {c['early']:>5} {c['late']:>5} {c['censored']:>5} {stopped:>4}")
        lines.append(f"{d:<14} {n:>4} | " + " | ".join(cells))
    return lines


def distribution_lines(name: str, dist: Mapping[str, Any]) -> list[str]:
    q = dist["stop_over_L98_quantiles"]
    v = dist["verdicts"]
    s = dist["stops"]
    runs = dist["runs"]
    lines = [
        f"{name}: {runs} runs; ok {v['ok']} ({v['ok'] / runs:.1%}), early {v['early']}, late {v['late']} "
        f"({v['late'] / runs:.1%}), censored {v['censored']} ({v['censored'] / runs:.1%}), undefined {v['undefined']}",
        f"  stopped {dist['stopped']}: below L95 {s['below_L95']}, L95..L98 {s['L95_to_L98']}, "
        f"L98..1.25 L98 {s['L98_to_1.25L98']}, past 1.25 L98 {s['past_1.25L98']}",
    ]
    if q:
        lines.append("  stop / L98 over the stopped runs: " + ", ".join(f"{k} {x:.2f}" for k, x in q.items()))
    return lines


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tune", type=Path, default=TUNE, help=f"the tune half's results folder (default {TUNE})")
    p.add_argument("--heldout", type=Path, default=HELDOUT, help=f"the held-out half's folder (default {HELDOUT})")
    p.add_argument("--out", type=Path, default=OUT, help=f"where the outputs go (default {OUT})")
    for knob in KNOBS:
        p.add_argument(
            f"--{knob.replace('_', '-')}s" if knob != "slope_points" else "--slope-points",
            dest=knob,
            type=_ints if knob in ("window", "slope_points") else _floats,
            default=GRID[knob],
            help=f"comma-separated grid values (default {','.join(str(x) for x in GRID[knob])})",
        )
    p.add_argument("--top", type=int, default=25, help="grid rows printed (default 25; the csv has all)")
    return p


def _command(argv: Sequence[str]) -> str:
    return " ".join(["python -m", MODULE, *(shlex.quote(a) for a in argv)])


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (the outputs do not name this machine)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _header(command: str) -> str:
    return f"# {command}\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    argv_list = list(argv) if argv is not None else sys.argv[1:]
    command = _command(argv_list)
    grid = {k: tuple(getattr(args, k)) for k in KNOBS}
    defaults = library_defaults()
    printed: list[str] = [command, ""]

    def say(lines: Sequence[str] | str) -> None:
        for line in [lines] if isinstance(lines, str) else lines:
            print(line, flush=True)
            printed.append(line)

    tune = load_half(args.tune, "tune")
    rows = tune_grid(tune, grid)
    chosen: Rule = {k: rows[0][k] for k in KNOBS}
    tune_chosen, tune_defaults = replay(tune, chosen), replay(tune, defaults)
    verify(tune, chosen, tune_chosen)
    verify(tune, defaults, tune_defaults)
    say(f"TUNE half ({_shown(args.tune)}): {len(tune.runs)} runs, {len(rows)} settings, in the choice rule's order")
    say("(fewest early, then most ok, then fewest late; ties: highest threshold, longest window, most slope")
    say(" points, smallest min_gain)")
    say("")
    say(grid_table(rows, args.top, {"chosen": chosen, "library defaults": defaults}))
    say("")
    say(f"CHOSEN on the tune half: {_rule_text(chosen)}   (library defaults: {_rule_text(defaults)})")
    say("")
    say(per_dataset_table({"chosen": tune_chosen, "library defaults": tune_defaults}))
    say("")

    held = load_half(args.heldout, "heldout")
    held_chosen, held_defaults = replay(held, chosen), replay(held, defaults)
    verify(held, chosen, held_chosen)
    verify(held, defaults, held_defaults)
    say(f"HELD-OUT half ({_shown(args.heldout)}): {len(held.runs)} runs, the chosen setting and the library defaults")
    say("")
    say(per_dataset_table({"chosen": held_chosen, "library defaults": held_defaults}))
    say("")
    dists = {
        "tune": {"chosen": distribution(tune_chosen), "library_defaults": distribution(tune_defaults)},
        "heldout": {"chosen": distribution(held_chosen), "library_defaults": distribution(held_defaults)},
    }
    for half_name in ("tune", "heldout"):
        for rule_name, dist in dists[half_name].items():
            say(distribution_lines(f"{half_name}, {rule_name.replace('_', ' ')}", dist))
    say("")
    lowest = min(int(w) for w in grid["window"])
    for half in (tune, held):
        for name, window in (("chosen", int(chosen["window"])), ("library defaults", int(defaults["window"]))):
            n, marked = out_of_reach(half, window)
            say(f"{half.name}, {name}: {n} of {marked} runs have 1.25 L98 before the rule's first possible stop")
        n, marked = out_of_reach(half, lowest)
        say(f"{half.name}, any setting of the grid (window {lowest}): {n} of {marked} runs out of reach")
    say("")
    say("Replay checked against auto_heldout.stop_runs (stop_recommendation on the predictions) for both rules on")
    say("both halves: identical.")

    args.out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    fields = [*KNOBS, "runs", "stopped", *VERDICTS, "ratio_min", "ratio_median", "ratio_max"]
    grid_writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    grid_writer.writeheader()
    grid_writer.writerows(rows)
    (args.out / "tune_grid.csv").write_text(_header(command) + buf.getvalue())
    buf = io.StringIO()
    run_fields = ["dataset", "strategy", "seed", "metric", "L95", "L98", "last"]
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*run_fields, "stop_chosen", "verdict_chosen", "stop_defaults", "verdict_defaults"])
    for a, b in zip(held_chosen, held_defaults, strict=True):
        writer.writerow([*(a[f] for f in run_fields), a["stop"], a["verdict"], b["stop"], b["verdict"]])
    (args.out / "heldout_runs.csv").write_text(_header(command) + buf.getvalue())
    choice = {
        "command": command,
        "rule": "on the tune half only: fewest early, then most ok, then fewest late; ties: highest threshold, "
        "longest window, most slope_points, smallest min_gain",
        "grid": grid,
        "chosen": chosen,
        "library_defaults": defaults,
        "tune": {"chosen": totals(tune_chosen), "library_defaults": totals(tune_defaults)},
        "heldout": {"chosen": totals(held_chosen), "library_defaults": totals(held_defaults)},
        "distribution": dists,
        "out_of_reach": {
            half.name: {
                "chosen": out_of_reach(half, int(chosen["window"])),
                "library_defaults": out_of_reach(half, int(defaults["window"])),
                "any_setting": out_of_reach(half, lowest),
            }
            for half in (tune, held)
        },
    }
    (args.out / "choice.json").write_text(json.dumps(choice, indent=1) + "\n")
    (args.out / "summary.txt").write_text("\n".join(printed) + "\n")
    return choice


if __name__ == "__main__":
    main()

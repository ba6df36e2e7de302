"""What ``auto`` adds to a batch's wall time (issue 28: "at most 10 % at n = 10^5").

    python bench/auto_cost.py                        # n = 10^5, d = 128, k = 10, B = 100, float64: every case
    python bench/auto_cost.py --cases bait,margin --repeat 5
    python bench/auto_cost.py --smoke                # n = 3,000, d = 16, k = 10, B = 10: seconds
    python bench/auto_cost.py --json auto_cost.json  # also write the results

Each case is one library call ``selection.select("auto", ..., history=H)`` for a history ``H`` in which one arm
gained most, with a batch seed whose draw plays that arm this round, against that arm called directly
(``selection.select(arm, ...)``) on the same inputs, in the same process, interleaved (the order rotates every
repeat, after one untimed call of each), min and median over ``--repeat`` calls:

- ``bait round``, ``margin round``, ``random round``: the library's defaults. The history carries validation
  scores, so the evidence is validation gains and ``auto`` draws no uniform picks (``explore_validated = 0``): the
  arm fills the batch;
- ``margin, explore 0.1``: ``E = round(0.1 B)`` uniform picks, the share a round without validation scores gets
  (``explore``'s default), the arm the other ``B - E`` slots;
- ``margin, explore 0.5``: half the batch drawn uniformly;
- ``badge round`` (only with ``--cases``): slow at this size.

A case repeats at least ``--repeat`` times, and more (up to 500) until ``auto``'s timed calls add up to
``--min-time`` seconds: the cheap arms take milliseconds at this size, where one call's noise is of the order of
the difference measured. The ``calls`` column says how many each variant had.

Two overheads per case: **vs fixed B** (``auto`` against the fixed strategy with the batch's size ``B``: what the
issue's 10 % is about; negative when the arm's ``B - E`` picks cost less than ``B``) and **vs arm at B-E** (``auto``
against the arm called with the ``B - E`` slots it fills inside ``auto``: ``auto``'s own work, the bandit over the
history, the exploration draw, the round's record, and its outlier check).

``auto`` keeps every candidate by default; with ``exclude_outliers=True`` it leaves the candidates the robust
outlier rule flags out first (the rule's statistics on a 5,000-row sample and one pass over the pool). Two more
variants price that: **auto + pool check** (``exclude_outliers=True``) and **fixed + picks check** (the fixed
strategy, then :func:`selection.outliers.robust_outliers` on its ``B`` picks: what the service runs after every
batch's selection, ``auto``'s included). **vs fixed + check** compares ``auto`` (no check) with that.
``--corrupt K`` multiplies ``K`` candidate rows by 10^3, so the check flags them (and, on a bait round, ``auto``
copies the pool without them).

The history is what a library caller keeps (docs/auto-and-stopping.md): ``--rounds`` earlier rounds of ``B``
picks each (rows labeled since, ``arms`` per pick with the exploration picks marked ``random``, labels drawn from
the head's probabilities, the predictions at selection time, the validation accuracy and label count of each
round's model, and the bandit's probabilities of that round). The arm favoured gained 3 points of validation
accuracy per 100 labels in the rounds it played, the others 0.2 (after a few rounds EXP3.P's probabilities have
moved little from uniform); the batch seed is the first whose draw plays that arm (found on a 200-row stand-in:
the draw reads the history and the seed only).

Data as ``bench/selection_speed.py``'s: embeddings with a decaying spectrum (``0.97^j``), class probabilities the
softmax of a random linear model (a head's output); ``--dtype`` is the arrays' dtype, which the library keeps.
The service path (the history read from the pool's earlier batches) is not timed here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import selection  # noqa: E402
from bench.selection_speed import machine_lines  # noqa: E402
from selection.auto import WARM_ARMS, bandit, check_history  # noqa: E402
from selection.outliers import robust_outliers  # noqa: E402

LIMIT_PCT = 10.0  # the figure
MAX_REPEAT = 500
FAVOURED_GAIN, OTHER_GAIN = 3.0, 0.2  # points of validation accuracy per 100 labels


@dataclass
class Case:
    """One case: the arm the history favours (this round plays it) and ``auto``'s uniform share in this round,
    which is in validation mode (``explore_validated``; None: the library's default, no uniform picks)."""

    name: str
    arm: str
    explore: float | None = None
    default: bool = True


CASES = [
    Case("bait round", "bait"),
    Case("margin round", "margin"),
    Case("random round", "random"),
    Case("margin, explore 0.1", "margin", explore=0.1),
    Case("margin, explore 0.5", "margin", explore=0.5),
    Case("badge round", "badge", default=False),
]


@dataclass
class Result:
    case: str
    arm: str
    explore_picks: int
    seed: int
    auto_s: list[float] = field(default_factory=list)
    fixed_s: list[float] = field(default_factory=list)
    arm_s: list[float] = field(default_factory=list)  # the arm at B - E (empty when E = 0: fixed is that call)
    nocheck_s: list[float] = field(default_factory=list)  # auto with exclude_outliers=True (the pool check)
    checked_s: list[float] = field(default_factory=list)  # the fixed strategy, then the rule on its picks
    excluded: int = 0  # candidates auto's check (exclude_outliers=True) left out
    load: float = 0.0

    def pct(self, base: list[float], how: Callable[[list[float]], float]) -> float | None:
        return None if not base else 100.0 * (how(self.auto_s) / how(base) - 1.0)


def make_data(n: int, d: int, k: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n x d`` embeddings with a decaying spectrum and the softmax of a random linear model (``n x k``)."""
    gen = torch.Generator().manual_seed(seed)
    scale = 0.97 ** torch.arange(d, dtype=torch.float64)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * scale
    w = torch.randn(d, k, generator=gen, dtype=torch.float64) * (3.0 / math.sqrt(d))
    return x.to(dtype), torch.softmax(x @ w, dim=1).to(dtype)


def make_history(
    favoured: str, probs: np.ndarray, rounds: int, batch: int, first: int, rng: np.random.Generator
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """``rounds`` earlier rounds as a library caller keeps them (see the module), the favoured arm played in every
    other round from the first; their picks are rows ``first, first + 1, ...`` (labeled since). The rows picked."""
    arms = WARM_ARMS["classification"]
    others = [a for a in arms if a != favoured]
    history: list[dict[str, Any]] = []
    n_labels, accuracy = first, 0.6
    rows = np.arange(first, first + rounds * batch, dtype=np.int64)
    for t in range(rounds):
        arm = favoured if t % 2 == 0 else others[(t // 2) % len(others)]
        q, _ = bandit(check_history(history), arms, 0.2, "classification")
        n_explore = 0 if arm == "random" else round(0.1 * batch)
        picks = rows[t * batch : (t + 1) * batch]
        p = probs[picks]
        labels = [int(rng.choice(p.shape[1], p=row / row.sum())) for row in p]
        history.append(
            {
                "arm": arm,
                "arms": [arm] * (batch - n_explore) + ["random"] * n_explore,
                "picks": picks.tolist(),
                "labels": labels,
                "predictions": p.argmax(axis=1).tolist(),
                "probabilities": q,
                "validation": accuracy,
                "n_labels": n_labels,
            }
        )
        gain = FAVOURED_GAIN if arm == favoured else OTHER_GAIN  # the next model's gain from this round's labels
        accuracy = min(0.99, accuracy + gain / 100 * batch / 100)
        n_labels += batch
    return history, rows


def seed_for(case: Case, history: list[dict[str, Any]], k: int, batch: int) -> int:
    """The first batch seed whose draw plays ``case.arm`` (on a 200-row stand-in: the draw reads the history, the
    arms in play and the seed only)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(200, 4, generator=gen, dtype=torch.float64)
    p = torch.softmax(torch.randn(200, k, generator=gen, dtype=torch.float64), dim=1)
    for seed in range(1000):
        res = selection.select(
            "auto",
            embeddings=x,
            probs=p,
            labeled=np.arange(2 * k),
            batch_size=min(batch, 10),
            seed=seed,
            history=history,
            cold=False,
        )
        if res.diagnostics["auto"]["arm"] == case.arm:
            return seed
    raise RuntimeError(f"no seed below 1000 plays {case.arm!r} with this history")


def run_case(
    case: Case, x: torch.Tensor, probs: torch.Tensor, args: argparse.Namespace, rng: np.random.Generator
) -> Result:
    first = args.labeled
    history, rows = make_history(case.arm, probs.numpy(), args.rounds, args.batch, first, rng)
    labeled = np.concatenate([np.arange(first, dtype=np.int64), rows])
    seed = seed_for(case, history, args.k, args.batch)
    common: dict[str, Any] = {"embeddings": x, "probs": probs, "labeled": labeled, "seed": seed}

    def auto(**extra: Any) -> Any:
        share: dict[str, Any] = {} if case.explore is None else {"explore_validated": case.explore}
        return selection.select("auto", batch_size=args.batch, history=history, **share, **common, **extra)

    def checked() -> Any:
        res = selection.select(case.arm, batch_size=args.batch, **common)
        return robust_outliers(x, res.indices, seed=seed)

    check = auto(exclude_outliers=True)
    info = check.diagnostics["auto"]
    if info["arm"] != case.arm or info["cold"]:
        raise RuntimeError(f"{case.name}: auto played {info['arm']!r} (cold {info['cold']}), not {case.arm!r}")
    n_explore = int(info["explore"])
    variants: list[tuple[str, Callable[[], Any]]] = [
        ("auto", auto),
        ("fixed", lambda: selection.select(case.arm, batch_size=args.batch, **common)),
        ("nocheck", lambda: auto(exclude_outliers=True)),
        ("checked", checked),
    ]
    if n_explore:
        variants.append(("arm", lambda: selection.select(case.arm, batch_size=args.batch - n_explore, **common)))
    for _, call in variants:  # one untimed call of each
        call()
    res = Result(case.name, case.arm, n_explore, seed, excluded=int(info["outliers"]["n_excluded"]))
    times = {"auto": res.auto_s, "fixed": res.fixed_s, "arm": res.arm_s, "nocheck": res.nocheck_s}
    times["checked"] = res.checked_s
    rep = 0  # at least --repeat rounds, more (up to MAX_REPEAT) until auto's calls add up to --min-time
    while rep < args.repeat or (sum(res.auto_s) < args.min_time and rep < MAX_REPEAT):
        for name, call in variants[rep % len(variants) :] + variants[: rep % len(variants)]:
            t = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t)
        rep += 1
    res.load = os.getloadavg()[0]
    print(f"done {case.name}: auto {min(res.auto_s):.3f} s, {case.arm} {min(res.fixed_s):.3f} s", flush=True)
    return res


def _fmt_s(values: list[float]) -> str:
    return "-" if not values else f"{min(values):.4g} / {statistics.median(values):.4g}"


def _fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def format_table(results: list[Result]) -> str:
    head = [
        "case",
        "arm",
        "E",
        "excluded",
        "auto s (min / median)",
        "fixed B s (min / median)",
        "vs fixed B % (min, median)",
        "arm at B-E s (min / median)",
        "vs arm at B-E % (min, median)",
        "auto + pool check s (min / median)",
        "fixed + picks check s (min / median)",
        "vs fixed + check % (min, median)",
        "calls",
        "load",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in results:
        cells = [
            r.case,
            r.arm,
            str(r.explore_picks),
            str(r.excluded),
            _fmt_s(r.auto_s),
            _fmt_s(r.fixed_s),
            f"{_fmt_pct(r.pct(r.fixed_s, min))}, {_fmt_pct(r.pct(r.fixed_s, statistics.median))}",
            _fmt_s(r.arm_s),
            "-" if not r.arm_s else f"{_fmt_pct(r.pct(r.arm_s, min))}, {_fmt_pct(r.pct(r.arm_s, statistics.median))}",
            _fmt_s(r.nocheck_s),
            _fmt_s(r.checked_s),
            f"{_fmt_pct(r.pct(r.checked_s, min))}, {_fmt_pct(r.pct(r.checked_s, statistics.median))}",
            str(len(r.auto_s)),
            f"{r.load:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="n = 3,000, d = 16, B = 10, 2 repeats: seconds")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--batch", type=int, default=100, help="B")
    ap.add_argument("--labeled", type=int, default=200, help="labeled rows before the history's rounds")
    ap.add_argument("--rounds", type=int, default=4, help="earlier rounds in the history")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    ap.add_argument("--cases", default=None, help="comma-separated arms or case names (default: every default case)")
    ap.add_argument("--repeat", type=int, default=3, help="timed calls of each variant, at least")
    ap.add_argument(
        "--min-time",
        type=float,
        default=2.0,
        help="repeat a case (up to 500 times) until auto's timed calls add up to this many seconds: the cheap arms "
        "take milliseconds",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--seed", type=int, default=0, help="seed of the data and the history's labels")
    ap.add_argument(
        "--corrupt", type=int, default=0, help="candidate rows multiplied by 10^3 (flagged by the outlier check)"
    )
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.d, args.batch, args.labeled, args.repeat, args.min_time = 3_000, 16, 10, 40, 2, 0.1
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = [c for c in CASES if c.name in wanted or c.arm in wanted]
        unknown = wanted - {c.name for c in cases} - {c.arm for c in cases}
        if unknown:
            ap.error(f"unknown cases {sorted(unknown)}; cases: {', '.join(c.name for c in CASES)}")
    else:
        cases = [c for c in CASES if c.default]

    torch.set_num_threads(args.threads)
    for line in machine_lines("cpu", args.threads):
        print(line)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    print(
        f"pool: n = {args.n:,}, d = {args.d}, k = {args.k}, B = {args.batch}, {args.dtype} "
        f"(the library keeps the input's dtype), {args.labeled} + {args.rounds} x {args.batch} labeled; "
        f"at least {args.repeat} timed call(s) of each variant (more until auto's add up to {args.min_time:g} s), "
        "interleaved"
    )
    print("timings are wall-clock on a possibly shared machine: expect noise\n", flush=True)
    x, probs = make_data(args.n, args.d, args.k, dtype, args.seed)
    if args.corrupt:  # rows past the labeled ones and the history's picks: candidates
        start = args.labeled + args.rounds * args.batch
        x[start : start + args.corrupt] *= 1e3
    rng = np.random.default_rng(args.seed)
    with torch.no_grad():
        results = [run_case(c, x, probs, args, rng) for c in cases]
    print()
    print(format_table(results))
    worst = max((r.pct(r.fixed_s, min) or 0.0) for r in results)
    served = max((r.pct(r.checked_s, min) or 0.0) for r in results)
    print(
        f"\nauto adds at most {LIMIT_PCT:g} % to the fixed strategy's time (min over repeats) on every case: "
        f"{'yes' if worst <= LIMIT_PCT else 'no'} (largest: {worst:+.1f} %, n = {args.n:,}); against the fixed "
        f"strategy with the service's picks check: {'yes' if served <= LIMIT_PCT else 'no'} (largest: {served:+.1f} %)"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": [asdict(r) for r in results]}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

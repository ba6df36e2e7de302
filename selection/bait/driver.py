"""The driver: BAIT's strategies (:func:`bait`, :func:`bait_nofisher`, :func:`logdet_fisher`) on a pool.

A call validates its parameters, asks the plan (:mod:`selection.bait.plan`) what to run, pre-filters the
pool if the plan says so (then maps the picks back to pool rows and scores the set over the whole pool),
projects the embeddings (PCA) or approximates the classes, runs the engine (:mod:`selection.bait.engine`:
setup, forward, backward) under the auto plan's guard, and reports the objective and diagnostics.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from selection.bait.approx import Prefilter, parse_prefilter, prefilter_candidates, rest_mass
from selection.bait.engine import Mode, _Bait, _Guard, _now, _State
from selection.bait.plan import (
    _GB,
    DEFAULT_TIME_BUDGET_S,
    GUARD_FACTOR,
    _check_approx,
    _choose_matrix_dtype,
    _objective_seconds,
    _Plan,
    _plan,
    check_memory_budget,
    check_time_budget,
    estimate_bytes,
)
from selection.bait.threads import resolve_threads
from selection.calibrate import factors, machine_rates, observe
from selection.errors import InputDataError, ParameterError
from selection.fisher import exact_objective, fisher_pca_basis, reduced_rank
from selection.problem import Problem, StrategyOutput, register

Tensor = torch.Tensor

#: Values of ``convention``: the weights of labeled/reserved and picked rows in ``M`` (:func:`design_weights`).
CONVENTIONS = ("reference", "paper", "sum")
#: Default ridge of BAIT's ``M`` (``bait`` and ``bait_nofisher``). With the ``reference`` weights
#: the design terms are averages of ``I(x)``, so ``lam`` competes with them directly; experiment 5
#: (docs/results/conventions/) found ``0.01`` better than ``1`` with the reference convention on
#: linear and MLP heads, and ``lam = 1`` made BAIT worse than random on MNIST regression with an MLP
#: (hidden features of small norm: ``lam I`` swamps ``M`` and BAIT chases the top principal directions).
DEFAULT_LAM = 0.01


def design_weights(convention: str, n_design: int, batch_size: int) -> tuple[float, float]:
    """``(w_L, w_S)``: weights of labeled/reserved rows and of picked rows in ``M``.

    Args:
        convention: ``"reference"``, ``"paper"`` or ``"sum"``.
        n_design: number of labeled + reserved rows.
        batch_size: ``B``.

    Returns:
        The two weights.

    Raises:
        ParameterError: unknown convention.
    """
    if convention == "reference":
        total = n_design + batch_size
        return 1.0 / total, batch_size / total
    if convention == "paper":
        return (1.0 / n_design if n_design > 0 else 0.0), 1.0
    if convention == "sum":
        return 1.0, 1.0
    raise ParameterError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")


def _check_lam(lam: float) -> float:
    if isinstance(lam, bool) or not isinstance(lam, int | float) or not math.isfinite(lam) or lam <= 0:
        raise ParameterError(f"lam must be a finite number > 0, got {lam!r}")
    return float(lam)


def _check_oversample(oversample: float) -> float:
    ok = isinstance(oversample, int | float) and not isinstance(oversample, bool)
    if not ok or not math.isfinite(oversample) or oversample < 1:
        raise ParameterError(f"oversample must be a number >= 1, got {oversample!r}")
    return float(oversample)


def _check_fisher_weights(weights: Any, problem: Problem) -> Tensor | None:
    if weights is None:
        return None
    try:
        if isinstance(weights, torch.Tensor):
            w = weights.detach().to(device=problem.device, dtype=torch.float64)
        else:
            w = torch.as_tensor(np.asarray(weights, dtype=np.float64)).to(problem.device)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"fisher_weights must be a numeric array of length n: {exc}") from exc
    if w.ndim != 1 or w.shape[0] != problem.n:
        raise ParameterError(f"fisher_weights must have shape ({problem.n},), got {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ParameterError("fisher_weights must be finite, nonnegative and not all zero")
    return w / w.sum()


# --------------------------------------------------------------------------------------------------
# Memory


# --------------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------------


def _prefiltered(problem: Problem, pf: Prefilter, weights: Tensor | None) -> tuple[Problem, Tensor, Tensor, int]:
    """The sub-problem of design rows plus kept candidates, its stratified Fisher weights and row map."""
    top_rows, rand_rows, w_rand = prefilter_candidates(
        problem.X,
        problem.probs,
        problem.candidates,
        pf,
        seed=problem.seed,
        chunk_size=problem.chunk_size,
        row_ids=problem.row_ids,
    )
    design = problem.in_design
    keep = torch.sort(torch.cat([top_rows, rand_rows])).values
    rows = torch.sort(torch.cat([design, keep])).values
    w = torch.ones(rows.numel(), dtype=torch.float64, device=problem.device)
    w[torch.searchsorted(rows, rand_rows)] = w_rand
    if weights is not None:
        w = w * weights[rows]
    sub = Problem(
        X=problem.X[rows],
        probs=None if problem.probs is None else problem.probs[rows],
        labeled=torch.searchsorted(rows, problem.labeled),
        reserved=torch.searchsorted(rows, problem.reserved),
        candidates=torch.searchsorted(rows, keep),
        batch_size=problem.batch_size,
        task=problem.task,
        seed=problem.seed,
        chunk_size=problem.chunk_size,
        progress=problem.progress,
        row_ids=None if problem.row_ids is None else problem.row_ids[rows.cpu().numpy()],
    )
    return sub, w / w.sum(), rows, int(top_rows.numel())


def _run(
    problem: Problem,
    *,
    mode: Mode,
    lam: float,
    oversample: float,
    convention: str,
    approx: str | None,
    approx_dim: int | None,
    fisher_weights: Any,
    max_memory_gb: float,
    backward: bool,
    approx_classes: int | None = None,
    prefilter: Any = None,
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
    approx_samples: int | None = None,
) -> StrategyOutput:
    """Validate, plan, pre-filter if planned, run :func:`_run_core`, and map a pre-filtered run back.

    Args: those of :func:`bait` (``problem.X`` ``(n, d)``, ``fisher_weights`` ``(n,)`` or ``None``), plus
    ``mode`` (what the engine optimises) and ``backward`` (prune the forward picks to ``B``).
    """
    t_start = time.perf_counter()
    lam = _check_lam(lam)
    oversample = _check_oversample(oversample)
    budget = check_memory_budget(max_memory_gb)
    time_budget = check_time_budget(time_budget_s)
    kind = _check_approx(approx, approx_dim, approx_classes, problem, approx_samples)
    # The auto plan's promise: the call returns within 1.5x time_budget_s (the guard stops the greedy
    # passes at GUARD_FACTOR x; forced plans run as asked).
    guard = _Guard(deadline=_now() + GUARD_FACTOR * time_budget if kind == "auto" else None)
    pf_spec = parse_prefilter(prefilter, regression=problem.probs is None)
    if convention not in CONVENTIONS:
        raise ParameterError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")
    weights = _check_fisher_weights(fisher_weights, problem)
    if problem.probs is not None and problem.probs.shape[1] < 2:
        raise InputDataError("classification needs at least 2 classes")
    if problem.dtype not in (torch.float32, torch.float64):
        raise InputDataError(f"BAIT needs float32 or float64 embeddings, got {problem.dtype}")

    calibration_s = 0.0
    if kind == "auto":
        time_budget_plan, calibration_s = _budget_after_rates(problem, time_budget, guard)
    else:
        time_budget_plan = time_budget
    with torch.no_grad():
        plan = _plan(
            problem,
            kind=kind,
            approx_dim=approx_dim,
            approx_classes=approx_classes,
            prefilter=pf_spec,
            mode=mode,
            oversample=oversample,
            backward=backward,
            budget_gb=budget,
            time_budget_s=time_budget_plan,
            lam=lam,
            approx_samples=approx_samples,
        )
        t_plan = time.perf_counter()
        work, work_weights, rows_map, n_top = problem, weights, None, 0
        if plan.prefilter is not None:
            work, work_weights, rows_map, n_top = _prefiltered(problem, plan.prefilter, weights)
        out = _run_core(
            work,
            mode=mode,
            lam=lam,
            oversample=oversample,
            convention=convention,
            plan=plan,
            weights=work_weights,
            budget=budget,
            backward=backward,
            guard=guard,
            # Auto plans compute the exact objective of an approximate set only where the plan said it fits;
            # a pre-filtered run computes it below, over the whole pool.
            exact_objective_ok=(plan.objective or kind != "auto") and rows_map is None,
        )
    diag = out.diagnostics
    approx_info = plan.describe()
    approx_info["requested"] = kind
    if kind == "auto":
        threads = resolve_threads(problem.device)
        approx_info["rates"] = {
            **machine_rates(problem.device, problem.dtype, threads).describe(),
            "factors": factors(problem.device, problem.dtype, threads),  # in force for this plan
        }
        approx_info["calibration_seconds"] = float(f"{calibration_s:.3g}")
        # What the call is expected to take in all: the time spent before the run (calibration, planning)
        # plus the plan's estimate of the run.
        approx_info["estimated_call_seconds"] = float(f"{t_plan - t_start + plan.estimated_s:.3g}")
        approx_info["planned_budget_seconds"] = float(f"{time_budget_plan:.3g}")
        _observe_timings(problem, plan, diag)
    diag["approximation"] = approx_info
    diag["timings"]["plan"] = t_plan - t_start
    if rows_map is None:
        return out
    n_kept = int(work.candidates.numel())
    return _map_prefiltered(
        problem,
        out,
        rows_map,
        n_top,
        n_kept,
        mode=mode,
        lam=lam,
        convention=convention,
        weights=weights,
        budget=budget,
        time_budget=time_budget,
        guard=guard,
        t_start=t_start,
    )


#: Seconds the auto plan keeps aside for its own work (the gap model's subsamples, the pre-filter's
#: scores) and the return, on top of what the call has spent before planning: PLAN_RESERVE_S, or
#: PLAN_RESERVE_FRACTION of the budget when that is less.
PLAN_RESERVE_S = 0.05
PLAN_RESERVE_FRACTION = 0.05


def _budget_after_rates(problem: Problem, time_budget: float, guard: _Guard) -> tuple[float, float]:
    """Rates of this machine (measured on a process's first call, bounded by the budget: see
    selection/calibrate.py), then ``(seconds left for the plan's estimate, seconds the rates took)``.

    Everything the call spent so far (validation, the measurement, the compiled kernel's first load)
    counts against ``time_budget``.
    """
    t0 = _now()
    machine_rates(problem.device, problem.dtype, resolve_threads(problem.device), budget_s=time_budget)
    now = _now()
    start = (guard.deadline or now) - GUARD_FACTOR * time_budget
    reserve = min(PLAN_RESERVE_S, PLAN_RESERVE_FRACTION * time_budget)
    return max(1e-3, time_budget - (now - start) - reserve), now - t0


def _observe_timings(problem: Problem, plan: _Plan, diag: dict[str, Any]) -> None:
    """Fold the measured setup (and greedy passes, when the guard did not cut them) into the rates."""
    timings = diag.get("timings", {})
    device, dtype, threads = problem.device, problem.dtype, resolve_threads(problem.device)
    if "setup" in timings:
        observe(
            device,
            dtype,
            threads,
            phase="setup",
            estimated=plan.estimated_setup_s,
            measured=timings["setup"],
            kind=plan.step_kind,
        )
    if "deadline" not in diag and "forward" in timings:
        greedy = timings["forward"] + timings.get("backward", 0.0)
        kind = plan.step_kind
        observe(device, dtype, threads, phase="greedy", estimated=plan.estimated_greedy_s, measured=greedy, kind=kind)


def _map_prefiltered(
    problem: Problem,
    out: StrategyOutput,
    rows_map: Tensor,
    n_top: int,
    n_kept: int,
    *,
    mode: Mode,
    lam: float,
    convention: str,
    weights: Tensor | None,
    budget: float,
    time_budget: float,
    guard: _Guard,
    t_start: float,
) -> StrategyOutput:
    """A pre-filtered run's picks as pool rows, and its set's exact objective over the whole pool.

    Args:
        problem: the whole pool (``X`` ``(n, d)``).
        out: the run on the sub-problem of design rows plus ``n_kept`` kept candidates.
        rows_map: ``(n_sub,)`` pool row of each sub-problem row.
        n_top: candidates kept by score (the rest were drawn at random).
        n_kept: candidates kept.
        weights: ``(n,)`` normalised Fisher weights of the pool, or ``None``.
    """
    diag = out.diagnostics
    approx_info = diag["approximation"]
    # Map back to pool rows; the objective so far used the stratified estimate of F.
    indices = rows_map[torch.as_tensor(out.indices, device=problem.device)].cpu().numpy().astype(np.int64)
    if "forward_indices" in diag:
        diag["forward_indices"] = rows_map[torch.as_tensor(diag["forward_indices"])].cpu().tolist()
    approx_info["prefilter"]["kept_top"] = n_top
    approx_info["prefilter"]["kept_random"] = n_kept - n_top
    approx_info["prefilter"]["random_drawn_by"] = "position" if problem.row_ids is None else "row_ids"
    objective = out.objective
    if mode != "logdet" and objective is not None:
        diag["prefiltered_objective"] = objective
        diag["objective_kind"] = "prefiltered"
        r = reduced_rank(problem.probs)
        big_d = r * problem.d
        allowed = min(0.25 * time_budget, guard.left())
        if 3 * big_d * big_d * 8 <= budget * _GB and _objective_seconds(problem, r, mode, within=allowed) <= allowed:
            objective = _exact_objective(
                problem, torch.as_tensor(indices, device=problem.device), mode, lam, convention, weights
            )
            diag["exact_objective"] = objective
            diag["objective_kind"] = "exact"
    diag["timings"]["total"] = time.perf_counter() - t_start
    return StrategyOutput(indices=indices, objective=objective, diagnostics=diag)


def _exact_objective(
    problem: Problem, rows: Tensor, mode: Mode, lam: float, convention: str, weights: Tensor | None
) -> float:
    """``tr(M^{-1} F)`` (``F = I`` in identity mode) of the picks ``rows`` (``(B,)`` pool rows) over the whole
    pool, float64, in the full ``k d`` space (:func:`selection.fisher.exact_objective`)."""
    n_design = int(problem.in_design.numel())
    w_design, w_picked = design_weights(convention, n_design, problem.batch_size)
    with torch.no_grad():
        return exact_objective(
            problem.X,
            problem.probs,
            problem.in_design,
            rows,
            lam=lam,
            w_design=w_design,
            w_picked=w_picked,
            fisher_weights=weights,
            identity_fisher=mode == "identity",
            chunk_size=problem.chunk_size,
        )


@dataclass
class _Passes:
    """What the engine's passes returned: the state, forward picks and gains, kept picks, and times."""

    state: _State
    picks: list[int]  # candidate positions, forward order
    gains: list[float]
    kept: list[int]  # the picks kept after the backward pass, forward order
    t_setup: float
    t_fwd: float
    t_bwd: float


def _run_core(
    problem: Problem,
    *,
    mode: Mode,
    lam: float,
    oversample: float,
    convention: str,
    plan: _Plan,
    weights: Tensor | None,
    budget: float,
    backward: bool,
    guard: _Guard | None = None,
    exact_objective_ok: bool = True,
) -> StrategyOutput:
    """Run ``plan`` on ``problem`` (already pre-filtered if the plan says so): project, engine, objective.

    Args:
        problem: the pool (``X`` ``(n, d)``, ``probs`` ``(n, k)`` or ``None``).
        weights: ``(n,)`` normalised Fisher weights, or ``None`` (the plain mean).
        exact_objective_ok: compute the exact objective of an approximate set when it fits.

    Returns:
        Kept picks as pool rows (forward order), the objective, and the diagnostics.
    """
    t_start = time.perf_counter()
    guard = guard or _Guard()
    if plan.oversample is not None:
        oversample = plan.oversample
    r = reduced_rank(problem.probs)
    n_threads = resolve_threads(problem.device)
    b = problem.batch_size
    n_cand = int(problem.candidates.numel())
    n_design = int(problem.in_design.numel())
    w_design, w_picked = design_weights(convention, n_design, b)
    n_forward = b if not backward else min(n_cand, max(b, math.floor(oversample * b + 1e-9)))
    approximate = plan.dim is not None or plan.classes is not None

    diag: dict[str, Any] = {
        "device": str(problem.device),
        "dtype": str(problem.dtype).replace("torch.", ""),
        "torch_threads": torch.get_num_threads(),
        "threads": n_threads,
        "lam": lam,
        "convention": convention,
        "w_labeled": w_design,
        "w_selected": w_picked,
    }

    rc = r if plan.classes is None else plan.classes + plan.samples
    with torch.no_grad():
        x, x_dim = _approximated(problem, plan, weights, diag)
        mdt = _choose_matrix_dtype(problem, x_dim, r, mode, budget, rc=rc)
        diag["D"] = r * x_dim
        diag["matrix_dtype"] = str(mdt).replace("torch.", "")
        engine = _Bait(
            problem,
            x,
            lam=lam,
            w_design=w_design,
            w_picked=w_picked,
            mode=mode,
            fisher_weights=weights,
            matrix_dtype=mdt,
            n_threads=n_threads,
            classes=plan.classes,
            samples=plan.samples,
        )
        passes = _passes(engine, n_forward, b, backward, guard)

    state, picks, gains, kept = passes.state, passes.picks, passes.gains, passes.kept
    rows = problem.candidates[torch.tensor(kept, dtype=torch.long, device=problem.device)]
    indices = rows.cpu().numpy().astype(np.int64)
    diag["timings"] = {
        "setup": passes.t_setup - t_start,
        "forward": passes.t_fwd - passes.t_setup,
        "backward": passes.t_bwd - passes.t_fwd,
    }
    diag["steps"] = {"forward": len(gains), "backward": len(picks) - len(kept)}
    if guard.events:
        diag["deadline"] = dict(guard.events)
    diag["p0_method"] = state.info.get("p0")
    diag["pq_updates"] = state.info.get("pq_updates", "in place")
    if backward:
        fwd_rows = problem.candidates[torch.tensor(picks, dtype=torch.long, device=problem.device)]
        diag["forward_indices"] = fwd_rows.cpu().tolist()

    objective: float | None
    if mode == "logdet":
        null = problem.d * math.log(lam) if problem.probs is not None else 0.0
        diag["logdet"] = state.value + null
        diag["logdet_gain"] = float(sum(gains))
        diag["forward_gains"] = gains
        objective = None
        if approximate:
            diag["objective_kind"] = "approximate"
    else:
        objective = state.value
        if mode == "identity" and problem.probs is not None:
            objective += x_dim / lam  # softmax null direction of the (projected) parameter space
        cut = any(key in guard.events for key in ("filled", "removed_at_once", "backward_skipped"))
        if approximate or cut:
            objective = _approximate_objective(
                problem, rows, objective, cut, mode, lam, convention, weights, budget, guard, exact_objective_ok, diag
            )
        diag["forward_gains"] = gains
    diag["timings"]["total"] = time.perf_counter() - t_start
    return StrategyOutput(indices=indices, objective=objective, diagnostics=diag)


def _approximated(problem: Problem, plan: _Plan, weights: Tensor | None, diag: dict[str, Any]) -> tuple[Tensor, int]:
    """The embeddings the engine sees, ``(n, d')`` (PCA-projected to ``d' = plan.dim`` if planned, else
    ``problem.X``), and ``d'``; records the projection's and class approximation's diagnostics."""
    x = problem.X
    x_dim = problem.d
    if plan.dim is not None:
        basis, var_kept = fisher_pca_basis(x, problem.probs, weights, plan.dim, chunk_size=problem.chunk_size)
        x = x @ basis.to(problem.dtype)  # n x approx_dim, in the pool dtype (no float64 copy of X)
        x_dim = plan.dim
        diag["approx_dim"] = plan.dim
        diag["approx_variance_kept"] = var_kept
    if plan.classes is not None and problem.probs is not None:
        diag["approx_classes"] = plan.classes
        diag["approx_rest_mass"] = rest_mass(problem.probs[problem.candidates], plan.classes)
        if plan.samples:
            diag["approx_samples"] = plan.samples
    return x, x_dim


def _passes(engine: _Bait, n_forward: int, b: int, backward: bool, guard: _Guard) -> _Passes:
    """The engine's setup, ``n_forward`` greedy forward steps and (with ``backward``) pruning to ``b``."""
    n_backward = n_forward - b if backward else 0
    state = engine.setup(n_forward + n_backward)
    t_setup = time.perf_counter()
    picks, gains = engine.forward(state, n_forward, guard, need=b)
    t_fwd = time.perf_counter()
    if len(picks) > b and guard.past():
        # No time left to prune: the first B forward picks (the forward-only greedy's batch).
        guard.events["backward_skipped"] = len(picks) - b
        kept = picks[:b]
    elif backward and len(picks) > b:
        kept = engine.backward(state, picks, b, guard)
    else:
        kept = picks
    return _Passes(state, picks, gains, kept, t_setup, t_fwd, time.perf_counter())


def _approximate_objective(
    problem: Problem,
    rows: Tensor,
    objective: float,
    cut: bool,
    mode: Mode,
    lam: float,
    convention: str,
    weights: Tensor | None,
    budget: float,
    guard: _Guard,
    exact_objective_ok: bool,
    diag: dict[str, Any],
) -> float | None:
    """The objective to report for an approximate or deadline-cut run's set ``rows`` (``(B,)`` pool rows).

    The engine's value ``objective`` is the approximate problem's (``None`` when the guard cut the passes:
    it is then not the returned set's); the exact one replaces it when it fits the memory budget and the
    time left.
    """
    diag["approximate_objective"] = objective
    diag["objective_kind"] = "approximate"
    result: float | None = objective
    if cut:
        # The engine's value is not the returned set's (picks filled or removed without updates).
        result = None
        diag["objective_kind"] = "none: the deadline cut the greedy passes"
    r = reduced_rank(problem.probs)
    fits = estimate_bytes(n_cand=0, d=problem.d, r=r, matrix_dtype=torch.float64, state_dtype=torch.float64, mode=mode)
    if (
        fits <= budget * _GB
        and exact_objective_ok
        and _objective_seconds(problem, r, mode, within=guard.left()) <= guard.left()
    ):
        exact = _exact_objective(problem, rows, mode, lam, convention, weights)
        diag["exact_objective"] = exact
        diag["objective_kind"] = "exact"
        result = exact
    return result


# --------------------------------------------------------------------------------------------------
# The strategies
# --------------------------------------------------------------------------------------------------


@register(
    "bait",
    tasks=("classification", "regression"),
    summary="BAIT: greedy forward-backward minimisation of tr(M^-1 F) (Fisher trace), exact and structured",
)
def bait(
    problem: Problem,
    *,
    lam: float = DEFAULT_LAM,
    oversample: float = 2,
    convention: str = "reference",
    approx: str | None = None,
    approx_dim: int | None = None,
    approx_classes: int | None = None,
    approx_samples: int | None = None,
    prefilter: Any = None,
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
    fisher_weights: Any = None,
    max_memory_gb: float = 8.0,
) -> StrategyOutput:
    """BAIT selection (Ash et al. 2021, Algorithm 1), exact, without the ``n x dk x k`` tensor.

    Args:
        problem: the validated pool (``X`` is ``(n, d)``, ``probs`` ``(n, k)`` or ``None``).
        lam: ridge ``lam > 0`` of ``M`` (default :data:`DEFAULT_LAM`, chosen by experiment 5).
        oversample: the forward pass picks ``min(oversample * B, n_C)`` points (``1`` = forward only).
        convention: weights of labeled/reserved and picked rows in ``M``: ``"reference"``
            (authors' code), ``"paper"`` or ``"sum"`` (see the module docstring).
        approx: ``None``/``"auto"``: exact BAIT whenever the cost model (selection/bait/plan.py, rates
            measured on this machine by selection/calibrate.py) says it fits ``time_budget_s`` and
            ``max_memory_gb``, else the plan of smallest estimated gap that fits, built from
            pre-filtering, a PCA projection, a class approximation (top-``c``, or top-``c`` plus
            sampled pseudo-labels) and forward-only picking; a guard stops the greedy passes so the call
            returns within 1.5x ``time_budget_s`` (docs/algorithm-many-classes.md).
            ``"exact"``/``"none"``: exact, always (no automatic pre-filter, no guard); ``"pca"``:
            select on embeddings projected onto the top ``approx_dim`` eigenvectors of the
            Fisher-weighted pool second moment; ``"topc"``: each candidate's class Fisher truncated to
            its top ``approx_classes`` classes (the rest merged into one class: a PSD lower bound);
            ``"sampled"``: the top ``approx_classes`` classes plus ``approx_samples`` pseudo-labels drawn
            from the rest (an unbiased estimate of the class Fisher, rank ``c + s``);
            ``"pca+topc"``, ``"pca+sampled"``: both. The plan is ``diagnostics["approximation"]``.
        approx_dim: projected dimension for ``"pca"`` (default ``d // 4``, shrunk to fit).
        approx_classes: classes kept per candidate for ``"topc"`` (default: the fewest that leave at
            most 1 % mean probability mass outside) or ``"sampled"`` (default 12, may be 0).
        approx_samples: pseudo-labels per candidate for ``"sampled"`` (default: 16 columns in all).
        prefilter: ``None``/``"auto"`` (pre-filter only when auto planning needs to), ``"none"``/``False``,
            or ``{"top": N, "random": M, "score": "gradnorm" | "margin", "seed": s}``: run BAIT on the
            ``N`` best candidates by the score plus ``M`` drawn at random from the others, with ``F``
            estimated from the rows kept.
        time_budget_s: time budget of the auto plan (seconds): its estimate fits it, and the call
            returns within 1.5x of it (the guard completes the batch cheaply if the estimate was short).
        fisher_weights: optional ``(n,)`` nonnegative row weights; ``F`` is their weighted mean of ``I(x)``.
        max_memory_gb: budget for the ``D x D`` matrices and per-candidate state.

    Returns:
        Kept picks (pool row indices, forward order), ``tr(M^{-1}F)`` of the set, diagnostics.

    Raises:
        ParameterError: a parameter is out of range.
        MemoryBudgetError: forced exact BAIT exceeds ``max_memory_gb``, or no plan fits the budgets.
    """
    return _run(
        problem,
        mode="fisher",
        lam=lam,
        oversample=oversample,
        convention=convention,
        approx=approx,
        approx_dim=approx_dim,
        fisher_weights=fisher_weights,
        max_memory_gb=max_memory_gb,
        backward=True,
        approx_classes=approx_classes,
        approx_samples=approx_samples,
        prefilter=prefilter,
        time_budget_s=time_budget_s,
    )


@register(
    "bait_nofisher",
    tasks=("classification", "regression"),
    summary="BAIT ablation with the pool Fisher replaced by the identity: minimises tr(M^-1)",
)
def bait_nofisher(
    problem: Problem,
    *,
    lam: float = DEFAULT_LAM,
    oversample: float = 2,
    convention: str = "reference",
    approx: str | None = None,
    approx_dim: int | None = None,
    max_memory_gb: float = 8.0,
) -> StrategyOutput:
    """BAIT with ``F = I`` (the paper's "no Fisher" ablation); same passes and conventions as :func:`bait`.

    Args:
        problem: the validated pool (``X`` is ``(n, d)``, ``probs`` ``(n, k)`` or ``None``).
        lam: ridge ``lam > 0`` (default :data:`DEFAULT_LAM`, as :func:`bait`).
        oversample: forward picks ``min(oversample * B, n_C)``.
        convention: ``"reference"``, ``"paper"`` or ``"sum"``.
        approx: ``None`` or ``"pca"``.
        approx_dim: projected dimension for ``approx="pca"``.
        max_memory_gb: memory budget.

    Returns:
        Kept picks in forward order and ``tr(M^{-1})`` of the set (full ``k d`` space).

    Raises:
        ParameterError: a parameter is out of range.
        MemoryBudgetError: the exact matrices exceed ``max_memory_gb``.
    """
    return _run(
        problem,
        mode="identity",
        lam=lam,
        oversample=oversample,
        convention=convention,
        approx=approx,
        approx_dim=approx_dim,
        fisher_weights=None,
        max_memory_gb=max_memory_gb,
        backward=True,
    )


@register(
    "logdet_fisher",
    tasks=("classification",),
    summary="Greedy maximisation of log det(M) with the full pointwise Fisher (paper appendix, Alg. 3)",
)
def logdet_fisher(
    problem: Problem,
    *,
    lam: float = 1.0,
    convention: str = "sum",
    approx: str | None = None,
    approx_dim: int | None = None,
    max_memory_gb: float = 8.0,
) -> StrategyOutput:
    """Greedy ``log det`` (D-optimal) selection with ``I(x)``: each pick maximises ``log det(I + g_x)``.

    The default ``convention="sum"`` (``M = lam I + sum_{design + picked} I(x)``) matches
    ``logdet_rank1``, so the two appendix variants differ only in the embedding;
    ``convention="paper"`` scales the labeled sum by ``1/n_L`` as the appendix algorithm does.
    Forward only, ``B`` picks.

    Args:
        problem: the validated pool (``X`` is ``(n, d)``, ``probs`` ``(n, k)``).
        lam: ridge ``lam > 0``.
        convention: ``"sum"``, ``"paper"`` or ``"reference"``.
        approx: ``None`` or ``"pca"``.
        approx_dim: projected dimension for ``approx="pca"``.
        max_memory_gb: memory budget.

    Returns:
        Picks in order; ``objective`` is ``None``; ``diagnostics["logdet"]`` is ``log det M`` of the
        final set (full ``k d`` space) and ``diagnostics["logdet_gain"]`` its increase over ``M_0``.

    Raises:
        ParameterError: a parameter is out of range.
        MemoryBudgetError: the exact matrices exceed ``max_memory_gb``.
    """
    return _run(
        problem,
        mode="logdet",
        lam=lam,
        oversample=1,
        convention=convention,
        approx=approx,
        approx_dim=approx_dim,
        fisher_weights=None,
        max_memory_gb=max_memory_gb,
        backward=False,
    )

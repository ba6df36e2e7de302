"""BAIT's shard passes (selection/bait_passes.py): the tree-reduced shard Fisher sums are the whole-pool Fisher,
the merged per-shard pre-filter lists are the whole-pool pre-filter, and BAIT on the gathered rows picks what
single-process BAIT picks with the same pre-filter, for several shard layouts, in float64."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import selection
from selection.bait.approx import Prefilter, prefilter_candidates
from selection.bait_passes import (
    Kept,
    ShardScores,
    above,
    add_fisher,
    head_rows,
    item_keys,
    merge_scores,
    objective_with_fisher,
    shard_rows,
    shard_scores,
    sketch_of,
    stratum_weights,
    thresholds,
    tree_sum,
)
from selection.errors import ParameterError
from selection.fisher import exact_objective, kron_sum
from selection.heads import HeadConfig, TrainedHead, train_head

F64 = torch.float64
LAYOUTS = ([600], [150, 150, 150, 150], [1, 200, 9, 390], [70] * 9)


def _pool(n: int, d: int, k: int, duplicates: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    centres = rng.normal(0, 2.0, size=(k, d))
    y = rng.integers(0, k, size=n)
    X = centres[y] + rng.normal(0, 1.5, size=(n, d))
    if duplicates:  # rows repeated: exact ties in the pre-filter scores
        X, y = X[np.arange(n) % 50], y[np.arange(n) % 50]
    return X.astype(np.float32), y


def _head(X: np.ndarray, y: np.ndarray, labeled: np.ndarray, k: int, kind: str = "linear") -> TrainedHead:
    config = HeadConfig.from_dict(
        {
            "input_dim": X.shape[1],
            "n_outputs": k,
            "task": "classification",
            "kind": kind,
            "max_epochs": 20,
            # float64 weights: the head's forward pass of a row then agrees to ~1e-16 whatever rows share its
            # chunk (a float32 GEMM's rows can differ in the last bits between a shard's chunk and the pool's)
            "dtype": "float64",
        }
    )
    return train_head(config, X[labeled], y[labeled], device="cpu", seed=1)


def _slices(n: int, sizes: list[int]) -> list[slice]:
    out, start = [], 0
    for size in sizes:
        out.append(slice(start, min(start + size, n)))
        start += size
    assert start >= n
    return out


N, D, K = 600, 6, 4
IDS = 11 + 2 * np.arange(N, dtype=np.int64)  # item ids: ascending, not the row numbers
LABELED = np.arange(0, 60, 3)
RESERVED = np.array([1, 2, 100, 101, 399])


@pytest.fixture(scope="module")
def pool() -> tuple[np.ndarray, TrainedHead]:
    X, y = _pool(N, D, K)
    return X, _head(X, y, LABELED, K, kind="mlp")


def test_shard_fisher_sums_tree_reduce_to_the_whole_pool_fisher(pool: tuple[np.ndarray, TrainedHead]) -> None:
    X, head = pool
    whole = head_rows(head, X, dtype=F64)
    expected = kron_sum(whole.features, whole.probs, None, out_dtype=F64, chunk_size=8192).numpy()
    excluded = np.sort(IDS[np.union1d(LABELED, RESERVED)])
    pf = Prefilter(top=20, random=10)
    for sizes in LAYOUTS:
        parts = [
            shard_scores(IDS[sl], excluded, X[sl], head, pf, 3, fisher=True, dtype=F64, chunk_size=64)
            for sl in _slices(N, sizes)
        ]
        fisher = tree_sum([p.fisher for p in parts if p.fisher is not None])
        assert fisher.shape == ((K - 1) * whole.features.shape[1],) * 2
        np.testing.assert_allclose(fisher, expected, rtol=1e-10, atol=1e-10 * np.abs(expected).max())
        assert sum(p.rows for p in parts) == N and sum(p.candidates for p in parts) == N - excluded.shape[0]
    # the objective from the reduced Fisher is the whole-pool exact objective of a set
    design = torch.as_tensor(np.union1d(LABELED, RESERVED))
    picked = torch.as_tensor([5, 77, 300, 512])
    ref = exact_objective(
        whole.features, whole.probs, design, picked, lam=0.01, w_design=1 / 29, w_picked=4 / 29, chunk_size=100
    )
    got = objective_with_fisher(
        expected, N, whole.features, whole.probs, design, picked, lam=0.01, w_design=1 / 29, w_picked=4 / 29
    )
    assert got == pytest.approx(ref, rel=1e-10)
    with pytest.raises(ParameterError, match="cannot be added"):
        add_fisher(np.zeros((2, 2)), np.zeros((3, 3)))


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("score", ["gradnorm", "margin"])
def test_merged_prefilter_is_the_whole_pool_prefilter(duplicates: bool, score: str) -> None:
    X, y = _pool(N, D, K, duplicates)
    head = _head(X, y, LABELED, K)
    excluded = np.sort(IDS[np.union1d(LABELED, RESERVED)])
    pf = Prefilter(top=40, random=25, score=score)
    # written out once for the whole pool: the single-process score stratum (stable sort, ties to the lowest
    # row) and the random stratum by item key
    whole = head_rows(head, X, dtype=F64)
    cand = np.nonzero(~np.isin(IDS, excluded))[0]
    top_rows, _rand, _w = prefilter_candidates(
        whole.features,
        whole.probs,
        torch.as_tensor(cand),
        Prefilter(top=40, random=0, score=score),
        seed=0,
        chunk_size=8192,
    )
    top = IDS[top_rows.numpy()]
    rest = np.setdiff1d(IDS[cand], top)
    rand = np.sort(rest[np.lexsort((rest, item_keys(9, rest)))[:25]])
    for sizes in LAYOUTS:
        parts = [shard_scores(IDS[sl], excluded, X[sl], head, pf, 9, dtype=F64) for sl in _slices(N, sizes)]
        kept = merge_scores(parts, pf)
        assert kept.top.tolist() == top.tolist(), sizes
        assert kept.random.tolist() == rand.tolist(), sizes
        assert kept.candidates == cand.shape[0] and kept.weight == pytest.approx((cand.shape[0] - 40) / 25)
    # the prefilter's own seed overrides the batch seed; another seed draws another stratum
    other = merge_scores([shard_scores(IDS, excluded, X, head, Prefilter(40, 25, score, seed=10), 9, dtype=F64)], pf)
    assert other.top.tolist() == top.tolist() and other.random.tolist() != rand.tolist()


def test_item_keys_are_uniform_and_depend_on_seed_and_id_only() -> None:
    ids = np.arange(100_000, dtype=np.int64) * 7 + 3
    keys = item_keys(5, ids)
    assert keys.min() >= 0.0 and keys.max() < 1.0
    hist = np.histogram(keys, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(hist - 10_000) < 5 * 100)  # 5 sigma
    assert np.array_equal(item_keys(5, ids[::-1]), keys[::-1])  # a function of each id, not of its position
    assert not np.array_equal(item_keys(6, ids), keys)
    with pytest.raises(ParameterError):
        item_keys(-1, ids)


def _distributed_bait(
    X: np.ndarray, head: TrainedHead, sizes: list[int], pf: Prefilter | None, seed: int, B: int
) -> tuple[np.ndarray, Kept | None, float | None]:
    """The cluster's steps, written out in one process: shard scores and Fisher sums, the merge, the gather of
    the kept and design rows, the greedy on them; the picked item ids and the exact objective over the pool."""
    excluded = np.sort(IDS[np.union1d(LABELED, RESERVED)])
    slices = _slices(N, sizes)
    kept, fisher = None, None
    wanted = IDS
    if pf is not None:
        parts = [shard_scores(IDS[sl], excluded, X[sl], head, pf, seed, fisher=True, dtype=F64) for sl in slices]
        kept = merge_scores(parts, pf)
        fisher = tree_sum([p.fisher for p in parts if p.fisher is not None])
        wanted = np.union1d(excluded, kept.ids)
    got = [shard_rows(IDS[sl], [f"e{i}" for i in IDS[sl]], X[sl], wanted, head, dtype=F64) for sl in slices]
    ids = np.concatenate([g.ids for g in got])
    feats = np.concatenate([g.features for g in got])
    probs = np.concatenate([g.probs for g in got if g.probs is not None])
    assert np.all(np.diff(ids) > 0) and np.array_equal(ids, wanted)
    params: dict[str, object] = {}
    if kept is not None:
        params = {"prefilter": "none", "fisher_weights": stratum_weights(ids, kept)}
    labeled = np.searchsorted(ids, IDS[LABELED])
    reserved = np.searchsorted(ids, IDS[RESERVED])
    out = selection.select(
        "bait",
        embeddings=feats,
        probs=probs,
        labeled=labeled,
        reserved=reserved,
        batch_size=B,
        seed=seed,
        dtype="float64",
        approx="exact",
        **params,
    )
    objective = None
    if fisher is not None:
        design = torch.as_tensor(np.union1d(labeled, reserved))
        n_design = int(design.numel())
        objective = objective_with_fisher(
            fisher,
            N,
            torch.as_tensor(feats),
            torch.as_tensor(probs),
            design,
            torch.as_tensor(out.indices),
            lam=0.01,
            w_design=1 / (n_design + B),
            w_picked=B / (n_design + B),
        )
    return ids[out.indices], kept, objective


@pytest.mark.parametrize("sizes", LAYOUTS)
def test_cluster_bait_picks_what_single_process_bait_picks(
    pool: tuple[np.ndarray, TrainedHead], sizes: list[int]
) -> None:
    X, head = pool
    B, seed = 10, 3
    whole = head_rows(head, X, dtype=F64)

    def single(**params: object) -> selection.SelectionResult:
        return selection.select(
            "bait",
            embeddings=whole.features,
            probs=whole.probs,
            labeled=LABELED,
            reserved=RESERVED,
            batch_size=B,
            seed=seed,
            dtype="float64",
            approx="exact",
            **params,
        )

    # every candidate: the greedy sees the whole pool
    ids, kept, _ = _distributed_bait(X, head, sizes, None, seed, B)
    assert kept is None and ids.tolist() == IDS[single().indices].tolist()
    # a score stratum only: the same kept rows as the single-process pre-filter, the same picks, and the
    # exact objective over the whole pool from the reduced Fisher is the single-process exact objective
    pf = Prefilter(top=120, random=0)
    ref = single(prefilter={"top": 120, "random": 0})
    ids, kept, objective = _distributed_bait(X, head, sizes, pf, seed, B)
    assert kept is not None and kept.top.shape[0] == 120 and kept.random.shape[0] == 0
    assert ids.tolist() == IDS[ref.indices].tolist()
    assert ref.diagnostics["objective_kind"] == "exact"
    assert objective == pytest.approx(ref.objective, rel=1e-9)
    # with a random stratum (drawn by item id): the same picks as BAIT on the same rows with the single-process
    # stratified Fisher weights, whatever the layout
    pf = Prefilter(top=80, random=60)
    ids, kept, objective = _distributed_bait(X, head, sizes, pf, seed, B)
    assert kept is not None and kept.random.shape[0] == 60
    rows = np.searchsorted(IDS, np.union1d(IDS[np.union1d(LABELED, RESERVED)], kept.ids))
    w = np.ones(rows.shape[0])
    w[np.isin(IDS[rows], kept.random)] = (N - LABELED.shape[0] - RESERVED.shape[0] - 80) / 60
    sub = selection.select(
        "bait",
        embeddings=whole.features[rows],
        probs=whole.probs[rows],
        labeled=np.searchsorted(rows, LABELED),
        reserved=np.searchsorted(rows, RESERVED),
        batch_size=B,
        seed=seed,
        dtype="float64",
        approx="exact",
        prefilter="none",
        fisher_weights=w,
    )
    assert ids.tolist() == IDS[rows[sub.indices]].tolist()
    exact = exact_objective(
        whole.features,
        whole.probs,
        torch.as_tensor(np.union1d(LABELED, RESERVED)),
        torch.as_tensor(np.searchsorted(IDS, ids)),
        lam=0.01,
        w_design=1 / 35,
        w_picked=10 / 35,
    )
    assert objective == pytest.approx(exact, rel=1e-9)
    # the single process given the rows' ids draws the same random stratum: the same picks, whatever the layout
    by_id = single(prefilter={"top": 80, "random": 60}, row_ids=IDS)
    assert ids.tolist() == IDS[by_id.indices].tolist()
    by_row = single(prefilter={"top": 80, "random": 60})  # without ids: a permutation of positions, another sample
    drawn = [r.diagnostics["approximation"]["prefilter"] for r in (by_id, by_row)]
    assert [d["kept_random"] for d in drawn] == [60, 60]
    assert [d["random_drawn_by"] for d in drawn] == ["row_ids", "position"]


def _lists(ids: np.ndarray, scores: np.ndarray, keys: np.ndarray, pf: Prefilter) -> ShardScores:
    """A shard's two candidate lists as :func:`shard_scores` builds them, from given scores and keys."""
    top = np.lexsort((ids, -scores))[: pf.top]
    low = np.lexsort((ids, keys))[: pf.top + pf.random]
    return ShardScores(ids[top], scores[top], ids[low], keys[low], int(ids.shape[0]), int(ids.shape[0]))


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize(("top", "random"), [(300, 200), (5000, 0), (0, 700), (40, 25), (9000, 9000)])
def test_bounded_merge_equals_the_merge_of_whole_lists_and_sends_little(ties: bool, top: int, random: int) -> None:
    """The two rounds (sketch, then the entries past the bounds) give the merge of every shard's whole lists, and
    send at most the strata plus two sketch strides a shard; scores with many exact ties included."""
    rng = np.random.default_rng(top + random + ties)
    n = 8000
    ids = np.sort(rng.choice(10 * n, size=n, replace=False)).astype(np.int64)
    scores = rng.normal(size=n)
    if ties:
        scores = np.round(scores, 1)  # about 60 distinct values: ties everywhere, across shards too
    keys = item_keys(3, ids)
    pf = Prefilter(top=top, random=random)
    for sizes in ([n], [1000] * 8, [1, 2999, 17, 4983], [250] * 32):
        bounds = np.cumsum([0, *sizes])
        parts = [_lists(ids[a:b], scores[a:b], keys[a:b], pf) for a, b in itertools.pairwise(bounds)]
        whole = merge_scores(parts, pf)
        sketches = [sketch_of(p) for p in parts]
        tau, kappa = thresholds(sketches, pf)
        sent = [above(p, tau, kappa) for p in parts]
        got = merge_scores(sent, pf)
        assert got.top.tolist() == whole.top.tolist(), sizes
        assert got.random.tolist() == whole.random.tolist(), sizes
        assert got.weight == whole.weight and got.candidates == whole.candidates == n
        strides = sum(2 * sk.step for sk in sketches)
        tied = int(np.count_nonzero(scores == tau))  # every row tied at the bound travels: the merge needs it
        assert sum(s.top_ids.shape[0] for s in sent) <= min(top, n) + strides + tied
        assert sum(s.key_ids.shape[0] for s in sent) <= min(top + random, n) + strides
        if random == 0:
            assert all(s.key_ids.size == 0 for s in sent)  # no random stratum: no key travels
        if top == 0:
            assert all(s.top_ids.size == 0 for s in sent)
        marks = sum(sk.score_marks.shape[0] + sk.key_marks.shape[0] for sk in sketches)
        listed = sum(p.top_ids.shape[0] + p.key_ids.shape[0] for p in parts)
        assert marks <= listed // 8 + 4 * len(parts)  # the sketch is a small part of the lists


def test_sketch_marks_every_step_and_the_last_entry() -> None:
    part = _lists(np.arange(10, dtype=np.int64), np.arange(10.0)[::-1].copy(), np.arange(10) / 10.0, Prefilter(10, 0))
    sk = sketch_of(part)
    assert sk.step == 3 and sk.score_marks.tolist() == [9.0, 6.0, 3.0, 0.0] and sk.n_top == 10
    assert sk.key_marks.tolist() == [0.0, 0.3, 0.6, 0.9]
    # a bound of 7 entries: the mark at rank 6 reaches it, the last one does not
    assert thresholds([sk], Prefilter(7, 0)) == (3.0, float("-inf"))
    assert thresholds([sk], Prefilter(2, 0))[0] == 6.0  # 4 reached (ranks 0..3 at >= 6.0): enough for 2
    assert thresholds([sk], Prefilter(0, 3)) == (float("inf"), 0.3)


def test_row_ids_are_checked() -> None:
    X = np.random.default_rng(0).normal(size=(6, 3))
    probs = np.full((6, 2), 0.5)
    kw: dict[str, object] = {"embeddings": X, "probs": probs, "labeled": [0, 1], "batch_size": 2}
    for bad, match in (([1, 2, 3], "shape"), ([0, 1, 2, 3, 4, 4], "distinct"), ([0, 1, 2, 3, 4, -5], "non-negative"),
                       ([0.5, 1, 2, 3, 4, 5], "integers"), ("abcdef", "shape")):  # fmt: skip
        with pytest.raises(ParameterError, match=match):
            selection.select("bait", row_ids=bad, **kw)  # type: ignore[arg-type]
    ok = selection.select("bait", row_ids=np.array([9, 3, 7, 1, 5, 11]), **kw)  # type: ignore[arg-type]
    assert ok.indices.shape == (2,)

"""The outlier check on the Dask cluster (issue 28): a real `dask scheduler` and two `dask worker` processes on
127.0.0.1 (the fixtures of tests/worker/test_distributed.py). The statistics come from the single-process check's
sample, read by the shards, so both paths flag the same rows; without exclude_outliers the picks are named in
diagnostics.outliers with the single-process keys, with it the flagged rows are left out of the pool by a pass over
the shards and never picked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from distributed import Client
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from selection.outliers import robust_outliers
from service.config import Settings
from service.main import create_app
from tests.service.test_auto_outliers import corrupt
from tests.worker.factories import make_pool
from tests.worker.test_distributed import Cluster, _settings, _wait
from worker import distributed_outliers, pool_store


def test_the_cluster_passes_read_the_single_process_sample_and_flag_its_rows(cluster: Cluster, tmp_path: Path) -> None:
    """The passes alone, on store versions written here: item ids with gaps (the sample is drawn by row position,
    not by id), shards of 64 rows; a pool larger than the sample and one smaller (the sample is the whole pool)."""
    rng = np.random.default_rng(4)
    with Client(cluster.address, timeout=30, set_as_default=False) as client:
        for version, (n, sample) in enumerate([(700, 100), (150, 5000)], start=1):
            X = rng.normal(size=(n, 5)).astype(np.float32)
            bad = [3, n // 2, n - 1]
            X[bad] *= 1e3
            ids = 10 + 3 * np.arange(n, dtype=np.int64)
            names = [f"x{i}" for i in range(n)]
            manifest = pool_store.write_version(tmp_path / "store", "p", version, ids, names, X, 64)
            ref = robust_outliers(X, sample=sample, seed=11)

            sampled = distributed_outliers.pool_stats(client, manifest, 11, sample=sample)
            st = sampled.stats
            # the same rows in the same order: the same numbers, not merely close ones
            assert (st.threshold, st.median, st.mad, st.n_sample) == (ref.threshold, ref.median, ref.mad, ref.n_sample)
            assert sampled.diagnostics["rows"] == min(n, sample) and sampled.diagnostics["tasks"] <= len(
                manifest.shards
            )

            flagged = distributed_outliers.flag_pool(client, manifest, st)
            assert flagged.ids.tolist() == ids[ref.flagged].tolist() == ids[bad].tolist()
            assert flagged.external_ids == [names[i] for i in bad]
            assert flagged.distances.tolist() == ref.distances[ref.flagged].tolist()
            assert flagged.diagnostics["tasks"] == len(manifest.shards) and flagged.diagnostics["rows"] == n
        # another seed reads another sample (seeded, not fixed)
        other = distributed_outliers.pool_stats(client, manifest, 12, sample=100)
        assert other.stats.threshold == robust_outliers(X, sample=100, seed=12).threshold


POOL: dict[str, Any] = {"n": 6000, "d": 8, "n_labeled": 12, "task": "regression", "seed": 3}
BAD_ROWS = (1500, 3100, 5900)


def _pool(db: sessionmaker[Session], name: str) -> tuple[str, list[str]]:
    """A regression pool larger than the check's sample (5,000 rows), three rows corrupted (10^3 times the scale):
    BAIT's Fisher x x^T is largest there. The pool's id and the corrupted rows' external ids."""
    pool = make_pool(db, name=name, **POOL)
    return pool.pool_id, [corrupt(db, pool, row) for row in BAD_ROWS]


def _run(
    app: TestClient, settings: Settings, auth: dict[str, str], pool_id: str, strategy: str, **params: Any
) -> dict[str, Any]:
    r = app.post(
        f"/v1/pools/{pool_id}/batches",
        json={"size": 8, "strategy": strategy, "params": {"seed": 1, **params}},
        headers=auth,
    )
    assert r.status_code == 202, r.text
    batch = _wait(app, settings, auth, pool_id, str(r.json()["id"]))
    assert batch["status"] == "succeeded", batch["error"]
    return batch


def test_outliers_are_flagged_and_excluded_on_the_cluster_as_in_the_worker(
    cluster: Cluster, settings: Settings, db: sessionmaker[Session], auth: dict[str, str], tmp_path: Path
) -> None:
    local: dict[str, dict[str, Any]] = {}
    with TestClient(create_app(settings)) as app:
        for name, params in (("flag", {}), ("exclude", {"exclude_outliers": True})):
            pool_id, bad = _pool(db, f"local-{name}")
            local[name] = _run(app, settings, auth, pool_id, "bait", **params)
            assert local[name]["diagnostics"]["engine"] == "local"
    assert set(local["flag"]["outliers"]) == set(bad) and set(bad) <= set(local["flag"]["item_ids"])

    dask_settings = _settings(settings, tmp_path / "store", dask_scheduler=cluster.address, pool_store_shard_rows=500)
    with TestClient(create_app(dask_settings)) as app:
        # a newcomer's mistake is refused before anything runs, as without a cluster
        r = app.post(
            f"/v1/pools/{pool_id}/batches",
            json={"size": 8, "strategy": "bait", "params": {"exclude_outliers": "yes"}},
            headers=auth,
        )
        assert r.status_code == 400 and "params.exclude_outliers must be true or false" in r.text

        # without exclude_outliers: BAIT picks the corrupt rows, and the check names them, as in the worker
        pool_id, bad = _pool(db, "dask-flag")
        flagged = _run(app, dask_settings, auth, pool_id, "bait")
        diag = flagged["diagnostics"]
        assert diag["engine"] == "dask" and "engine_note" not in diag
        passes = diag["selection"]["outlier_passes"]
        assert set(passes) == {"sample"} and passes["sample"]["rows"] == 5000 and passes["sample"]["tasks"] == 12
        assert flagged["outliers"] == local["flag"]["outliers"] and set(bad) <= set(flagged["item_ids"])
        info, ref = diag["outliers"], local["flag"]["diagnostics"]["outliers"]
        assert set(info) == set(ref)  # the single-process check's keys
        for key in ("threshold", "median_distance", "mad_distance", "n_sample", "n_checked", "n_flagged", "c", "rule"):
            assert info[key] == ref[key], key  # the same sample: the same numbers
        assert info["n_sample"] == 5000 and info["checked"] is True and info["excluded"] is False
        assert info["items"] == ref["items"]  # item ids and distances, in pick order
        assert flagged["item_ids"] == local["flag"]["item_ids"]

        # with it: a pass over every shard leaves the flagged rows out before the selection; none is picked
        pool_id, bad = _pool(db, "dask-exclude")
        kept = _run(app, dask_settings, auth, pool_id, "bait", exclude_outliers=True)
        diag = kept["diagnostics"]
        assert diag["engine"] == "dask"
        assert diag["selection"]["outlier_passes"]["flag"]["tasks"] == 12
        assert diag["selection"]["cluster"]["rows_dropped"] == len(bad)
        assert not set(bad) & set(kept["item_ids"]) and len(set(kept["item_ids"])) == 8
        info, ref = diag["outliers"], local["exclude"]["diagnostics"]["outliers"]
        assert set(info) == set(ref)
        assert info["excluded"] is True and info["n_excluded"] == ref["n_excluded"] == len(bad)
        assert info["excluded_items"] == ref["excluded_items"] == sorted(bad)
        assert (info["n_flagged"], info["n_checked"], info["threshold"]) == (ref["n_flagged"], 6000, ref["threshold"])
        assert kept["outliers"] == [] == local["exclude"]["outliers"]
        assert kept["item_ids"] == local["exclude"]["item_ids"]  # the pool BAIT sees is the worker's pool

        # the top-B strategies: margin (classification) leaves them out too; random is checked only when asked
        cls = make_pool(db, name="dask-margin", n=400, d=6, n_labeled=30, seed=2)
        cbad = [corrupt(db, cls, row) for row in (50, 250)]
        margin = _run(app, dask_settings, auth, cls.pool_id, "margin", exclude_outliers=True)
        assert margin["diagnostics"]["engine"] == "dask"
        assert margin["diagnostics"]["outliers"]["excluded_items"] == sorted(cbad)
        assert not set(cbad) & set(margin["item_ids"])
        rnd = _run(app, dask_settings, auth, cls.pool_id, "random")
        assert rnd["outliers"] is None and rnd["diagnostics"]["outliers"]["checked"] is False
        assert "outlier_passes" not in rnd["diagnostics"]["selection"]
        rnd = _run(app, dask_settings, auth, cls.pool_id, "random", exclude_outliers=True)
        # the margin batch's picks are reserved (design), the two corrupt rows are not: both left out
        assert rnd["diagnostics"]["engine"] == "dask" and rnd["diagnostics"]["outliers"]["n_excluded"] == 2
        assert not set(cbad) & set(rnd["item_ids"])

"""Distributed selection on a real Dask cluster (issue 26): a `dask scheduler` and two `dask worker` processes on
127.0.0.1, batches requested through the service (in-process runner on SQLite; RQ on PostgreSQL + Redis when
configured). The picks equal the single-process picks; a worker killed mid-batch does not fail it; a stopped
scheduler fails the batch at once with engine_unavailable (or runs it locally when the operator allows it); no
API field can name a scheduler."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, insert, update
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.main import create_app
from service.store.models import Item, Pool
from tests.conftest import REDIS_URL
from tests.e2e.procs import free_port
from tests.service.test_web import _sign_in
from tests.worker.factories import make_pool

ROOT = Path(__file__).resolve().parents[2]


def _dask_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "dask", *args]


@dataclass
class Cluster:
    address: str
    scheduler: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]]
    logs: Path

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BAIT_")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", DASK_DISTRIBUTED__WORKER__DAEMON="false")
    return env


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_workers(address: str, n: int, timeout: float = 60, security: Any = None) -> None:
    from distributed import Client

    with Client(address, timeout=30, set_as_default=False, security=security) as c:
        c.wait_for_workers(n, timeout=timeout)


def start_cluster(
    tmp: Path,
    n_workers: int = 2,
    preload: str | None = None,
    protocol: str = "tcp",
    scheduler_args: tuple[str, ...] = (),
    worker_args: tuple[str, ...] = (),
    security: Any = None,
) -> Cluster:
    """A ``dask scheduler`` and ``n_workers`` ``dask worker`` processes on 127.0.0.1 (``protocol`` tls: pass the
    certificates in ``scheduler_args``/``worker_args`` and our client's ``security``)."""
    port = free_port()
    address = f"{protocol}://127.0.0.1:{port}"
    scheduler = _start(
        _dask_cmd(
            "scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--protocol",
            protocol,
            "--no-dashboard",
            *scheduler_args,
        ),
        tmp / "scheduler.log",
    )
    workers = [
        _start(
            _dask_cmd(
                "worker",
                address,
                "--host",
                "127.0.0.1",
                "--nworkers",
                "1",
                "--nthreads",
                "1",
                "--memory-limit",
                "1GB",
                "--no-dashboard",
                "--no-nanny",
                "--name",
                f"w{i}",
                *(["--preload", preload] if preload else []),
                *worker_args,
            ),
            tmp / f"worker-{i}.log",
        )
        for i in range(n_workers)
    ]
    cluster = Cluster(address, scheduler, workers, tmp)
    try:
        _wait_workers(address, n_workers, security=security)
    except BaseException:
        for p in [*workers, scheduler]:
            cluster.stop(p, signal.SIGKILL)
        raise
    return cluster


def _settings(settings: Settings, store: Path, **extra: Any) -> Settings:
    return settings.model_copy(
        update={"pool_store": str(store), "pool_store_shard_rows": 40, "dask_connect_timeout_seconds": 3.0, **extra}
    )


def _batch(client: TestClient, auth: dict[str, str], pool_id: str, strategy: str, seed: int = 5) -> str:
    r = client.post(
        f"/v1/pools/{pool_id}/batches",
        json={"size": 12, "strategy": strategy, "params": {"seed": seed}},
        headers=auth,
    )
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _wait(client: TestClient, settings: Settings, auth: dict[str, str], pool_id: str, batch_id: str) -> dict[str, Any]:
    """Run the app's jobs with ``settings`` (in-process runner, or an RQ SimpleWorker in burst mode) until the
    batch is finished; the batch."""

    def done() -> bool:
        return _get(client, auth, pool_id, batch_id)["status"] in ("succeeded", "failed")

    deadline = time.monotonic() + 90
    queue = client.app.state.queue  # type: ignore[attr-defined]
    while not done():
        assert time.monotonic() < deadline, "the batch did not finish in time"
        if REDIS_URL:
            from rq import SimpleWorker
            from rq.serializers import JSONSerializer

            from worker import context

            context.configure(settings)
            SimpleWorker([queue.rq_queue], connection=queue.connection, serializer=JSONSerializer).work(
                burst=True, with_scheduler=False
            )
        else:
            queue.wait_idle(max(0.0, deadline - time.monotonic()))
        time.sleep(0.05)
    return _get(client, auth, pool_id, batch_id)


def _get(client: TestClient, auth: dict[str, str], pool_id: str, batch_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/pools/{pool_id}/batches/{batch_id}", headers=auth)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _local_picks(
    settings: Settings, db: sessionmaker[Session], auth: dict[str, str], strategies: list[str], **pool: Any
) -> dict[str, list[str]]:
    """The single-process picks of each strategy, each on a fresh copy of the same pool."""
    picks = {}
    with TestClient(create_app(settings)) as local:
        for strategy in strategies:
            data = make_pool(db, name=f"local-{strategy}", **pool)
            batch = _wait(local, settings, auth, data.pool_id, _batch(local, auth, data.pool_id, strategy))
            assert batch["status"] == "succeeded", batch["error"]
            assert batch["diagnostics"]["engine"] == "local"
            picks[strategy] = batch["item_ids"]
    return picks


POOL: dict[str, Any] = {"n": 400, "d": 6, "n_labeled": 30, "seed": 2}


def test_cluster_picks_equal_the_single_process_picks(
    cluster: Cluster, settings: Settings, db: sessionmaker[Session], auth: dict[str, str], tmp_path: Path
) -> None:
    strategies = ["margin", "confidence", "entropy"]
    expected = _local_picks(settings, db, auth, strategies, **POOL)
    dask_settings = _settings(settings, tmp_path / "store", dask_scheduler=cluster.address)
    with TestClient(create_app(dask_settings)) as app:
        for run, strategy in enumerate([*strategies, "random", "random"]):
            data = make_pool(db, name=f"dask-{run}-{strategy}", **POOL)
            batch = _wait(app, dask_settings, auth, data.pool_id, _batch(app, auth, data.pool_id, strategy))
            assert batch["status"] == "succeeded", batch["error"]
            diag = batch["diagnostics"]
            assert diag["engine"] == "dask" and diag["selection"]["engine"] == "dask"
            assert diag["selection"]["tasks"] == 10 and diag["selection"]["workers"] == 2
            assert diag["selection"]["bytes_read"]["shards"] > 0 and diag["pool_cache"]["how"] == "pool_store"
            assert cluster.address not in str(diag)  # tenants read diagnostics: no scheduler address
            labeled = {f"item-{i:05d}" for i in range(POOL["n_labeled"])}
            assert len(set(batch["item_ids"])) == 12 and not labeled & set(batch["item_ids"])
            if strategy in expected:
                assert batch["item_ids"] == expected[strategy], strategy
            else:
                expected.setdefault("random", batch["item_ids"])
                assert batch["item_ids"] == expected["random"]  # same seed, same store layout: same sample
        # a strategy without a shard pass runs in the job's process, and says so
        data = make_pool(db, name="dask-coreset", **POOL)
        batch = _wait(app, dask_settings, auth, data.pool_id, _batch(app, auth, data.pool_id, "coreset"))
        assert batch["status"] == "succeeded" and batch["diagnostics"]["engine"] == "local"
        assert "coreset runs in the worker's process" in batch["diagnostics"]["engine_note"]
        # the dashboard says where each ran
        _sign_in(app, auth["Authorization"].removeprefix("Bearer "))
        page = app.get(f"/ui/pools/{data.pool_id}/batches/{batch['id']}").text
        assert "Ran on the worker's own process (coreset runs in the worker&#39;s process" in page
        pool_dask = make_pool(db, name="dask-page", **POOL)
        dask_batch = _wait(app, dask_settings, auth, pool_dask.pool_id, _batch(app, auth, pool_dask.pool_id, "margin"))
        pool_page = app.get(f"/ui/pools/{pool_dask.pool_id}").text
        assert re.search(
            r'<td class="engine">Dask cluster <small class="muted">\([12] workers?\)</small></td>', pool_page
        )
        page = app.get(f"/ui/pools/{pool_dask.pool_id}/batches/{dask_batch['id']}").text
        assert re.search(r"Ran on the Dask cluster: [12] of 2 worker\(s\), 10 task\(s\), store version \d+", page)
        assert cluster.address not in page and cluster.address not in pool_page


def _change_pool(db: sessionmaker[Session], pool_id: str) -> None:
    """Appends, deletes, re-uploads and a split move, the same on every copy of the pool."""
    now = datetime.now(UTC)
    rng = np.random.default_rng(11)
    new = rng.normal(0.0, 3.0, size=(25, POOL["d"])).astype("<f4")
    with session_scope(db) as s:
        s.execute(
            insert(Item),
            [
                {"pool_id": pool_id, "external_id": f"late-{i:03d}", "embedding": x.tobytes(), "status": "unlabeled",
                 "created_at": now, "updated_at": now}
                for i, x in enumerate(new)
            ],
        )  # fmt: skip
        s.execute(delete(Item).where(Item.pool_id == pool_id, Item.external_id.in_(["item-00101", "item-00250"])))
        for i in range(5):
            s.execute(
                update(Item)
                .where(Item.pool_id == pool_id, Item.external_id == f"item-{150 + 20 * i:05d}")
                .values(embedding=rng.normal(0.0, 3.0, size=POOL["d"]).astype("<f4").tobytes())
            )
        moved = update(Item).where(Item.pool_id == pool_id, Item.external_id == "item-00333")
        s.execute(moved.values(split="validation"))


def test_a_changed_pool_is_read_from_an_incremental_version_with_the_same_picks(
    cluster: Cluster, settings: Settings, db: sessionmaker[Session], auth: dict[str, str], tmp_path: Path
) -> None:
    """Between two batches the pool gains, loses and rewrites items: the second cluster batch reads a store version
    written from the first one's (the new rows in a new shard, deltas for the rest, the old full shards shared);
    Dask workers reading its shards get exactly the single-process reader's rows, and the picks are the
    single-process picks."""
    from distributed import Client

    from worker import pool_store
    from worker.pool_data import load_pool

    dask_settings = _settings(settings, tmp_path / "store", dask_scheduler=cluster.address)
    picks: dict[str, list[Any]] = {}
    for engine, cfg in (("local", settings), ("dask", dask_settings)):
        with TestClient(create_app(cfg)) as app:
            data = make_pool(db, name=f"incremental-{engine}", **POOL)
            for seed in (5, 6):
                if seed == 6:
                    _change_pool(db, data.pool_id)
                batch = _wait(app, cfg, auth, data.pool_id, _batch(app, auth, data.pool_id, "margin", seed=seed))
                assert batch["status"] == "succeeded", batch["error"]
                assert batch["diagnostics"]["engine"] == engine
                picks.setdefault(engine, []).append(batch["item_ids"])
                versions = picks.setdefault(f"{engine}-versions", [])
                versions.append(batch["diagnostics"]["selection"].get("store_version"))
        if engine == "dask":
            first_version, version = (int(v) for v in picks["dask-versions"])
            manifest = pool_store.read_manifest(dask_settings.pool_store, data.pool_id, version)
            assert manifest is not None and manifest.base_version == first_version
            assert manifest.written["rows"] < 40 and manifest.written["shards_shared"] >= 9
            assert any(s.deleted for s in manifest.shards) and any(s.upserts for s in manifest.shards)
            with Client(cluster.address, timeout=10, set_as_default=False) as client:
                parts = client.gather(client.map(pool_store.read_shard, list(manifest.shards), pure=False))
            with session_scope(db) as s:
                pool = s.get(Pool, data.pool_id)
                assert pool is not None
                fresh = load_pool(s, pool, datetime.now(UTC))
            assert np.array_equal(np.concatenate([p[0] for p in parts]), fresh.item_ids)
            assert [e for p in parts for e in p[1]] == list(fresh.external_ids)
            assert np.array_equal(np.concatenate([p[2] for p in parts]), fresh.X)
    assert picks["dask"] == picks["local"]


def _kill_w0_mid_task(cluster: Cluster, killed: list[str]) -> None:
    from distributed import Client

    with Client(cluster.address, timeout=10, set_as_default=False) as spy:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until a shard task runs on worker w0
            running = {w: [k for k in keys if "bait-shard" in str(k)] for w, keys in spy.processing().items()}
            names = {a: i["name"] for a, i in spy.scheduler_info(n_workers=-1)["workers"].items()}
            if any(keys and names.get(w) == "w0" for w, keys in running.items()):
                cluster.stop(cluster.workers[0], signal.SIGKILL)
                killed.append("w0")
                return
            time.sleep(0.05)


def test_a_worker_killed_mid_batch_does_not_fail_it_and_a_stopped_scheduler_fails_fast(
    settings: Settings, db: sessionmaker[Session], auth: dict[str, str], tmp_path: Path
) -> None:
    expected = _local_picks(settings, db, auth, ["entropy"], **POOL)
    cluster = start_cluster(tmp_path, preload="tests.worker.dask_slow_shards")  # every shard task takes 0.6 s more
    try:
        dask_settings = _settings(settings, tmp_path / "store", dask_scheduler=cluster.address)
        with TestClient(create_app(dask_settings)) as app:
            data = make_pool(db, name="dask-kill", **POOL)
            batch_id = _batch(app, auth, data.pool_id, "entropy")
            # A side thread kills worker w0 once a shard task runs there; this thread runs the jobs (RQ's
            # worker installs signal handlers, so it must be the main thread).
            killed: list[str] = []
            spy_thread = threading.Thread(target=_kill_w0_mid_task, args=(cluster, killed), daemon=True)
            spy_thread.start()
            batch = _wait(app, dask_settings, auth, data.pool_id, batch_id)
            spy_thread.join(60)
            assert killed == ["w0"], "worker w0 was not killed while a shard task ran"
            assert batch["status"] == "succeeded", batch["error"]
            assert batch["item_ids"] == expected["entropy"]
            assert batch["diagnostics"]["selection"]["workers"] == 1  # the survivor finished the work

            # the scheduler stopped: the next batch fails at once, with the reason
            cluster.stop(cluster.scheduler, signal.SIGKILL)
            data = make_pool(db, name="dask-down", **POOL)
            started = time.monotonic()
            batch = _wait(app, dask_settings, auth, data.pool_id, _batch(app, auth, data.pool_id, "margin"))
            assert batch["status"] == "failed" and time.monotonic() - started < 30
            assert batch["error"].startswith("engine_unavailable: the Dask scheduler")
            assert cluster.address not in batch["error"]
        # unless the operator allows running it here
        fallback = dask_settings.model_copy(update={"dask_fallback_local": True})
        with TestClient(create_app(fallback)) as app:
            batch = _wait(app, fallback, auth, data.pool_id, _batch(app, auth, data.pool_id, "margin"))
            assert batch["status"] == "succeeded" and batch["diagnostics"]["engine"] == "local"
            assert "unreachable" in batch["diagnostics"]["engine_note"]
    finally:
        for p in [*cluster.workers, cluster.scheduler]:
            cluster.stop(p, signal.SIGKILL)


def test_no_api_field_can_name_a_scheduler(client: TestClient, db: sessionmaker[Session], auth: dict[str, str]) -> None:
    """The scheduler is operator configuration only: no request body of the API has a field for it, and a batch
    that tries to pass one is refused before anything is queued."""
    spec = client.get("/openapi.json").json()
    fields: set[str] = set()
    for schema in spec["components"]["schemas"].values():
        fields.update((schema.get("properties") or {}).keys())
    assert not {f for f in fields if "dask" in f.lower() or "scheduler" in f.lower() or "pool_store" in f.lower()}
    data = make_pool(db, **POOL)
    for body in (
        {"size": 5, "strategy": "margin", "dask_scheduler": "tcp://127.0.0.1:1"},
        {"size": 5, "strategy": "margin", "params": {"dask_scheduler": "tcp://127.0.0.1:1"}},
        {"size": 5, "strategy": "margin", "params": {"scheduler": "tcp://127.0.0.1:1"}},
    ):
        r = client.post(f"/v1/pools/{data.pool_id}/batches", json=body, headers=auth)
        assert 400 <= r.status_code < 500, (body, r.text)
    assert client.get(f"/v1/pools/{data.pool_id}/batches", headers=auth).json()["batches"] == []


BAIT_POOL: dict[str, Any] = {"n": 3000, "d": 16, "n_labeled": 40, "seed": 7}


def _bait_batch(client: TestClient, auth: dict[str, str], pool_id: str, params: dict[str, Any]) -> str:
    r = client.post(
        f"/v1/pools/{pool_id}/batches",
        json={"size": 10, "strategy": "bait", "params": {"seed": 3, **params}},
        headers=auth,
    )
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def test_bait_on_the_cluster_picks_what_the_single_process_batch_picks(
    cluster: Cluster, settings: Settings, db: sessionmaker[Session], auth: dict[str, str], tmp_path: Path
) -> None:
    """BAIT through the service: the pool-wide passes on the cluster, the greedy in the job. Every candidate kept
    (the auto plan at this size) and a score-only pre-filter pick the single-process items; a pre-filter with a
    random stratum (drawn by item id on the cluster) gathers only the kept rows and the design."""
    cases: dict[str, dict[str, Any]] = {
        "auto": {},
        "top": {"prefilter": {"top": 400, "random": 0}},
        "strata": {"prefilter": {"top": 300, "random": 200}},
    }
    local: dict[str, dict[str, Any]] = {}
    local_pool: dict[str, str] = {}
    with TestClient(create_app(settings)) as app:
        for name, params in cases.items():
            data = make_pool(db, name=f"local-bait-{name}", **BAIT_POOL)
            batch = _wait(app, settings, auth, data.pool_id, _bait_batch(app, auth, data.pool_id, params))
            assert batch["status"] == "succeeded", batch["error"]
            assert batch["diagnostics"]["engine"] == "local"
            local[name], local_pool[name] = batch, data.pool_id
    dask_settings = _settings(settings, tmp_path / "store", dask_scheduler=cluster.address, pool_store_shard_rows=500)
    with TestClient(create_app(dask_settings)) as app:
        runs: dict[str, list[dict[str, Any]]] = {}
        for name, params in cases.items():
            for run in range(2 if name == "strata" else 1):  # strata: on two copies of the pool
                data = make_pool(db, name=f"dask-bait-{name}-{run}", **BAIT_POOL)
                batch = _wait(app, dask_settings, auth, data.pool_id, _bait_batch(app, auth, data.pool_id, params))
                assert batch["status"] == "succeeded", batch["error"]
                runs.setdefault(name, []).append(batch)
    labeled = {f"item-{i:05d}" for i in range(BAIT_POOL["n_labeled"])}
    for name, batches in runs.items():
        for batch in batches:
            diag = batch["diagnostics"]
            sel = diag["selection"]
            assert diag["engine"] == "dask" and sel["engine"] == "dask", name
            assert sel["workers"] == 2 and diag["pool_cache"]["how"] == "pool_store"
            assert cluster.address not in str(diag)
            assert len(set(batch["item_ids"])) == 10 and not labeled & set(batch["item_ids"])
            stages = sel["cluster"]["tasks_per_stage"]
            assert sel["bytes_read"]["gather"] > 0 and stages["gather"] >= 1
            if name == "auto":  # every candidate kept: one gather task per shard, no scores pass
                assert stages == {"gather": 6} and sel["cluster"]["rows_gathered"] == BAIT_POOL["n"]
            else:
                assert stages["scores"] == 6 and stages["fisher_reduce"] == 5 and sel["bytes_read"]["scores"] > 0
                assert sel["objective_kind"].startswith("exact")
                kept = sel["cluster"]["prefilter"]
                assert (kept["top"], kept["random"]) == tuple(cases[name]["prefilter"].values())
                # only the kept candidates and the design travel to the job
                assert sel["cluster"]["rows_gathered"] == kept["top"] + kept["random"] + BAIT_POOL["n_labeled"]
                # the bounded merge: of the shards' lists, the sketches and the entries past their bounds travel
                merge = sel["cluster"]["merge"]
                assert stages["merge"] == 6
                assert kept["top"] + kept["random"] <= merge["entries_sent"] <= merge["entries_listed"] // 3
                assert 0 < merge["sketch_entries"] <= merge["entries_listed"] // 8
    # the same items as the single-process batch, and the same objective over the whole pool (float32 pipeline:
    # the head's forward pass of a row may differ in its last bits between a shard's chunk and the pool's)
    for name in ("auto", "top"):
        got, ref = runs[name][0], local[name]
        assert got["item_ids"] == ref["item_ids"], name
        assert got["objective"] == pytest.approx(ref["objective"], rel=1e-4)
    # on the pool the single process selected from (its batch cancelled), the cluster's random stratum is the
    # single process's: both draw it by item id, so the same items come back
    strata, pool_id = local["strata"], local_pool["strata"]
    with TestClient(create_app(settings)) as app:
        r = app.post(f"/v1/pools/{pool_id}/batches/{strata['id']}/cancel", headers=auth)
        assert r.status_code == 200, r.text
    assert strata["diagnostics"]["selection"]["approximation"]["prefilter"]["random_drawn_by"] == "row_ids"
    with TestClient(create_app(dask_settings)) as app:
        again = _wait(app, dask_settings, auth, pool_id, _bait_batch(app, auth, pool_id, cases["strata"]))
    assert again["status"] == "succeeded" and again["diagnostics"]["engine"] == "dask"
    assert again["item_ids"] == strata["item_ids"]
    assert again["objective"] == pytest.approx(strata["objective"], rel=1e-4)
    # the random stratum (drawn by item id: each copy of the pool has its own ids) stands for the other candidates
    n_cand = BAIT_POOL["n"] - BAIT_POOL["n_labeled"]
    for batch in runs["strata"]:
        kept = batch["diagnostics"]["selection"]["cluster"]["prefilter"]
        assert kept["n_candidates"] == n_cand and kept["random_weight"] == pytest.approx((n_cand - 300) / 200)
        assert batch["objective"] > 0


def test_a_pass_whose_inputs_the_cluster_lost_runs_again_then_gives_up() -> None:
    # What a worker dying with the last replica of a pass's scattered inputs looks like to the job: its tasks
    # are cancelled ("already forgotten"). The pass runs again from the start; after LOST_INPUT_RERUNS reruns
    # the batch fails with engine_unavailable.
    from distributed.client import FutureCancelledError

    from worker.distributed import LOST_INPUT_RERUNS, EngineUnavailable, Picks, rerun_when_inputs_lost

    calls: list[int] = []

    def flaky(fail: int) -> Picks:
        calls.append(1)
        if len(calls) <= fail:
            raise FutureCancelledError("bait-shard-x-00001", reason="already forgotten")
        return Picks(ids=np.array([3]), external_ids=["c"], scores=np.array([0.5]), candidates=9)

    picks = rerun_when_inputs_lost(lambda: flaky(1))
    assert len(calls) == 2 and picks.diagnostics["pass_reruns"] == 1 and picks.ids.tolist() == [3]
    calls.clear()
    assert rerun_when_inputs_lost(lambda: flaky(0)).diagnostics["pass_reruns"] == 0 and len(calls) == 1
    calls.clear()
    with pytest.raises(
        EngineUnavailable, match=r"^engine_unavailable: the Dask cluster lost the batch's inputs 3 times"
    ):
        rerun_when_inputs_lost(lambda: flaky(LOST_INPUT_RERUNS + 1))
    assert len(calls) == LOST_INPUT_RERUNS + 1


def test_the_pool_fisher_reduction_runs_only_when_cheap_so_more_workers_never_add_work() -> None:
    """The pool Fisher serves only the reported exact objective: reduced on a small pool, not on a large one, and
    the decision for a large pool is the same with 1 and with 2 workers (at 0.25 of the budget, 2 workers turned
    it on at 10^6 x 256 and their scores pass took 4x as long as 1 worker's)."""
    from worker import distributed_bait

    common: dict[str, Any] = {"task": "classification", "r": 10, "batch_size": 100, "device": "cpu", "n_design": 1000}
    params: dict[str, Any] = {"prefilter": {"top": 20000, "random": 0}}
    big: dict[str, Any] = {"n_pool": 1_000_000, "n_cand": 999_000, "d": 256}
    decisions = {w: distributed_bait.plan(params, **common, **big, workers=w)[1] for w in (1, 2, 16)}
    assert decisions == {1: False, 2: False, 16: False}
    small: dict[str, Any] = {"n_pool": 3000, "n_cand": 2700, "d": 16}
    assert distributed_bait.plan(params, **common, **small, workers=2)[1] is True
    # the operator's own budget moves it: a batch that may take an hour affords the reduction on the big pool
    assert distributed_bait.plan({**params, "time_budget_s": 3600}, **common, **big, workers=2)[1] is True


def test_the_api_and_the_worker_agree_on_what_runs_on_the_cluster() -> None:
    """The api refuses other strategies on pools too large for one process by its own list (it imports no
    numerics); it must be the worker's."""
    from service import catalog
    from worker import distributed

    assert set(catalog.CLUSTER_STRATEGIES) == set(distributed.CLUSTER_STRATEGIES)

"""docker-compose.yml: without BAIT_SECRET_KEY the api and the workers share a key generated in a volume,
so `docker compose up` starts instead of restarting forever (no container engine needed to check this)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.config import Settings
from service.crypto import check_secret_key, decrypt, encrypt

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def unset_default(value: Any) -> str:
    """A compose value as compose interpolates it with the variable unset: ``${VAR:-default}`` -> default."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", str(value))


def test_api_and_worker_share_the_generated_key_file_in_one_volume() -> None:
    services = compose()["services"]
    key_file = Path(services["api"]["environment"]["BAIT_SECRET_KEY_FILE"])
    for name in ("api", "worker"):
        env = services[name]["environment"]
        assert env["BAIT_SECRET_KEY_FILE"] == str(key_file)
        mounts = {m.split(":")[1]: m.split(":")[0] for m in services[name]["volumes"]}
        assert mounts.get(str(key_file.parent)) == "secretkey", f"{name} does not mount the key volume"
    assert "secretkey" in compose()["volumes"]
    # The image makes that folder for its user, so the volume is created writable by it.
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert (
        f"mkdir -p /app/data {key_file.parent}" in dockerfile
        and f"chown bait /app/data {key_file.parent}" in dockerfile
    )


def test_the_compose_environment_without_a_secret_key_starts_and_agrees_on_one_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what compose makes of ${VAR:-default} when the operator set none of them (BAIT_SECRET_KEY among them)
    env = {k: unset_default(v) for k, v in compose()["services"]["api"]["environment"].items()}
    assert env["BAIT_SECRET_KEY"] == ""
    env["BAIT_SECRET_KEY_FILE"] = str(tmp_path / "volume" / "secret.key")  # the volume, here
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    api, worker = Settings(), Settings()
    check_secret_key(api)  # no SecretKeyError: the api starts
    check_secret_key(worker)
    assert decrypt(worker, encrypt(api, "token")) == "token"


def test_workers_share_the_pool_cache_in_one_volume_the_image_makes_writable() -> None:
    data = compose()
    worker = data["services"]["worker"]
    cache_dir = worker["environment"]["BAIT_WORKER_CACHE_DIR"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in worker["volumes"]}
    assert mounts.get(cache_dir) == "workercache" and "workercache" in data["volumes"]
    assert Settings(worker_cache_dir=cache_dir).worker_cache_dir == Path(cache_dir)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert cache_dir in dockerfile.split("mkdir -p", 1)[1].split("\n")[0]
    assert cache_dir in dockerfile.split("chown bait", 1)[1].split("&&")[0]


def test_the_dask_profile_keeps_the_scheduler_private_and_shares_the_pool_store() -> None:
    data = compose()
    services = data["services"]
    scheduler, dask_worker = services["dask-scheduler"], services["dask-worker"]
    # opt-in: a plain `docker compose up` starts no cluster, and batches stay in the worker's process
    assert scheduler["profiles"] == ["dask"] and dask_worker["profiles"] == ["dask"]
    assert unset_default(services["worker"]["environment"]["BAIT_DASK_SCHEDULER"]) == ""
    assert Settings(dask_scheduler="").dask_scheduler is None
    # the scheduler runs any code its clients send: reachable on the compose network only, no dashboard
    assert "ports" not in scheduler and "--no-dashboard" in scheduler["command"]
    assert scheduler["command"][0] == "scheduler" and scheduler["entrypoint"] == ["dask"]
    assert dask_worker["command"][:2] == ["worker", "tcp://dask-scheduler:8786"]
    assert Settings(dask_scheduler="tcp://dask-scheduler:8786").dask_scheduler == "tcp://dask-scheduler:8786"
    # the service's workers (which write the store) and the Dask workers (which read it) mount one volume at
    # the path BAIT_POOL_STORE names; the image makes that folder for its user
    store = services["worker"]["environment"]["BAIT_POOL_STORE"]
    for name in ("api", "worker", "dask-worker"):
        mounts = {m.split(":")[1]: m.split(":")[0] for m in services[name]["volumes"]}
        assert mounts.get(store) == "poolstore", f"{name} does not mount the pool store"
    assert "poolstore" in data["volumes"]
    assert Settings(pool_store=store).pool_store == store
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert store in dockerfile.split("mkdir -p", 1)[1].split("\n")[0]
    assert store in dockerfile.split("chown bait", 1)[1].split("&&")[0]

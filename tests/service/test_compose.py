"""docker-compose.yml: without BAIT_SECRET_KEY the api and the workers share a key generated in a volume,
so `docker compose up` starts instead of restarting forever (no container engine needed to check this)."""

from __future__ import annotations

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
    env = dict(compose()["services"]["api"]["environment"])
    env["BAIT_SECRET_KEY"] = ""  # what ${BAIT_SECRET_KEY:-} gives when the operator set none
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

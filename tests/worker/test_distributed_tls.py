"""The cluster is not a back door (issue 26): a Dask scheduler and worker on 127.0.0.1 that speak mutual TLS only
(distributed's Security, certificates of a test CA made here). A batch through the service with our client's
certificate runs on the cluster; a client with a certificate of another CA, or none, never reaches it (the batch
fails at once with engine_unavailable); the settings refuse a tls:// scheduler without our certificates, and
certificates with a plain tcp:// address."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.main import create_app
from tests.worker.factories import make_pool
from tests.worker.test_distributed import POOL, Cluster, _batch, _local_picks, _settings, _wait, start_cluster


@dataclass(frozen=True)
class Pem:
    cert: Path
    key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pem:
    pem = Pem(folder / f"{stem}.crt", folder / f"{stem}.key")
    pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return pem


def make_ca(folder: Path, common: str) -> tuple[Pem, x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return _write(folder, common, cert, key), cert, key


def make_leaf(folder: Path, common: str, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey) -> Pem:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    return _write(folder, common, cert, key)


@dataclass(frozen=True)
class Pki:
    ca: Pem
    scheduler: Pem
    worker: Pem
    client: Pem
    rogue_client: Pem  # signed by another CA


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, ca_cert, ca_key = make_ca(folder, "bait-test-ca")
    _, rogue_cert, rogue_key = make_ca(folder, "rogue-ca")
    return Pki(
        ca=ca,
        scheduler=make_leaf(folder, "scheduler", ca_cert, ca_key),
        worker=make_leaf(folder, "worker", ca_cert, ca_key),
        client=make_leaf(folder, "bait-service", ca_cert, ca_key),
        rogue_client=make_leaf(folder, "intruder", rogue_cert, rogue_key),
    )


def _tls_args(ca: Pem, own: Pem) -> tuple[str, ...]:
    return ("--tls-ca-file", str(ca.cert), "--tls-cert", str(own.cert), "--tls-key", str(own.key))


@pytest.fixture
def tls_cluster(pki: Pki, tmp_path: Path) -> Iterator[Cluster]:
    """A TLS-only scheduler and one worker (``tls://``; both require certificates signed by the test CA)."""
    from distributed.security import Security

    security = Security(
        tls_ca_file=str(pki.ca.cert),
        tls_client_cert=str(pki.client.cert),
        tls_client_key=str(pki.client.key),
        require_encryption=True,
    )
    cluster = start_cluster(
        tmp_path,
        n_workers=1,
        protocol="tls",
        scheduler_args=_tls_args(pki.ca, pki.scheduler),
        worker_args=_tls_args(pki.ca, pki.worker),
        security=security,
    )
    yield cluster
    for p in [*cluster.workers, cluster.scheduler]:
        cluster.stop(p, signal.SIGKILL)


def _tls(ca: Pem, own: Pem) -> dict[str, Path]:
    return {"dask_tls_ca_file": ca.cert, "dask_tls_cert": own.cert, "dask_tls_key": own.key}


def test_a_batch_with_our_certificate_runs_on_the_tls_cluster_and_others_are_refused(
    tls_cluster: Cluster,
    pki: Pki,
    settings: Settings,
    db: sessionmaker[Session],
    auth: dict[str, str],
    tmp_path: Path,
) -> None:
    expected = _local_picks(settings, db, auth, ["margin"], **POOL)
    ours = _settings(settings, tmp_path / "store", dask_scheduler=tls_cluster.address, **_tls(pki.ca, pki.client))
    with TestClient(create_app(ours)) as app:
        data = make_pool(db, name="tls-ours", **POOL)
        batch = _wait(app, ours, auth, data.pool_id, _batch(app, auth, data.pool_id, "margin"))
        assert batch["status"] == "succeeded", batch["error"]
        assert batch["diagnostics"]["engine"] == "dask" and batch["diagnostics"]["selection"]["workers"] == 1
        assert batch["item_ids"] == expected["margin"]

    # A client certificate of another CA: the scheduler refuses the handshake; the batch fails at once.
    rogue = _settings(
        settings, tmp_path / "store", dask_scheduler=tls_cluster.address, **_tls(pki.ca, pki.rogue_client)
    )
    # Plain TCP to the TLS port: no handshake, no cluster.
    plain = _settings(settings, tmp_path / "store", dask_scheduler=tls_cluster.address.replace("tls://", "tcp://"))
    for name, intruder in (("tls-rogue", rogue), ("tls-plain", plain)):
        with TestClient(create_app(intruder)) as app:
            data = make_pool(db, name=name, **POOL)
            batch = _wait(app, intruder, auth, data.pool_id, _batch(app, auth, data.pool_id, "margin"))
            assert batch["status"] == "failed", name
            assert batch["error"].startswith("engine_unavailable: the Dask scheduler"), (name, batch["error"])
            assert tls_cluster.address.split("://")[1] not in batch["error"]
            assert not batch["item_ids"]


def test_settings_refuse_half_a_tls_configuration(pki: Pki, tmp_path: Path) -> None:
    full = {
        "BAIT_DASK_TLS_CA_FILE": pki.ca.cert,
        "BAIT_DASK_TLS_CERT": pki.client.cert,
        "BAIT_DASK_TLS_KEY": pki.client.key,
    }
    ok = Settings.model_validate({"dask_scheduler": "tls://127.0.0.1:8786", **_fields(full)})
    assert ok.dask_tls_cert == pki.client.cert
    cases: list[tuple[dict[str, Any], str]] = [
        ({"dask_scheduler": "tls://127.0.0.1:8786"}, "BAIT_DASK_SCHEDULER is tls://: set BAIT_DASK_TLS_CA_FILE"),
        (
            {"dask_scheduler": "tls://127.0.0.1:8786", "dask_tls_ca_file": pki.ca.cert},
            "set BAIT_DASK_TLS_CERT, BAIT_DASK_TLS_KEY as well",
        ),
        ({"dask_scheduler": "tcp://127.0.0.1:8786", **_fields(full)}, "must be a tls:// address"),
        ({"dask_tls_cert": pki.client.cert}, "needs all three"),
        (
            {"dask_scheduler": "tls://127.0.0.1:8786", **_fields(full), "dask_tls_key": tmp_path / "nowhere.key"},
            "Dask TLS files not found: BAIT_DASK_TLS_KEY=",
        ),
    ]
    for fields, words in cases:
        with pytest.raises(ValidationError, match=words):
            Settings.model_validate(fields)


def _fields(env: dict[str, Path]) -> dict[str, Path]:
    return {name.removeprefix("BAIT_").lower(): value for name, value in env.items()}


def test_a_plain_tcp_scheduler_outside_private_networks_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from worker.distributed import security

    with caplog.at_level(logging.WARNING, logger="worker.distributed"):
        assert security(Settings(dask_scheduler="tcp://127.0.0.1:8786")) is None
        assert security(Settings(dask_scheduler="tcp://10.1.2.3:8786")) is None
        assert security(Settings(dask_scheduler="tcp://dask-scheduler:8786")) is None  # a compose service name
        assert not caplog.records
        assert security(Settings(dask_scheduler="tcp://8.8.8.8:8786")) is None
    assert [r.getMessage() for r in caplog.records] == [
        "BAIT_DASK_SCHEDULER is a plain tcp:// address that is not loopback or private: anyone who reaches a Dask "
        "scheduler can run code on the cluster; use tls:// with BAIT_DASK_TLS_* (docs/distributed.md)"
    ]

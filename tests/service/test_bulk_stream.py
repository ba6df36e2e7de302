"""Bulk uploads that stream in blocks (``bulk_block_bytes`` small, so a file has many): the whole file is one
transaction, so an attacker's file that goes bad in a late block (NaN in block 7, an id repeated from block 1,
a ragged row, a truncated or corrupted member, a content bomb) is a 4xx and leaves nothing written; a
good file lands whole, in file order, with the counts right."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.store import counts as counts_repo
from service.store.models import Item
from tests.service.bombs import MIB, Member, npy_header, zip_bytes
from tests.service.conftest import assert_error, embeddings, item_rows, make_pool

Auth = dict[str, str]
D = 8
BLOCK = 4096  # bytes of rows per block: 4096 // (8 * 4 + id) ~ 50 rows of 8 float32 values
MakeClient = Callable[..., TestClient]


def npz(**arrays: Any) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def parquet(ids: list[str], emb: Any, row_group_size: int | None = None, **extra: Any) -> bytes:
    buf = io.BytesIO()
    table = pa.table({"id": ids, "embedding": [list(map(float, r)) for r in emb], **extra})
    pq.write_table(table, buf, row_group_size=row_group_size)
    return buf.getvalue()


def ids_of(n: int, prefix: str = "r") -> list[str]:
    return [f"{prefix}{i:05d}" for i in range(n)]


def bulk(client: TestClient, auth: Auth, pool: str, body: bytes, **params: str) -> Any:
    return client.post(
        f"/v1/pools/{pool}/items:bulk",
        content=body,
        params=params,
        headers={**auth, "Content-Type": "application/octet-stream"},
    )


@pytest.fixture
def small_blocks(limited_client: MakeClient) -> TestClient:
    return limited_client(bulk_block_bytes=BLOCK)


def nothing_written(db: sessionmaker[Session], pool: str) -> None:
    assert item_rows(db, pool) == {}
    with db() as s:
        assert counts_repo.tallies(s, [pool])[pool] == {}


# ------------------------------------------------------------------------------------------ good files


@pytest.mark.parametrize("fmt", ["npz", "parquet"])
def test_many_blocks_land_whole_in_file_order_with_counts(
    small_blocks: TestClient, auth: Auth, db: sessionmaker[Session], fmt: str
) -> None:
    pool = make_pool(small_blocks, auth, embedding_dim=D)
    n = 1000  # ~20 blocks
    ids = ids_of(n)[::-1]  # not sorted: the order is the file's
    emb = embeddings(n, D, seed=5)
    body = npz(ids=np.array(ids), embeddings=emb) if fmt == "npz" else parquet(ids, emb, row_group_size=300)
    resp = bulk(small_blocks, auth, pool["id"], body)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"created": n, "updated": 0}
    rows = item_rows(db, pool["id"])
    assert [r.external_id for r in sorted(rows.values(), key=lambda r: r.id)] == ids
    for i in (0, 49, 50, 999):
        assert rows[ids[i]].embedding == emb[i].astype("<f4").tobytes()
    view = small_blocks.get(f"/v1/pools/{pool['id']}", headers=auth).json()
    assert view["counts"] == {"items": n, "unlabeled": n, "reserved": 0, "labeled": 0}
    # again, half of it changed: an upsert that keeps labels
    labels = [{"item_id": ids[3], "label": "cat"}]
    assert small_blocks.put(f"/v1/pools/{pool['id']}/labels", json={"labels": labels}, headers=auth).status_code == 200
    emb2 = emb.copy()
    emb2[::2] += 1
    more = ids + ids_of(10, "new")
    emb3 = np.concatenate([emb2, embeddings(10, D, seed=6)])
    body = npz(ids=np.array(more), embeddings=emb3) if fmt == "npz" else parquet(more, emb3, row_group_size=300)
    assert bulk(small_blocks, auth, pool["id"], body).json() == {"created": 10, "updated": n}
    rows = item_rows(db, pool["id"])
    assert rows[ids[2]].embedding == emb2[2].astype("<f4").tobytes()
    assert (rows[ids[3]].status, rows[ids[3]].label) == ("labeled", "cat")
    view = small_blocks.get(f"/v1/pools/{pool['id']}", headers=auth).json()
    assert view["counts"] == {"items": n + 10, "unlabeled": n + 9, "reserved": 0, "labeled": 1}


def test_split_and_content_apply_to_every_block(
    small_blocks: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(small_blocks, auth, embedding_dim=D)
    n = 300
    ids = ids_of(n)
    data = np.array([f'{{"text": "item {i}"}}' if i % 7 == 0 else "" for i in range(n)])
    body = npz(ids=np.array(ids), embeddings=embeddings(n, D), data=data)
    resp = bulk(small_blocks, auth, pool["id"], body, split="validation")
    assert resp.status_code == 200, resp.text
    rows = item_rows(db, pool["id"])
    assert {r.split for r in rows.values()} == {"validation"}
    assert rows[ids[294]].data == {"text": "item 294"}
    assert rows[ids[295]].data is None
    view = small_blocks.get(f"/v1/pools/{pool['id']}", headers=auth).json()
    assert view["validation_counts"] == {"items": n, "labeled": 0}


def test_column_major_embeddings_are_read_whole_within_the_budget(
    small_blocks: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(small_blocks, auth, embedding_dim=D)
    emb = np.asfortranarray(embeddings(200, D, seed=8))
    resp = bulk(small_blocks, auth, pool["id"], npz(ids=np.array(ids_of(200)), embeddings=emb))
    assert resp.json() == {"created": 200, "updated": 0}
    assert item_rows(db, pool["id"])["r00150"].embedding == np.ascontiguousarray(emb[150]).tobytes()


# ---------------------------------------------------------------------------- an attacker's late blocks


def _late(n: int = 1000, bad_row: int = 350) -> tuple[list[str], np.ndarray, int]:
    """A file of ``n`` rows whose row ``bad_row`` (block 7 of ~20) is where it goes wrong."""
    return ids_of(n), embeddings(n, D, seed=1), bad_row


@pytest.mark.parametrize("fmt", ["npz", "parquet"])
def test_nan_in_block_7_is_400_and_nothing_is_written(
    small_blocks: TestClient, auth: Auth, db: sessionmaker[Session], fmt: str
) -> None:
    pool = make_pool(small_blocks, auth, embedding_dim=D)
    ids, emb, bad = _late()
    emb[bad, 3] = np.nan
    body = npz(ids=np.array(ids), embeddings=emb) if fmt == "npz" else parquet(ids, emb, row_group_size=100)
    err = assert_error(bulk(small_blocks, auth, pool["id"], body), 400, "invalid_embedding", "finite", ids[bad])
    assert err["details"] == {"ids": [ids[bad]]}
    nothing_written(db, pool["id"])


def test_an_id_repeated_from_block_1_in_block_7_is_400_and_nothing_is_written(
    small_blocks: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(small_blocks, auth, embedding_dim=D)
    ids, emb, bad = _late()
    ids[bad] = ids[2]
    err = assert_error(
        bulk(small_blocks, auth, pool["id"], npz(ids=np.array(ids), embeddings=emb)), 400, "duplicate_id", ids[2]
    )
    assert err["details"] == {"duplicates": [ids[2]]}
    nothing_written(db, pool["id"])


def test_a_bad_id_in_a_late_block_is_refused_and_nothing_is_written(
    small_blocks: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(small_blocks, auth, embedding_dim=D)
    ids, emb, bad = _late()
    ids[bad] = "a/b"
    resp = bulk(small_blocks, auth, pool["id"], npz(ids=np.array(ids), embeddings=emb))
    assert resp.status_code == 400, resp.text
    assert "a/b" in resp.json()["error"]["message"]
    nothing_written(db, pool["id"])


def test_a_row_of_another_dimension_mid_stream_is_400_naming_the_row(
    small_blocks: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(small_blocks, auth, embedding_dim=D)
    ids, emb, bad = _late()
    rows = [list(map(float, r)) for r in emb]
    rows[bad] = rows[bad][:-1]
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": ids, "embedding": rows}), buf, row_group_size=100)
    err = assert_error(
        bulk(small_blocks, auth, pool["id"], buf.getvalue()), 400, "invalid_file", "ragged", f"row {bad} has {D - 1}"
    )
    assert err["details"] == {"row": bad}
    nothing_written(db, pool["id"])


def test_a_file_of_the_wrong_dimension_is_refused_before_any_block(
    small_blocks: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(small_blocks, auth, embedding_dim=D)
    body = npz(ids=np.array(ids_of(1000)), embeddings=embeddings(1000, D + 1))
    assert_error(bulk(small_blocks, auth, pool["id"], body), 400, "invalid_embedding", f"expected {D}, got {D + 1}")
    nothing_written(db, pool["id"])


def test_bad_content_in_a_late_block_is_refused_and_nothing_is_written(
    small_blocks: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(small_blocks, auth, embedding_dim=D)
    ids, emb, bad = _late()
    data = np.array(["{}"] * len(ids))
    data[bad] = "[not json"
    resp = bulk(small_blocks, auth, pool["id"], npz(ids=np.array(ids), embeddings=emb, data=data))
    assert resp.status_code == 400, resp.text
    assert ids[bad] in resp.json()["error"]["message"]
    nothing_written(db, pool["id"])


def _member(name: str, arr: np.ndarray) -> Member:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return Member(f"{name}.npy", buf.getvalue())


def test_a_member_cut_short_after_many_blocks_is_400_and_nothing_is_written(
    limited_client: MakeClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    # 1024 x 256 float32 (1 MiB) declared; the zip entry says it holds only the first ~600 KiB.
    client = limited_client(bulk_block_bytes=64 * 1024)
    pool = make_pool(client, auth, embedding_dim=256)
    header = npy_header((1024, 256))
    cut = Member("embeddings.npy", header, 1, declared_size=len(header) + 600 * 1024)
    body = zip_bytes([cut, _member("ids", np.array(ids_of(1024)))])
    assert_error(bulk(client, auth, pool["id"], body), 400, "invalid_file", "embeddings")
    nothing_written(db, pool["id"])


def test_a_corrupted_member_found_by_its_crc_at_the_end_is_400_and_nothing_is_written(
    limited_client: MakeClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    client = limited_client(bulk_block_bytes=64 * 1024)
    pool = make_pool(client, auth, embedding_dim=256)
    bad = Member("embeddings.npy", npy_header((1024, 256)), 1, correct_crc=False)
    body = zip_bytes([bad, _member("ids", np.array(ids_of(1024)))])
    assert_error(bulk(client, auth, pool["id"], body), 400, "invalid_file", "embeddings")
    nothing_written(db, pool["id"])


def test_a_content_array_that_would_inflate_past_the_limit_is_413_before_reading(
    limited_client: MakeClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    budget = 4 * MIB
    client = limited_client(max_upload_inflated_bytes=budget, bulk_block_bytes=BLOCK)
    pool = make_pool(client, auth, embedding_dim=D)
    n = 100
    data = Member("data.npy", npy_header((n,), "<U10000000"))  # 100 x 40 MB strings, declared in a header
    body = zip_bytes([_member("ids", np.array(ids_of(n))), _member("embeddings", embeddings(n, D)), data])
    err = assert_error(bulk(client, auth, pool["id"], body), 413, "payload_too_large", "'data'", f"{budget:,}")
    assert err["details"]["inflated_bytes"] == n * 10_000_000 * 4
    nothing_written(db, pool["id"])


def test_ids_of_a_huge_width_stay_within_the_budget_and_are_refused(
    limited_client: MakeClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    # Each id is a 100,000-character string (400 kB as UTF-32): blocks shrink to one row, ids over 512 refused.
    client = limited_client(bulk_block_bytes=BLOCK)
    pool = make_pool(client, auth, embedding_dim=D)
    ids = np.array(["x" * 100_000, "y"])
    resp = bulk(client, auth, pool["id"], npz(ids=ids, embeddings=embeddings(2, D)))
    assert_error(resp, 422, "validation_error", "512")
    nothing_written(db, pool["id"])


@pytest.mark.parametrize(
    "header",
    [
        b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4',}\n",  # a dict without shape
        b"\x93NUMPY\x01\x00\x08\x00garbage\n",
        b"\x93NUMPY\x09\x00",  # an unknown version
        b"not an npy at all",
    ],
    ids=["no-shape", "garbage", "version", "no-magic"],
)
def test_malformed_npy_headers_are_400(
    small_blocks: TestClient, auth: Auth, db: sessionmaker[Session], header: bytes
) -> None:
    pool = make_pool(small_blocks, auth, embedding_dim=D)
    body = zip_bytes([_member("ids", np.array(["a"])), Member("embeddings.npy", header)])
    assert_error(bulk(small_blocks, auth, pool["id"], body), 400, "invalid_file", "embeddings")
    nothing_written(db, pool["id"])


def test_a_parquet_file_decoding_past_the_budget_in_a_late_batch_is_413_and_nothing_is_written(
    limited_client: MakeClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    # Dictionary-encoded zeros: the footer's sizes are small, the decoded batches are what passes the budget.
    budget = 2 * MIB
    client = limited_client(max_upload_inflated_bytes=budget, bulk_block_bytes=256 * 1024)
    pool = make_pool(client, auth, embedding_dim=64)
    rows = 20_000
    table = pa.table(
        {
            "id": ids_of(rows),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(rows * 64, np.float32)), 64),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", use_dictionary=True, row_group_size=rows // 4)
    assert len(buf.getvalue()) < budget
    err = assert_error(bulk(client, auth, pool["id"], buf.getvalue()), 413, "payload_too_large", f"{budget:,}")
    assert err["details"]["limit_bytes"] == budget
    nothing_written(db, pool["id"])
    with db() as s:
        assert s.execute(select(func.count()).select_from(Item)).scalar_one() == 0

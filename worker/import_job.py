"""The import job: a Parquet dataset registered by reference (``POST /v1/pools/{pool}/items:import``).

``run_import(job_id)`` moves the job ``queued -> running`` (a duplicate delivery is a no-op), resolves its
source again in its origin (:func:`service.domain.imports.origin_for`: the tenant's data folder for
``file://``, its assigned object-store prefixes for ``s3://``, whose endpoint the outbound guard checks again;
the files may have changed since the request was checked) and works in three stages, each with progress
``{stage, done, total}``; files and objects are read the same way:

1. ``open``: every file's footer (one file at a time): its schema (``id`` string, ``embedding``
   list<float> / fixed_size_list, optional ``data`` JSON strings and ``split``), its rows and the inflated
   size of the columns read, against ``import_max_rows`` and ``import_max_bytes`` all files together;
   nothing else is read yet, so a Parquet bomb fails here (or, a footer that understates, as its batches
   decode);
2. ``validate``: every row, in record batches of about ``bulk_block_bytes``, with the checks of the bulk
   upload (:func:`service.domain.items.check_block`: ids, duplicates across every file, dimension, finite
   values, content, split);
3. ``write``: the files read again and upserted with the bulk upload's writer
   (:func:`service.domain.items.write_block`) in **one transaction**, which also marks the job succeeded:
   the items appear all at once with the job's success, or not at all. The files are checked again as
   they are written, and a file that changed since the ``open`` stage (device, inode, size, mtime; an
   object's size, ETag and Last-Modified) fails the import.

A bad file fails the job with the file (relative to the tenant's folder or prefix) and the row named;
nothing is written; the message never shows the S3 endpoint. Memory stays at a few batches whatever the
dataset's size, plus the set of ids seen (for duplicates). On PostgreSQL the ``write`` stage reports
progress per batch; on SQLite (one writer at a time) it reports its start and its end only.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings, tenant_data_root
from service.db import session_scope
from service.domain import ingest, store_arrivals
from service.domain import items as items_domain
from service.domain.imports import FileIdentity, InvalidSource, Origin, SourceFile, origin_for, redact_endpoint
from service.errors import InvalidEmbedding, ServiceError
from service.store import imports as repo
from service.store import items as items_repo
from service.store.attempts import finish_attempt
from service.store.models import ImportJob, Pool, Tenant
from worker import context
from worker.runtime import Stopped, Tracker, start_job, utcnow

log = logging.getLogger(__name__)

ID_COLUMN, EMBEDDING_COLUMN, DATA_COLUMN, SPLIT_COLUMN = "id", "embedding", "data", "split"


class ImportFailed(Exception):
    """The dataset cannot be imported; the message (file and row named) is the job's error."""


class ImportTracker(Tracker):
    """:class:`worker.runtime.Tracker` on import jobs."""

    def _touch(self, s: Session, progress: tuple[str, int, int] | None) -> bool:
        return repo.touch_job(s, self.batch_id, self.attempt, utcnow(), progress)


@dataclass
class _File:
    source: SourceFile
    identity: FileIdentity
    rows: int
    budget: int  # inflated bytes this file may decode to (what the files before it left of the limit)


def run_import(job_id: str) -> None:
    """Run one import job (the job id is the import job's id)."""
    env = context.env()
    settings = env.settings
    factory = env.sessionmaker
    started = start_job(
        factory,
        "import job",
        job_id,
        repo.start_job,
        lambda s, jid: repo.get_job(s, None, jid),
        lambda job, attempt, _now: (attempt, job.pool_id, job.source),
    )
    if started is None:
        return
    attempt, pool_id, source = started
    log.info("import job %s: attempt %d on pool %s", job_id, attempt, pool_id)
    try:
        with ImportTracker(factory, job_id, attempt, settings.job_heartbeat_seconds) as tracker:
            _run(factory, job_id, attempt, pool_id, source, tracker, settings)
    except Stopped:
        log.info("import job %s: stopped (taken over or deleted)", job_id)
    except ImportFailed as exc:
        log.info("import job %s failed: %s", job_id, exc)
        _fail(factory, job_id, attempt, redact_endpoint(settings.import_s3_endpoint, str(exc)))
    except Exception as exc:
        log.error("import job %s failed:\n%s", job_id, traceback.format_exc())
        error = f"internal error: {type(exc).__name__}: {exc}"
        _fail(factory, job_id, attempt, redact_endpoint(settings.import_s3_endpoint, error))


def _fail(factory: sessionmaker[Session], job_id: str, attempt: int, error: str) -> None:
    now = utcnow()
    with session_scope(factory) as s:
        finish_attempt(
            s,
            ImportJob,
            job_id,
            attempt,
            {"status": "failed", "error": error, "finished_at": now, "heartbeat_at": now},
            outcome="failed",
            reason=error,
        )


def _load_pool(factory: sessionmaker[Session], pool_id: str) -> tuple[Pool, str]:
    """The pool (detached: its dimension is what the rows are checked against) and its tenant's name."""
    with session_scope(factory) as s:
        pool = s.get(Pool, pool_id)
        if pool is None:
            raise Stopped(pool_id)
        tenant = s.get(Tenant, pool.tenant_id)
        s.expunge(pool)
        return pool, tenant.name if tenant is not None else ""


def _located(file: SourceFile, block: ingest.Block | None, exc: ServiceError) -> ImportFailed:
    """The error of a bad row as the job reports it: the file, the row when it can be told, the problem."""
    details = exc.details if isinstance(exc.details, dict) else {}
    row: int | None = details.get("row") if isinstance(details.get("row"), int) else None
    if row is None and block is not None:
        named: list[Any] = []
        for key in ("ids", "duplicates", "invalid", "id"):
            value = details.get(key)
            named += value if isinstance(value, list) else [value] if value is not None else []
        names = {n.get("id") if isinstance(n, dict) else n for n in named}
        # error details show long ids cut to 80 characters
        row = next((block.start + i for i, ext in enumerate(block.ids) if ext in names or ext[:80] in names), None)
        if row is None and isinstance(exc, InvalidEmbedding):
            row = block.start  # a dimension the pool does not have: every row of the block, from its first
    where = f"{file.shown}, row {row}" if row is not None else file.shown
    return ImportFailed(f"{where}: {exc.message}")


def _too_large(file: SourceFile, exc: ServiceError, settings: Settings, budget: int, how: str) -> ImportFailed:
    """A Parquet bomb (or just too much data): the file, what it inflates to, and the import's limit."""
    details = exc.details if isinstance(exc.details, dict) else {}
    size = details.get("inflated_bytes")
    return ImportFailed(
        f"{file.shown}: the import's files inflate to more than the limit of {settings.import_max_bytes:,} bytes "
        f"(BAIT_IMPORT_MAX_BYTES, all files together): this file {how} "
        f"{f'{size:,}' if isinstance(size, int) else 'more'} bytes where {budget:,} were left; import less at once"
    )


@contextmanager
def _opened(file: _File, origin: Origin) -> Iterator[ingest.ParquetBulkFile]:
    """A file of the import opened again (checked to be the one the ``open`` stage saw) as a bulk file."""
    try:
        fh, identity = origin.open(file.source)
    except InvalidSource as exc:
        raise ImportFailed(exc.message) from None
    with fh:
        if identity != file.identity:
            raise ImportFailed(f"{file.source.shown}: the file changed while it was imported; start the import again")
        try:
            yield _bulk(fh, file.budget)
        except ServiceError as exc:
            raise _located(file.source, None, exc) from None


def _bulk(fh: Any, budget: int) -> ingest.ParquetBulkFile:
    return ingest.ParquetBulkFile(fh, ID_COLUMN, EMBEDDING_COLUMN, DATA_COLUMN, False, budget, split_col=SPLIT_COLUMN)


def _open_all(files: list[SourceFile], origin: Origin, settings: Settings, tracker: Tracker) -> list[_File]:
    """Stage ``open``: every footer checked, rows and inflated bytes summed against the import's limits."""
    tracker.stage("open", 0, len(files))
    out: list[_File] = []
    rows = used = 0
    for i, source in enumerate(files):
        budget = settings.import_max_bytes - used
        try:
            fh, identity = origin.open(source)
        except InvalidSource as exc:
            raise ImportFailed(exc.message) from None
        with fh:
            try:
                bulk = _bulk(fh, budget)
            except ServiceError as exc:
                if exc.code == "payload_too_large":
                    raise _too_large(source, exc, settings, budget, "declares") from None
                raise _located(source, None, exc) from None
        rows += bulk.n
        used += bulk.declared
        if rows > settings.import_max_rows:
            raise ImportFailed(
                f"{source.shown}: the files so far declare {rows:,} rows, more than the limit of "
                f"{settings.import_max_rows:,} (BAIT_IMPORT_MAX_ROWS)"
            )
        out.append(_File(source, identity, bulk.n, budget))
        tracker.callback(i + 1, len(files))
    if not rows:
        raise ImportFailed("the source's files hold no rows")
    return out


def _checked_blocks(
    files: list[_File], origin: Origin, settings: Settings, pool: Pool, data_root: Path | None
) -> Iterator[items_domain.CheckedBlock]:
    """Every row of every file in record batches, each checked as the bulk upload checks a block."""
    seen: set[str] = set()
    for file in files:
        with _opened(file, origin) as bulk:
            blocks = bulk.blocks(settings.bulk_block_bytes, int(pool.embedding_dim))
            while True:
                try:
                    block = next(blocks)
                except StopIteration:
                    break
                except ServiceError as exc:
                    if exc.code == "payload_too_large":
                        raise _too_large(file.source, exc, settings, file.budget, "decodes to") from None
                    raise _located(file.source, None, exc) from None
                try:
                    yield items_domain.check_block(pool, block, seen, settings.max_item_data_bytes, data_root)
                except ServiceError as exc:
                    raise _located(file.source, block, exc) from None


def _run(
    factory: sessionmaker[Session],
    job_id: str,
    attempt: int,
    pool_id: str,
    source: str,
    tracker: Tracker,
    settings: Settings,
) -> None:
    pool, tenant_name = _load_pool(factory, pool_id)
    data_root = tenant_data_root(settings, tenant_name)  # what file:// references in `data` must lie under
    try:
        origin = origin_for(source, settings, tenant_name)
        sources = origin.resolve(source, settings.import_max_files)
    except ServiceError as exc:
        raise ImportFailed(exc.message) from None
    files = _open_all(sources, origin, settings, tracker)
    total = sum(f.rows for f in files)

    tracker.stage("validate", 0, total)
    done = 0
    for checked in _checked_blocks(files, origin, settings, pool, data_root):
        done += len(checked.block.ids)
        tracker.callback(done, total)

    tracker.stage("write", 0, total)
    with session_scope(factory) as s:
        live = s.get(Pool, pool_id)
        if live is None:
            raise Stopped(pool_id)
        live_progress = s.get_bind().dialect.name == "postgresql"  # SQLite: the write holds the only write lock
        now = utcnow()
        done = 0
        with items_repo.BulkUpsert(s, pool_id, now) as writer:
            for checked in _checked_blocks(files, origin, settings, live, data_root):
                items_domain.write_block(s, live, writer, checked, None, now)
                done += len(checked.block.ids)
                if live_progress:
                    tracker.callback(done, total)
        tracker.check()
        counts = {"files": len(files), "rows": done, "created": writer.created, "updated": writer.updated}
        finished = _finished_values(counts, utcnow())
        if not finish_attempt(s, ImportJob, job_id, attempt, finished, outcome="succeeded"):
            raise Stopped(job_id)  # taken over meanwhile: roll the rows back, the other attempt writes them
        # the pool store's new version, written by a job once the rows have committed (never on a rollback)
        store = store_arrivals.write_on_commit(s, context.queue_or_none(), settings, pool_id)
    log.info("import job %s: %s%s", job_id, counts, "; pool store write queued" if store else "")


def _finished_values(counts: dict[str, int], now: datetime) -> dict[str, Any]:
    return {
        "status": "succeeded",
        "error": None,
        "counts": counts,
        "progress_stage": "done",
        "progress_done": counts["rows"],
        "progress_total": counts["rows"],
        "finished_at": now,
        "heartbeat_at": now,
    }

"""Import by reference: a Parquet dataset the tenant already has, registered as items by a worker.

``POST /v1/pools/{pool}/items:import {"source": "file:///.../*.parquet"}`` checks the source here, at
request time (a 400 naming the problem, nothing written), records an import job and submits it; the job
(:mod:`worker.import_job`) resolves the source again (the files may have changed since), reads the files
in record batches and writes every row in one transaction at its end.

Sources: ``file://`` only, under the tenant's data folder (:func:`service.config.tenant_data_root`, the
folder embed jobs read references from), as

- one file: ``file:///data/acme/ds/part-0.parquet``;
- a folder: ``file:///data/acme/ds/`` -- every ``*.parquet`` file under it, in sub-folders too (names
  starting with ``.`` or ``_`` skipped, as Spark/pyarrow datasets write ``_SUCCESS`` and ``_metadata``;
  symbolic links to folders are not followed);
- a glob in the last part of the path: ``file:///data/acme/ds/part-*.parquet``.

Every path is resolved (``..`` and symbolic links followed) and must lie under the real root, every file
too: a link that points out of the folder refuses the whole source. Files are read in name order.
Object stores (``s3://``, ``gs://``, ...) are refused: the service ships no fsspec filesystem for them.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote

from sqlalchemy.orm import Session

from service import catalog
from service.config import Settings
from service.domain.recovery import JobKind, Recovery, job_state, sweep
from service.errors import BadRequest, NotFound
from service.queue import JobQueue, enqueue_on_commit
from service.store import imports as repo
from service.store.models import ImportJob, Pool
from service.urls import split_url

GLOB_CHARS = "*?["
OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "hdfs", "http", "https", "ftp", "sftp")


class InvalidSource(BadRequest):
    code = "invalid_source"  # not file://, outside the tenant's folder, nothing found, too many files


@dataclass(frozen=True)
class SourceFile:
    """One file of a source: its real path and how messages name it (relative to the tenant's folder)."""

    path: Path
    shown: str


def shown_path(path: Path, real_root: Path) -> str:
    """``path`` relative to the tenant's folder: messages never show the server's absolute paths."""
    return str(path.relative_to(real_root)) if path.is_relative_to(real_root) else path.name


def _inside(raw: str, real_root: Path, what: str) -> Path:
    real = Path(os.path.realpath(raw))
    if not real.is_relative_to(real_root):
        raise InvalidSource(
            f"{what} lies outside this tenant's data folder (after resolving `..` and symbolic links); "
            "only files under it can be imported"
        )
    return real


def resolve_source(source: str, root: Path | None, max_files: int) -> list[SourceFile]:
    """The Parquet files a source names, each checked to lie under ``root`` (the tenant's folder).

    Raises:
        InvalidSource: another scheme than file://, no data folder for the tenant, a path that is not
            absolute, outside the folder (or a file of it linking out), nothing found, more than
            ``max_files`` files.
    """
    if not isinstance(source, str):
        raise InvalidSource("source must be a file:// URL string")
    parts = split_url(source, "source")
    scheme = parts.scheme.lower()
    if scheme != "file":
        known = f"{scheme}:// sources are not supported" if scheme in OBJECT_STORES else None
        raise InvalidSource(
            f"{known or f'unsupported source {source[:80]!r}'}: import from file:///absolute/path under this "
            "tenant's data folder (one .parquet file, a folder of them, or a glob such as "
            "file:///data/acme/ds/*.parquet); object stores (s3://, gs://, ...) are not available on this service",
            {"scheme": scheme or None},
        )
    if root is None:
        raise InvalidSource(
            "file:// imports are disabled for this tenant: the operator has not set BAIT_DATA_ROOT "
            "(or assigned the tenant a folder in BAIT_TENANT_DATA_ROOTS)"
        )
    if parts.netloc not in ("", "localhost"):
        raise InvalidSource(f"file:// source with a host ({parts.netloc!r}): use file:///absolute/path")
    if parts.query or parts.fragment:
        raise InvalidSource("file:// source with a `?` or `#`: percent-encode them in a path (%3F, %23)")
    raw = unquote(parts.path)
    if not raw.startswith("/") or "\x00" in raw:
        raise InvalidSource("file:// source must name an absolute path (file:///...)")
    real_root = Path(os.path.realpath(root))
    head, tail = os.path.split(raw)
    if any(c in head for c in GLOB_CHARS):
        raise InvalidSource("a glob (`*`, `?`, `[`) may only be in the last part of the path, e.g. .../ds/*.parquet")
    candidates: list[Path]
    if any(c in tail for c in GLOB_CHARS):
        folder = _inside(head or "/", real_root, "the source's folder")
        if not folder.is_dir():
            raise InvalidSource(f"no such folder in this tenant's data folder: {shown_path(folder, real_root)}")
        names = sorted(n for n in os.listdir(folder) if fnmatch.fnmatchcase(n, tail) and not n.startswith("."))
        candidates = [folder / n for n in names]
    else:
        target = _inside(raw, real_root, "the source")
        if target.is_dir():
            candidates = _walk(target, max_files)
        elif target.is_file():
            candidates = [target]
        else:
            raise InvalidSource(f"nothing at {shown_path(target, real_root)} in this tenant's data folder")
    files: list[SourceFile] = []
    for path in candidates:
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(real_root):
            raise InvalidSource(
                f"{shown_path(path, real_root)} is a symbolic link out of this tenant's data folder; "
                "only files under it can be imported"
            )
        if not real.is_file():
            continue  # a folder matched by the glob
        files.append(SourceFile(real, shown_path(path, real_root)))
        if len(files) > max_files:
            raise InvalidSource(
                f"the source names more than {max_files} files (BAIT_IMPORT_MAX_FILES): import it in parts",
                {"limit": max_files},
            )
    if not files:
        raise InvalidSource(f"no Parquet files found at {source[:200]!r}")
    return files


def _walk(folder: Path, max_files: int) -> list[Path]:
    """``*.parquet`` files under ``folder`` in path order (hidden and ``_`` names skipped, folder links
    not followed); stops listing past ``max_files`` (the caller refuses the source)."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        for name in sorted(filenames):
            if name.endswith(".parquet") and not name.startswith((".", "_")):
                found.append(Path(dirpath) / name)
        if len(found) > max_files:
            break
    return sorted(found)


@dataclass(frozen=True)
class FileIdentity:
    """What an opened file was: a file that changes between the job's passes fails the import."""

    device: int
    inode: int
    size: int
    mtime_ns: int


def open_source_file(file: SourceFile, root: Path) -> tuple[IO[bytes], FileIdentity]:
    """Open a resolved file for reading without following a link planted since it was resolved, and check
    that what was opened is a regular file under ``root`` (on Linux, by the descriptor's own path).

    Raises:
        InvalidSource: the file moved out of the folder, became a link or a non-file, or vanished.
    """
    real_root = Path(os.path.realpath(root))
    try:
        fd = os.open(file.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InvalidSource(f"{file.shown}: cannot open it ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidSource(f"{file.shown}: not a regular file")
        proc = Path(f"/proc/self/fd/{fd}")
        if proc.exists() and not Path(os.readlink(proc)).is_relative_to(real_root):
            raise InvalidSource(f"{file.shown}: the file moved out of this tenant's data folder")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb"), FileIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


# ------------------------------------------------------------------------------------------------ jobs


def request_import(
    session: Session, queue: JobQueue, pool: Pool, source: str, root: Path | None, settings: Settings
) -> ImportJob:
    """Check the source (400, nothing written) and record an import job, submitted on commit."""
    resolve_source(source, root, settings.import_max_files)
    job = repo.add_job(session, pool.id, source, datetime.now(UTC))
    enqueue_on_commit(session, queue, catalog.RUN_IMPORT, job.id, job_id=job.id)
    return job


def get_job(session: Session, pool: Pool, job_id: str) -> ImportJob:
    job = repo.get_job(session, pool.id, job_id)
    if job is None:
        raise NotFound(f"import {job_id!r} not found in pool {pool.id!r}")
    return job


def list_jobs(session: Session, pool: Pool, limit: int) -> Sequence[ImportJob]:
    return repo.list_jobs(session, pool.id, limit)


def job_view(job: ImportJob) -> dict[str, Any]:
    counts = job.counts or {}
    return {
        "id": job.id,
        "pool_id": job.pool_id,
        "source": job.source,
        **job_state(job),
        "rows_imported": int(counts.get("rows", 0)) if job.status == "succeeded" else 0,
        "counts": counts,
    }


IMPORT_JOB = JobKind(catalog.RUN_IMPORT, "job_id")


def recover_import_jobs(
    session: Session, queue: JobQueue, settings: Settings, now: datetime, report: Recovery, *, assume_dead: bool
) -> None:
    """Re-queue (or fail, out of attempts) import jobs whose worker died; resubmit lost queued ones. A dead
    import wrote no item (its rows are written in one transaction at its end): the next attempt starts over."""
    sweep(session, repo.active_jobs(session), IMPORT_JOB, queue, settings, now, report, assume_dead=assume_dead)

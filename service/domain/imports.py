"""Import by reference: a Parquet dataset the tenant already has, registered as items by a worker.

``POST /v1/pools/{pool}/items:import {"source": "file:///.../*.parquet"}`` checks the source here, at
request time (a 400 naming the problem, nothing written), records an import job and submits it; the job
(:mod:`worker.import_job`) resolves the source again (the files may have changed since), reads the files
in record batches and writes every row in one transaction at its end.

A source is found in an :class:`Origin` (:func:`origin_for` picks it by the source's scheme): where a
tenant's files may be, how a source names them and how one is opened. The job reads both the same way.

``file://`` (:class:`LocalOrigin`): under the tenant's data folder (:func:`service.config.tenant_data_root`,
the folder embed jobs read references from), as

- one file: ``file:///data/acme/ds/part-0.parquet``;
- a folder: ``file:///data/acme/ds/`` -- every ``*.parquet`` file under it, in sub-folders too (names
  starting with ``.`` or ``_`` skipped, as Spark/pyarrow datasets write ``_SUCCESS`` and ``_metadata``;
  symbolic links to folders are not followed);
- a glob in the last part of the path: ``file:///data/acme/ds/part-*.parquet``.

Every path is resolved (``..`` and symbolic links followed) and must lie under the real root, every file
too: a link that points out of the folder refuses the whole source. Files are read in name order.

``s3://`` (:class:`ObjectOrigin`): under a prefix the operator assigned to the tenant
(``BAIT_TENANT_IMPORT_URLS``), read with pyarrow's own S3 client from the operator's endpoint
(``BAIT_IMPORT_S3_ENDPOINT``, ``BAIT_IMPORT_S3_REGION``; credentials from the environment), whose host must
pass the outbound guard (:mod:`service.outbound`). The same three forms (an object, a "folder" prefix
ending or not in ``/``, a glob in the last part); the URL has no query, credentials or fragment, no ``.``
or ``..`` segment, and lies under an assigned prefix compared with its trailing ``/`` (``s3://b/acme/``
never admits ``s3://b/acme-evil/``). Messages name an object by its key relative to that prefix, never
the endpoint. An object's size, ETag and Last-Modified are its identity: one that changes while the job
reads it fails the import.

Other schemes (``gs://``, ``https://``, ...) are refused.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs
from sqlalchemy.orm import Session

from service import catalog
from service.config import Settings, tenant_data_root, tenant_import_prefixes
from service.domain.recovery import JobKind, Recovery, job_state, sweep
from service.errors import BadRequest, NotFound
from service.outbound import OutboundPolicy, OutboundRefused, resolve
from service.queue import JobQueue, enqueue_on_commit
from service.store import imports as repo
from service.store.models import ImportJob, Pool
from service.urls import split_s3, split_url

log = logging.getLogger(__name__)

GLOB_CHARS = "*?["
OBJECT_STORES = ("s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "hdfs", "http", "https", "ftp", "sftp")


class InvalidSource(BadRequest):
    code = "invalid_source"  # not file:// or s3://, outside the tenant's folder or prefixes, nothing found, too many


@dataclass(frozen=True)
class SourceFile:
    """One file of a source: where it is and how messages name it (relative to the tenant's folder or prefix)."""

    path: Path | str  # a local file's real path; an object's "bucket/key"
    shown: str


def shown_path(path: Path, real_root: Path) -> str:
    """``path`` relative to the tenant's folder: messages never show the server's absolute paths."""
    return str(path.relative_to(real_root)) if path.is_relative_to(real_root) else path.name


def unsupported(source: str, scheme: str) -> InvalidSource:
    """The error of a source whose scheme the service does not read."""
    known = f"{scheme}:// sources are not supported" if scheme in OBJECT_STORES else None
    return InvalidSource(
        f"{known or f'unsupported source {source[:80]!r}'}: import from file:///absolute/path under this "
        "tenant's data folder (one .parquet file, a folder of them, or a glob such as "
        "file:///data/acme/ds/*.parquet), or from s3://bucket/prefix/... under an object-store prefix the "
        "operator assigned to this tenant",
        {"scheme": scheme or None},
    )


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
    if parts.scheme.lower() != "file":
        raise unsupported(source, parts.scheme.lower())
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
            raise _too_many(max_files)
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
    tag: str = ""  # an object's ETag and Last-Modified


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


# --------------------------------------------------------------------------------------------- origins


class Origin(Protocol):
    """Where a tenant's sources are: which files a source names there, and how one is opened."""

    def resolve(self, source: str, max_files: int) -> list[SourceFile]:
        """The source's Parquet files, checked (raises :class:`InvalidSource`)."""
        ...

    def open(self, file: SourceFile) -> tuple[IO[bytes], FileIdentity]:
        """A resolved file opened for reading, with what it is now (raises :class:`InvalidSource`)."""
        ...


@dataclass(frozen=True)
class LocalOrigin:
    """``file://`` sources under the tenant's data folder (None: file:// imports refused for the tenant)."""

    root: Path | None

    def resolve(self, source: str, max_files: int) -> list[SourceFile]:
        return resolve_source(source, self.root, max_files)

    def open(self, file: SourceFile) -> tuple[IO[bytes], FileIdentity]:
        if self.root is None:
            raise InvalidSource(f"{file.shown}: file:// imports are disabled for this tenant")
        return open_source_file(file, self.root)


def redact_endpoint(endpoint: str | None, message: str) -> str:
    """``message`` without the S3 endpoint's address (pyarrow's errors name the host it failed to reach)."""
    if not endpoint:
        return message
    parts = urlsplit(endpoint)
    for shown in (endpoint, parts.netloc, parts.hostname):
        if shown:
            message = message.replace(shown, "<object store>")
    return message


@lru_cache(maxsize=4)
def _s3_filesystem(endpoint: str | None, region: str | None) -> pafs.FileSystem:
    """pyarrow's own S3 client (credentials from the environment's usual chain), cached per process."""
    options: dict[str, Any] = {
        "connect_timeout": 10.0,
        "request_timeout": 60.0,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=3),
    }
    if endpoint:
        parts = urlsplit(endpoint)
        options.update(endpoint_override=parts.netloc, scheme=parts.scheme)
    if region:
        options["region"] = region
    return pafs.S3FileSystem(**options)


@dataclass(frozen=True)
class ObjectOrigin:
    """``s3://`` sources under the tenant's assigned prefixes, read from the operator's S3 endpoint.

    Attributes:
        prefixes: ``bucket/key-prefix/`` (always ending in ``/``; ``bucket/`` for a whole bucket).
        endpoint: ``http(s)://host[:port]`` of an S3-compatible store; None: AWS S3.
        region: the S3 region, or None (pyarrow's default).
        policy: the outbound guard's policy, which the endpoint's host must pass.
    """

    prefixes: tuple[str, ...]
    endpoint: str | None
    region: str | None
    policy: OutboundPolicy

    def resolve(self, source: str, max_files: int) -> list[SourceFile]:
        """The objects a source names, each under an assigned prefix, in key order; the endpoint is checked
        by the outbound guard first.

        Raises:
            InvalidSource: no assigned prefix, a URL with a query, credentials, fragment, ``..`` (see
                :func:`service.urls.split_s3`), outside every prefix, an endpoint the guard refuses,
                the store not answering, nothing found, more than ``max_files`` objects.
        """
        if not self.prefixes:
            raise InvalidSource(
                "s3:// imports are not enabled for this tenant: the operator has not assigned it an object-store "
                "prefix (BAIT_TENANT_IMPORT_URLS)"
            )
        try:
            bucket, key = split_s3(source)
        except ValueError as exc:
            raise InvalidSource(f"source: {exc}") from None
        path = f"{bucket}/{key}"
        head, _, tail = path.rpartition("/")
        if any(c in head for c in GLOB_CHARS):
            raise InvalidSource("a glob (`*`, `?`, `[`) may only be in the last part of the key, e.g. .../ds/*.parquet")
        glob = any(c in tail for c in GLOB_CHARS)
        folder_only = glob or path.endswith("/")
        named = f"{head}/" if glob else path
        prefix = self._prefix(named)
        if prefix is None and not folder_only and self._prefix(f"{path}/") is not None:
            prefix, folder_only = f"{path}/", True  # the assigned prefix itself, named without its `/`
        if prefix is None:
            assigned = ", ".join(f"s3://{p}" for p in self.prefixes)
            raise InvalidSource(
                f"s3://{path[:200]} is outside the object-store prefixes assigned to this tenant ({assigned}); "
                "only objects under them can be imported"
            )
        fs = self.filesystem()
        try:
            if glob:
                infos = fs.get_file_info(pafs.FileSelector(head, recursive=False, allow_not_found=True))
                found = [
                    i.path
                    for i in infos
                    if i.type == pafs.FileType.File
                    and fnmatch.fnmatchcase(i.base_name, tail)
                    and not i.base_name.startswith(".")
                ]
            else:
                target = path.rstrip("/")
                kind = pafs.FileType.Directory if folder_only else fs.get_file_info(target).type
                if kind == pafs.FileType.File:
                    found = [target]
                elif kind == pafs.FileType.Directory:
                    infos = fs.get_file_info(pafs.FileSelector(target, recursive=True, allow_not_found=True))
                    found = [i.path for i in infos if i.type == pafs.FileType.File and _listed(i.path, target)]
                else:
                    raise InvalidSource(f"nothing at {path[len(prefix) :] or path} under this tenant's prefix")
        except OSError as exc:
            why = redact_endpoint(self.endpoint, str(exc))
            raise InvalidSource(f"the object store did not answer: {why}") from None
        files = []
        for found_path in sorted(found):
            if not found_path.startswith(prefix):  # listed under a folder inside the prefix: cannot happen
                raise InvalidSource(f"s3://{found_path[:200]} is outside this tenant's prefixes")
            files.append(SourceFile(found_path, found_path[len(prefix) :]))
        if len(files) > max_files:
            raise _too_many(max_files)
        if not files:
            raise InvalidSource(f"no Parquet files found at {source[:200]!r}")
        return files

    def open(self, file: SourceFile) -> tuple[IO[bytes], FileIdentity]:
        """An object opened for reading (its size, ETag and Last-Modified asked for as it opens)."""
        try:
            fh = self.filesystem(guard=False).open_input_file(str(file.path))
            meta = {k.decode() if isinstance(k, bytes) else k: v for k, v in dict(fh.metadata()).items()}
            size = int(fh.size())
        except FileNotFoundError:
            raise InvalidSource(f"{file.shown}: cannot open it (the object no longer exists)") from None
        except OSError as exc:
            raise InvalidSource(f"{file.shown}: cannot open it ({redact_endpoint(self.endpoint, str(exc))})") from None
        tag = " ".join(_text(meta.get(name)) for name in ("ETag", "Last-Modified"))
        return fh, FileIdentity(0, 0, size, 0, tag)

    def filesystem(self, guard: bool = True) -> pafs.FileSystem:
        """The S3 filesystem, its endpoint's host checked by the outbound guard first (unless ``guard`` is
        False: a job checks it once, as it resolves its source)."""
        if guard:
            self.check_endpoint()
        return _s3_filesystem(self.endpoint, self.region)

    def check_endpoint(self) -> None:
        """The endpoint's host (AWS's regional one when none is set) must pass the outbound guard.

        Raises:
            InvalidSource: refused; the message names the setting, never the address (logged for the operator).
        """
        if self.endpoint:
            parts = urlsplit(self.endpoint)
            host = parts.hostname or ""
            port = parts.port or (443 if parts.scheme == "https" else 80)
        else:
            host, port = f"s3.{self.region or 'us-east-1'}.amazonaws.com", 443
        try:
            resolve(host, port, self.policy)
        except OutboundRefused as exc:
            log.warning("s3:// import endpoint refused by the outbound guard: %s", exc.message)
            raise InvalidSource(
                "s3:// imports are unavailable on this service: the outbound guard refuses its S3 endpoint "
                "(BAIT_IMPORT_S3_ENDPOINT: an internal address not in BAIT_OUTBOUND_ALLOW, or a name that does not "
                "resolve); an operator must allow or change it"
            ) from None

    def _prefix(self, path: str) -> str | None:
        return next((p for p in self.prefixes if path.startswith(p)), None)


def _listed(path: str, folder: str) -> bool:
    """An object a folder source imports: ``*.parquet``, no part of its key below the folder starting
    with ``.`` or ``_`` (as :func:`_walk` skips hidden and ``_`` names)."""
    rel = path[len(folder) + 1 :]
    return rel.endswith(".parquet") and not any(part.startswith((".", "_")) for part in rel.split("/"))


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")


def _too_many(max_files: int) -> InvalidSource:
    return InvalidSource(
        f"the source names more than {max_files} files (BAIT_IMPORT_MAX_FILES): import it in parts",
        {"limit": max_files},
    )


def origin_for(source: str, settings: Settings, tenant_name: str) -> Origin:
    """Where ``source`` is read from, by its scheme, for this tenant.

    Raises:
        InvalidSource: not a string, a malformed URL, a scheme other than file:// and s3://.
    """
    if not isinstance(source, str):
        raise InvalidSource("source must be a file:// or s3:// URL string")
    scheme = split_url(source, "source").scheme.lower()
    if scheme == "file":
        return LocalOrigin(tenant_data_root(settings, tenant_name))
    if scheme == "s3":
        return ObjectOrigin(
            tuple(p.removeprefix("s3://") for p in tenant_import_prefixes(settings, tenant_name)),
            settings.import_s3_endpoint,
            settings.import_s3_region,
            OutboundPolicy.from_settings(settings),
        )
    raise unsupported(source, scheme)


# ------------------------------------------------------------------------------------------------ jobs


def request_import(
    session: Session, queue: JobQueue, pool: Pool, source: str, tenant_name: str, settings: Settings
) -> ImportJob:
    """Check the source (400, nothing written) and record an import job, submitted on commit."""
    origin_for(source, settings, tenant_name).resolve(source, settings.import_max_files)
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

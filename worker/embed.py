"""The embed job: encode a pool's items given by reference with the pool's encoder.

``run_embed(job_id)`` moves the job ``queued -> running`` (one conditional UPDATE, so a duplicate
delivery is a no-op), refreshes its heartbeat from a side thread (:class:`worker.runtime.Tracker`), then
works through the items that are ``pending`` (or ``ready`` from another encoder) in chunks of
``encode_batch_size``: resolve each reference (:mod:`worker.references`), encode the chunk, and commit
the chunk's embeddings and per-item errors in one transaction. Progress is ``{stage: "embed", done,
total}``.

A bad reference never sinks the job: a missing file, an unreadable image, a refused address, a
timeout or an oversize download marks that item ``error`` with a message. When a chunk fails to
encode as a whole, its items are encoded one by one so only the bad ones are marked. The job fails
only when the encoder itself cannot run (package missing, module unloadable, output of the wrong
size). It finishes with counts ``{"embedded", "errors", "skipped", "total"}``.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.domain import store_arrivals
from service.outbound import OutboundClient
from service.store import embedding as repo
from service.store.attempts import close_running
from service.store.embedding import Reference
from service.store.models import EncoderModel, Pool, Tenant
from worker import context
from worker.encoder_process import EncoderInputError, EncoderLimitExceeded
from worker.encoders import Encoder, EncoderError, InputSpec, TorchScriptEncoder, encoder_source, make_encoder
from worker.references import (
    BadReference,
    FetchLimits,
    decode_image,
    decode_npy,
    decode_text,
    fetch,
)
from worker.runtime import Stopped, Tracker, start_job, utcnow

log = logging.getLogger(__name__)

FETCH_THREADS = 8  # references of a chunk are fetched concurrently (downloads wait on the network)


class EncoderChanged(Exception):
    """The pool's encoder changed while the job ran: a newer job embeds with the new one."""


class EmbedTracker(Tracker):
    """:class:`worker.runtime.Tracker` (throttled progress, heartbeat thread, cancellation) on embed jobs."""

    def _touch(self, s: Session, progress: tuple[str, int, int] | None) -> bool:
        return repo.touch_job(s, self.batch_id, self.attempt, utcnow(), progress)


def make_decoder(encoder: Encoder, limits: FetchLimits, client: OutboundClient) -> Callable[[Reference], Any]:
    """``decode(reference) -> encoder input``; raises :class:`BadReference` for a bad reference."""
    spec: InputSpec | None = encoder.spec if isinstance(encoder, TorchScriptEncoder) else None

    def decode(ref: Reference) -> Any:
        if encoder.input_kind == "text":
            if ref.text is not None:
                return ref.text
            return decode_text(fetch(str(ref.uri), limits, client))
        if ref.uri is None:
            raise BadReference(f"the {encoder.source} encoder takes a uri, not inline text")
        data = fetch(ref.uri, limits, client)
        if encoder.input_kind == "image":
            assert spec is not None
            return decode_image(data, spec.image_mode, spec.image_size)
        return decode_npy(data)

    return decode


def _resolve(decode: Callable[[Reference], Any], ref: Reference) -> tuple[Any, str | None]:
    try:
        return decode(ref), None
    except BadReference as exc:
        return None, str(exc)
    except Exception as exc:  # a decoder bug must not sink the job either; say what it was
        log.warning("reference of item %s: unexpected %s", ref.external_id, type(exc).__name__, exc_info=True)
        return None, f"{type(exc).__name__}: {exc}"


def encode_chunk(encoder: Encoder, inputs: Sequence[Any], dim: int) -> tuple[list[bytes | None], list[str | None]]:
    """Embeddings (float32 bytes) of ``inputs``, or a per-item error message.

    Arrays of different shapes are encoded in separate groups; a group that fails as a whole is
    encoded item by item. An output of the wrong size is an error of the items that produced it.
    """
    out: list[bytes | None] = [None] * len(inputs)
    err: list[str | None] = [None] * len(inputs)
    groups: dict[Any, list[int]] = {}
    for i, x in enumerate(inputs):
        key = tuple(np.shape(x)) if encoder.input_kind in ("image", "array") else None
        groups.setdefault(key, []).append(i)

    def put(rows: list[int], emb: np.ndarray) -> None:
        if emb.ndim != 2 or emb.shape[1] != dim:
            # An input of another shape may give another size: the item's fault as far as we can tell
            # (an encoder wrong for the pool marks every item with this message).
            for r in rows:
                err[r] = (
                    f"the encoder produced {emb.shape[-1]} values for this input; the pool's embedding_dim is {dim}"
                )
            return
        finite = np.isfinite(emb).all(axis=1)
        for r, v, ok in zip(rows, emb, finite, strict=True):
            if ok:
                out[r] = np.ascontiguousarray(v, dtype="<f4").tobytes()
            else:
                err[r] = "the encoder produced NaN or infinite values"

    for rows in groups.values():
        try:
            put(rows, encoder.encode([inputs[r] for r in rows]))
            continue
        except EncoderError:
            raise
        except EncoderLimitExceeded as exc:  # item by item, each would hit the same limit again
            for r in rows:
                err[r] = str(exc)
            continue
        except Exception:
            if len(rows) == 1:
                pass
            else:
                log.info("a chunk of %d failed to encode; encoding its items one by one", len(rows))
        for r in rows:
            try:
                put([r], encoder.encode([inputs[r]]))
            except EncoderError:
                raise
            except EncoderLimitExceeded as exc:
                err[r] = str(exc)
            except EncoderInputError as exc:
                err[r] = f"the encoder failed on this input: {exc}"
            except Exception as exc:
                err[r] = f"cannot encode: {type(exc).__name__}: {str(exc)[:500]}"
    return out, err


def run_embed(job_id: str) -> None:
    """Run one embed job (the job id is the embed job's id)."""
    env = context.env()
    settings = env.settings
    factory = env.sessionmaker
    started = start_job(
        factory,
        "embed job",
        job_id,
        repo.start_job,
        lambda s, jid: repo.get_job(s, None, jid),
        lambda job, attempt, _now: (attempt, job.pool_id),
    )
    if started is None:
        return
    attempt, pool_id = started
    log.info("embed job %s: attempt %d on pool %s", job_id, attempt, pool_id)
    try:
        with EmbedTracker(factory, job_id, attempt, settings.job_heartbeat_seconds) as tracker:
            counts = _run(factory, pool_id, tracker, settings)
    except Stopped:
        log.info("embed job %s: stopped (taken over or deleted)", job_id)
        return
    except EncoderChanged:
        _finish(factory, job_id, attempt, "cancelled", None, "the pool's encoder changed; a newer job embeds with it")
        return
    except Exception as exc:
        if not isinstance(exc, EncoderError):
            log.error("embed job %s failed:\n%s", job_id, traceback.format_exc())
        message = str(exc) if isinstance(exc, EncoderError) else f"internal error: {type(exc).__name__}: {exc}"
        _finish(factory, job_id, attempt, "failed", None, message)
        return
    _finish(factory, job_id, attempt, "succeeded", counts, None)
    if counts["embedded"]:  # rows became ready (committed chunk by chunk): the pool store's new version
        store_arrivals.write_now(context.queue_or_none(), settings, pool_id)


def _finish(
    factory: sessionmaker[Session],
    job_id: str,
    attempt: int,
    status: str,
    counts: dict[str, int] | None,
    error: str | None,
) -> None:
    with session_scope(factory) as s:
        job = repo.get_job(s, None, job_id, for_update=True)
        if job is None or job.status != "running" or job.attempts != attempt:
            return
        now = utcnow()
        job.status = status
        job.error = error
        if counts is not None:
            job.counts = counts
            job.progress_stage = "done"
            job.progress_done = job.progress_total = counts["total"]
        job.finished_at = now
        job.heartbeat_at = now
        close_running(job, status, error, now)


def _load_pool(factory: sessionmaker[Session], pool_id: str) -> tuple[dict[str, Any], int, Any]:
    with session_scope(factory) as s:
        pool = s.get(Pool, pool_id)
        if pool is None:
            raise Stopped(pool_id)
        config = dict(pool.encoder or {})
        if not config:
            raise EncoderError("the pool has no encoder")
        model = None
        if config.get("kind") == "torchscript":
            row = s.get(EncoderModel, str(config.get("model_id")))
            if row is None or row.tenant_id != pool.tenant_id:
                raise EncoderError(f"the pool's encoder model {config.get('model_id')!r} no longer exists")
            model = (row.id, bytes(row.data), row.sha256, dict(row.config or {}))
        return config, int(pool.embedding_dim), model


def _encoder_unchanged(s: Session, pool_id: str, config: dict[str, Any]) -> bool:
    pool = s.get(Pool, pool_id, with_for_update=True)
    return pool is not None and dict(pool.encoder or {}) == config


def _run(factory: sessionmaker[Session], pool_id: str, tracker: Tracker, settings: Any) -> dict[str, int]:
    config, dim, model = _load_pool(factory, pool_id)
    source = encoder_source(config, None if model is None else model[2])
    with session_scope(factory) as s:
        refs = repo.references_to_embed(s, pool_id, source)
        pool_row = s.get(Pool, pool_id)
        tenant = s.get(Tenant, pool_row.tenant_id) if pool_row is not None else None
        tenant_name = tenant.name if tenant is not None else ""
    total = len(refs)
    counts = {"embedded": 0, "errors": 0, "skipped": 0, "total": total}
    tracker.stage("embed", 0, total)
    if not refs:
        return counts
    encoder = make_encoder(
        config,
        dim=dim,
        device=settings.device,
        batch_size=settings.encode_batch_size,
        model=model,
        timeout=settings.encoder_timeout_seconds,
        memory_bytes=settings.encoder_memory_bytes,
    )
    try:
        return _encode_all(factory, pool_id, tracker, settings, config, dim, encoder, refs, counts, tenant_name)
    finally:
        close = getattr(encoder, "close", None)
        if close is not None:
            close()  # the TorchScript child process


def _encode_all(
    factory: sessionmaker[Session],
    pool_id: str,
    tracker: Tracker,
    settings: Any,
    config: dict[str, Any],
    dim: int,
    encoder: Encoder,
    refs: list[Reference],
    counts: dict[str, int],
    tenant_name: str,
) -> dict[str, int]:
    total = len(refs)
    limits = FetchLimits.from_settings(settings, tenant_name)  # file:// confined to this tenant's folder
    size = int(settings.encode_batch_size)
    with (
        limits.client() as client,
        ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="bait-fetch") as pool,
    ):
        decode = make_decoder(encoder, limits, client)
        for start in range(0, total, size):
            chunk = refs[start : start + size]
            resolved = list(pool.map(lambda r: _resolve(decode, r), chunk))
            good = [i for i, (_, e) in enumerate(resolved) if e is None]
            errors: list[str | None] = [e for _, e in resolved]
            embeddings: list[bytes | None] = [None] * len(chunk)
            t = time.perf_counter()
            emb, enc_err = encode_chunk(encoder, [resolved[i][0] for i in good], dim)
            for j, i in enumerate(good):
                embeddings[i], errors[i] = emb[j], enc_err[j]
            log.debug("encoded %d items in %.3f s", len(good), time.perf_counter() - t)
            tracker.check()
            with session_scope(factory) as s:
                if not _encoder_unchanged(s, pool_id, config):
                    raise EncoderChanged(pool_id)
                written = repo.store_embeddings(s, chunk, embeddings, errors, encoder.source, utcnow())
            for ok, e in zip(written, errors, strict=True):
                # not written: the item's reference changed meanwhile (a newer job encodes it)
                counts["skipped" if not ok else "errors" if e is not None else "embedded"] += 1
            tracker.write(start + len(chunk), total)
    return counts

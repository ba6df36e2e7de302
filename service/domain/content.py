"""Signed, expiring URLs through which Label Studio shows an item's ``file://`` content.

A task never carries a path on our disk: a ``file://`` value in an item's data (or its ``uri``) becomes
``<public url>/labelstudio/content/<token>``, where the token names the pool, the item (external id),
the data key (empty: the item's uri) and an expiry, and is signed with HMAC-SHA256 under a key derived
from the service secret (``BAIT_SECRET_KEY`` or the embedded key file). The route that serves it checks
the signature and expiry, reads the item's *current* reference, and serves the file only if it lies
under the tenant's data root (``$BAIT_DATA_ROOT/<tenant name>/`` or
the folder the operator assigned it).

What is shown inline is an allowlist that cannot run script: raster images and plain text
(:data:`INLINE_TYPES`). Everything else (SVG, HTML, XML, PDF, audio, video, unknown types) is served as
an attachment. Every answer carries ``X-Content-Type-Options: nosniff`` and
``Content-Security-Policy: default-src 'none'; sandbox`` (:data:`service.headers.CONTENT_CSP`), so
even a file opened directly in a signed-in browser runs nothing on the service's origin.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import mimetypes
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from service import crypto
from service.config import Settings, tenant_data_root
from service.errors import NotFound, ServiceError
from service.store.models import Item, Pool, Tenant

# Shown inline: raster images and plain text, which a browser renders without running anything.
INLINE_TYPES = frozenset(
    {"image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp", "image/avif", "text/plain"}
)


class ContentForbidden(ServiceError):
    status_code = 403
    code = "content_forbidden"


def _key(settings: Settings) -> bytes:
    return hashlib.sha256(b"bait content url\x00" + crypto._key_material(settings).encode()).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(settings: Settings, pool_id: str, item_id: str, key: str | None, ttl_s: int, now: float | None = None) -> str:
    """A token for the content of ``item_id`` (data key ``key``, None: the item's uri), valid ``ttl_s``."""
    payload = json.dumps(
        {"p": pool_id, "i": item_id, "k": key or "", "e": int((now or time.time()) + ttl_s)}, separators=(",", ":")
    ).encode()
    mac = hmac.new(_key(settings), payload, hashlib.sha256).digest()
    return f"{_b64(payload)}.{_b64(mac)}"


@dataclass(frozen=True)
class ContentRef:
    pool_id: str
    item_id: str
    key: str | None


def verify(settings: Settings, token: str, now: float | None = None) -> ContentRef:
    """The reference a token names.

    Raises:
        ContentForbidden: a token that is malformed, not ours, or expired.
    """
    try:
        payload_b64, mac_b64 = token.split(".", 1)
        payload, mac = _unb64(payload_b64), _unb64(mac_b64)
    except ValueError as exc:
        raise ContentForbidden("malformed content link") from exc
    if not hmac.compare_digest(hmac.new(_key(settings), payload, hashlib.sha256).digest(), mac):
        raise ContentForbidden("content link signature does not match")
    try:
        body = json.loads(payload)
        pool_id, item_id, key, expires = str(body["p"]), str(body["i"]), str(body["k"]), int(body["e"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ContentForbidden("malformed content link") from exc
    if expires < (now or time.time()):
        raise ContentForbidden("content link expired: import the task again or ask for a new link")
    return ContentRef(pool_id=pool_id, item_id=item_id, key=key or None)


def resolve(session: Session, settings: Settings, ref: ContentRef) -> tuple[Path, str]:
    """The file a reference names now and its media type.

    Raises:
        NotFound: the item or its reference is gone, or the file does not exist.
        ContentForbidden: outside the data root, file:// disabled, or not a media file.
    """
    row = session.execute(
        select(Item.data, Item.uri, Tenant.name)
        .join(Pool, Pool.id == Item.pool_id)
        .join(Tenant, Tenant.id == Pool.tenant_id)
        .where(Item.pool_id == ref.pool_id, Item.external_id == ref.item_id)
    ).one_or_none()
    if row is None:
        raise NotFound("the item behind this content link no longer exists")
    data, uri, tenant_name = row
    value = (data or {}).get(ref.key) if ref.key is not None else uri
    if not isinstance(value, str) or not value.startswith("file://"):
        raise NotFound("the item no longer has this file reference")
    # The same folder the tenant's embed jobs read (worker.references.FetchLimits): the tenant's own.
    root = tenant_data_root(settings, tenant_name)
    if root is None:
        raise ContentForbidden(
            "file:// content is disabled for this tenant: the operator has not set BAIT_DATA_ROOT "
            "(or assigned the tenant a folder)"
        )
    try:
        parts = urlsplit(value)
    except ValueError:
        raise ContentForbidden("the item's file reference is not a valid URL") from None
    raw = unquote(parts.path)
    if parts.netloc not in ("", "localhost") or not raw.startswith("/") or "\x00" in raw:
        raise ContentForbidden("the item's file reference is not a file:///absolute/path")
    real = Path(os.path.realpath(raw))
    if not real.is_relative_to(Path(os.path.realpath(root))):
        raise ContentForbidden("the item's file lies outside the data root (this tenant's own folder)")
    media = mimetypes.guess_type(real.name)[0] or "application/octet-stream"
    if not real.is_file():
        raise NotFound("the item's file does not exist")
    return real, media


def disposition(media: str, filename: str) -> str:
    """``inline`` for :data:`INLINE_TYPES`, else ``attachment`` (the browser saves the file, never renders it)."""
    kind = "inline" if media in INLINE_TYPES else "attachment"
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in filename)[:100] or "content"
    return f'{kind}; filename="{safe}"'


def link_maker(settings: Settings, base_url: str, pool_id: str, item_id: str) -> Callable[[str | None, str], str]:
    """``link(key, value)`` for :func:`service.labelstudio.build_task_data`."""

    def link(key: str | None, value: str) -> str:
        token = sign(settings, pool_id, item_id, key, settings.labelstudio_content_ttl_seconds)
        return f"{base_url.rstrip('/')}/labelstudio/content/{token}"

    return link

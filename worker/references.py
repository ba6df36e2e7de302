"""Resolving an item's data reference (``uri`` or inline ``text``) into an encoder input.

Sources:

- ``file:///abs/path``: only under the tenant's data root (:func:`tenant_data_root`: the folder the
  operator assigned to the tenant in ``tenant_data_roots``, else ``<data_root>/<tenant name>/``); the
  real path (symlinks followed) must lie inside the real root, so ``..``, absolute paths elsewhere and
  symlinks out of it (into another tenant's folder too) are refused; at most ``max_download_bytes``.
- ``http(s)://``: downloaded through the outbound guard (:mod:`service.outbound`: the name resolved
  once and every address checked, loopback/private/link-local/... refused unless the operator
  allowlist names them, the connection pinned to the checked address, redirects re-checked) within
  ``download_timeout_seconds`` and ``max_download_bytes``. An error answer is reported by its status
  line only.
- inline ``text``.

Decoders: UTF-8 text; images with Pillow (to ``H x W x C`` uint8, converted to the encoder's mode and
resized to its size); ``.npy`` arrays with ``allow_pickle=False``.

Every per-item problem raises :class:`BadReference` with a message written for the user; the embed
job stores it on the item and goes on with the next one.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np

from service.config import tenant_data_root as tenant_data_root  # re-exported: the FetchLimits root
from service.outbound import OutboundClient, OutboundError, OutboundPolicy, status_line

MAX_IMAGE_PIXELS = 64_000_000  # a decompression bomb is refused, not decoded


class BadReference(Exception):
    """One item's reference cannot be resolved or decoded; the message is stored on the item."""


@dataclass(frozen=True)
class FetchLimits:
    data_root: Path | None  # the tenant's own folder (see tenant_data_root)
    policy: OutboundPolicy
    max_bytes: int
    timeout_s: float

    @classmethod
    def from_settings(cls, settings: Any, tenant_name: str) -> FetchLimits:
        return cls(
            data_root=tenant_data_root(settings, tenant_name),
            policy=OutboundPolicy.from_settings(settings),
            max_bytes=int(settings.max_download_bytes),
            timeout_s=float(settings.download_timeout_seconds),
        )

    def client(self) -> OutboundClient:
        """A guarded client for this job's downloads (thread-safe: share it between fetch threads)."""
        return OutboundClient(self.policy, timeout=self.timeout_s, max_bytes=self.max_bytes)


# ------------------------------------------------------------------------------------------- fetch


def fetch(uri: str, limits: FetchLimits, client: OutboundClient | None = None) -> bytes:
    """The bytes a ``file://`` or ``http(s)://`` reference points at.

    Raises:
        BadReference: unknown scheme, a file outside the root or missing, a refused address, a
            timeout, an HTTP error status, or more than ``limits.max_bytes`` bytes.
    """
    scheme = urlsplit(uri).scheme.lower()
    if scheme == "file":
        return read_file(uri, limits)
    if scheme in ("http", "https"):
        if client is not None:
            return download(uri, limits, client)
        with limits.client() as own:
            return download(uri, limits, own)
    raise BadReference(f"unsupported reference scheme {scheme or '(none)'!r}: use file://, http:// or https://")


def file_path(uri: str, root: Path | None) -> Path:
    """The real path of a ``file://`` reference, checked to lie under ``root`` (the tenant's folder)."""
    if root is None:
        raise BadReference(
            "file:// references are disabled for this tenant: the operator has not set BAIT_DATA_ROOT "
            "(or assigned the tenant a folder)"
        )
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise BadReference(f"file:// reference with a host ({parts.netloc!r}): use file:///absolute/path")
    raw = unquote(parts.path)
    if not raw.startswith("/") or "\x00" in raw:
        raise BadReference("file:// reference must name an absolute path (file:///...)")
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(raw))
    if not real.is_relative_to(real_root):
        raise BadReference(
            "the file lies outside the data root (this tenant's own folder); only files under it are read"
        )
    return real


def shown_path(path: Path, root: Path | None) -> str:
    """``path`` as an error message may show it: relative to the tenant's data folder, never the server's
    absolute path."""
    if root is not None:
        real_root = Path(os.path.realpath(root))
        if path.is_relative_to(real_root):
            return str(path.relative_to(real_root)) or "."
    return path.name


def read_file(uri: str, limits: FetchLimits) -> bytes:
    path = file_path(uri, limits.data_root)
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > limits.max_bytes:
                raise BadReference(f"file is {size} bytes, more than the limit of {limits.max_bytes}")
            data = fh.read(limits.max_bytes + 1)
    except FileNotFoundError:
        raise BadReference(
            f"file not found in the tenant's data folder: {shown_path(path, limits.data_root)}"
        ) from None
    except IsADirectoryError:
        raise BadReference(f"not a file: {shown_path(path, limits.data_root)}") from None
    except PermissionError:
        raise BadReference(f"file not readable: {shown_path(path, limits.data_root)}") from None
    if len(data) > limits.max_bytes:
        raise BadReference(f"file is more than the limit of {limits.max_bytes} bytes")
    return data


def download(uri: str, limits: FetchLimits, client: OutboundClient) -> bytes:
    """GET an http(s) reference through the guard, within the size and time limits."""
    try:
        r = client.request("GET", uri, timeout=limits.timeout_s, max_bytes=limits.max_bytes)
    except OutboundError as exc:
        raise BadReference(exc.message) from None
    if r.status_code >= 300:
        raise BadReference(f"{status_line(r.status_code)} from {urlsplit(uri).hostname}")
    return r.content


# ------------------------------------------------------------------------------------------ decode


def decode_text(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadReference(f"text is not UTF-8: {exc}") from None
    if not text.strip():
        raise BadReference("text is empty")
    return text


def decode_image(data: bytes, mode: str, size: tuple[int, int] | None) -> np.ndarray:
    """An image file's bytes as an ``H x W x C`` uint8 array in ``mode`` (``L`` or ``RGB``),
    resized (bilinear) to ``size = (H, W)`` when given."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
            if w * h > MAX_IMAGE_PIXELS:
                raise BadReference(f"image of {w} x {h} pixels is larger than {MAX_IMAGE_PIXELS} pixels")
            img.load()
            converted = img.convert(mode)
            if size is not None and converted.size != (size[1], size[0]):
                converted = converted.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            arr = np.asarray(converted, dtype=np.uint8)
    except BadReference:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise BadReference(f"unreadable image: {exc}") from None
    return arr[:, :, None] if arr.ndim == 2 else arr


def decode_npy(data: bytes) -> np.ndarray:
    """An ``.npy`` file's array (numeric dtypes only; never unpickled)."""
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise BadReference(f"unreadable .npy file: {exc}") from None
    if not isinstance(arr, np.ndarray):
        raise BadReference("expected a .npy file holding one array (not an .npz)")
    if arr.dtype.kind not in "biuf":
        raise BadReference(f".npy array of dtype {arr.dtype} is not numeric")
    return arr

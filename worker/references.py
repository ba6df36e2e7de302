"""Resolving an item's data reference (``uri`` or inline ``text``) into an encoder input.

Sources:

- ``file:///abs/path``: only under ``settings.data_root`` (the real path, symlinks followed, must lie
  inside the real root; ``..`` and symlinks out of it are refused); at most ``max_download_bytes``.
- ``http(s)://``: downloaded with httpx within ``download_timeout_seconds`` (whole download, not per
  read) and ``max_download_bytes`` (declared length and streamed count). The host name is resolved
  once, every address it resolves to is checked, and the request goes to that checked address (Host
  header and TLS SNI keep the name), so a DNS answer cannot change between the check and the
  connection. Private, loopback, link-local, multicast, reserved and unspecified addresses are
  refused unless ``allow_private_urls``. Redirects are followed by hand (at most 3), each re-checked.
- inline ``text``.

Decoders: UTF-8 text; images with Pillow (to ``H x W x C`` uint8, converted to the encoder's mode and
resized to its size); ``.npy`` arrays with ``allow_pickle=False``.

Every per-item problem raises :class:`BadReference` with a message written for the user; the embed
job stores it on the item and goes on with the next one.
"""

from __future__ import annotations

import io
import ipaddress
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx
import numpy as np

MAX_REDIRECTS = 3
MAX_IMAGE_PIXELS = 64_000_000  # a decompression bomb is refused, not decoded


class BadReference(Exception):
    """One item's reference cannot be resolved or decoded; the message is stored on the item."""


@dataclass(frozen=True)
class FetchLimits:
    data_root: Path | None
    allow_private_urls: bool
    max_bytes: int
    timeout_s: float

    @classmethod
    def from_settings(cls, settings: Any) -> FetchLimits:
        return cls(
            data_root=settings.data_root,
            allow_private_urls=bool(settings.allow_private_urls),
            max_bytes=int(settings.max_download_bytes),
            timeout_s=float(settings.download_timeout_seconds),
        )


# ------------------------------------------------------------------------------------------- fetch


def fetch(uri: str, limits: FetchLimits, client: httpx.Client | None = None) -> bytes:
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
        with httpx.Client(follow_redirects=False, trust_env=False) as own:
            return download(uri, limits, own)
    raise BadReference(f"unsupported reference scheme {scheme or '(none)'!r}: use file://, http:// or https://")


def file_path(uri: str, root: Path | None) -> Path:
    """The real path of a ``file://`` reference, checked to lie under ``root``."""
    if root is None:
        raise BadReference("file:// references are disabled: the operator has not set BAIT_DATA_ROOT")
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise BadReference(f"file:// reference with a host ({parts.netloc!r}): use file:///absolute/path")
    raw = unquote(parts.path)
    if not raw.startswith("/") or "\x00" in raw:
        raise BadReference("file:// reference must name an absolute path (file:///...)")
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(raw))
    if not real.is_relative_to(real_root):
        raise BadReference(f"file {raw!r} lies outside the data root; only files under the data root are read")
    return real


def read_file(uri: str, limits: FetchLimits) -> bytes:
    path = file_path(uri, limits.data_root)
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > limits.max_bytes:
                raise BadReference(f"file is {size} bytes, more than the limit of {limits.max_bytes}")
            data = fh.read(limits.max_bytes + 1)
    except FileNotFoundError:
        raise BadReference(f"file not found: {unquote(urlsplit(uri).path)}") from None
    except IsADirectoryError:
        raise BadReference(f"not a file: {unquote(urlsplit(uri).path)}") from None
    except PermissionError:
        raise BadReference(f"file not readable: {unquote(urlsplit(uri).path)}") from None
    if len(data) > limits.max_bytes:
        raise BadReference(f"file is more than the limit of {limits.max_bytes} bytes")
    return data


def _forbidden(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return _forbidden(addr.ipv4_mapped)
    for what, flag in (
        ("loopback", addr.is_loopback),
        ("unspecified", addr.is_unspecified),
        ("link-local", addr.is_link_local),
        ("multicast", addr.is_multicast),
        ("private", addr.is_private),
        ("reserved", addr.is_reserved),
    ):
        if flag:
            return what
    return None


def resolve_host(host: str, port: int, allow_private: bool) -> str:
    """The address to connect to: every address ``host`` resolves to is checked, the first is used.

    Raises:
        BadReference: the name does not resolve, or resolves to a refused address.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise BadReference(f"cannot resolve host {host!r}: {exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise BadReference(f"host {host!r} has no address")
    if not allow_private:
        for a in addresses:
            why = _forbidden(ipaddress.ip_address(a.split("%", 1)[0]))
            if why is not None:
                raise BadReference(
                    f"refused: {host!r} resolves to the {why} address {a}; requests to private, loopback and "
                    "link-local addresses are disabled (operators may allow them with BAIT_ALLOW_PRIVATE_URLS)"
                )
    return addresses[0]


def download(uri: str, limits: FetchLimits, client: httpx.Client) -> bytes:
    """GET an http(s) reference to the checked address, within the size and time limits."""
    deadline = time.monotonic() + limits.timeout_s
    url = uri
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise BadReference(f"redirect to an unsupported scheme {scheme!r}")
        host = parts.hostname
        if not host:
            raise BadReference(f"URL without a host: {url!r}")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise BadReference(f"URL with an invalid port: {url!r}") from None
        address = resolve_host(host, port, limits.allow_private_urls)
        ip_host = f"[{address}]" if ":" in address else address
        pinned = urlunsplit((scheme, f"{ip_host}:{port}", parts.path or "/", parts.query, ""))
        host_header = host if parts.port is None else f"{host}:{parts.port}"
        extensions: dict[str, Any] = {}
        if scheme == "https":
            extensions["sni_hostname"] = host
        left = deadline - time.monotonic()
        if left <= 0:
            raise BadReference(f"download timed out after {limits.timeout_s:g} s")
        try:
            with client.stream(
                "GET",
                pinned,
                headers={"Host": host_header, "Accept-Encoding": "identity"},
                timeout=httpx.Timeout(left),
                extensions=extensions,
            ) as response:
                if response.is_redirect:
                    location = response.headers.get("location")
                    if not location:
                        raise BadReference(f"HTTP {response.status_code} redirect without a Location")
                    url = str(httpx.URL(url).join(location))
                    continue
                if response.status_code >= 400:
                    raise BadReference(f"HTTP {response.status_code} from {host}")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
                    raise BadReference(f"download of {declared} bytes is larger than the limit of {limits.max_bytes}")
                body = bytearray()
                for chunk in response.iter_raw():
                    body.extend(chunk)
                    if len(body) > limits.max_bytes:
                        raise BadReference(f"download larger than the limit of {limits.max_bytes} bytes")
                    if time.monotonic() > deadline:
                        raise BadReference(f"download timed out after {limits.timeout_s:g} s")
                return bytes(body)
        except httpx.TimeoutException:
            raise BadReference(f"download timed out after {limits.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise BadReference(f"download failed: {type(exc).__name__}: {exc}") from None
    raise BadReference(f"more than {MAX_REDIRECTS} redirects")


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

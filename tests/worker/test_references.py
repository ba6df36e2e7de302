"""Resolving data references: file:// confined to the data root, http(s) with limits and address checks,
decoders. The http tests talk to a real server on 127.0.0.1 (allowed by the operator setting, except in
the tests of the refusal)."""

from __future__ import annotations

import io
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from service.outbound import OutboundPolicy, OutboundRefused, resolve
from worker.references import (
    BadReference,
    FetchLimits,
    decode_image,
    decode_npy,
    decode_text,
    fetch,
)

BODY = b"hello from the test server"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/ok.txt":
            self._send(200, BODY)
        elif self.path == "/declared-big":
            self.send_response(200)
            self.send_header("Content-Length", str(10_000_000))
            self.end_headers()
            self.wfile.write(b"x" * 1000)
        elif self.path == "/streamed-big":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(100):
                chunk = b"y" * 1000
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/slow":
            time.sleep(1.5)
            self._send(200, BODY)
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/ok.txt")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/host":
            self._send(200, (self.headers.get("Host") or "").encode())
        else:
            self._send(404, b"no")

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def limits(
    root: Path | None = None, *, allow: bool = True, max_bytes: int = 50_000, timeout: float = 5.0
) -> FetchLimits:
    policy = OutboundPolicy.parse("127.0.0.1,localhost" if allow else "")
    return FetchLimits(data_root=root, policy=policy, max_bytes=max_bytes, timeout_s=timeout)


# --------------------------------------------------------------------------------------------- file


def test_file_reference_under_root_is_read(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"abc")
    assert fetch(f"file://{tmp_path}/a.txt", limits(tmp_path)) == b"abc"


def test_file_reference_outside_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.txt").write_bytes(b"secret")
    with pytest.raises(BadReference, match="outside the data root"):
        fetch(f"file://{root}/../secret.txt", limits(root))
    with pytest.raises(BadReference, match="outside the data root"):
        fetch("file:///etc/passwd", limits(root))


def test_file_reference_through_symlink_out_of_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.txt").write_bytes(b"secret")
    os.symlink(tmp_path / "secret.txt", root / "link.txt")
    with pytest.raises(BadReference, match="outside the data root"):
        fetch(f"file://{root}/link.txt", limits(root))


def test_file_reference_percent_encoded_traversal_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.txt").write_bytes(b"secret")
    with pytest.raises(BadReference, match="outside the data root"):
        fetch(f"file://{root}/%2e%2e/secret.txt", limits(root))


def test_missing_file_is_an_item_error(tmp_path: Path) -> None:
    with pytest.raises(BadReference, match="file not found"):
        fetch(f"file://{tmp_path}/nope.png", limits(tmp_path))


def test_file_references_refused_without_a_root(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"abc")
    with pytest.raises(BadReference, match="BAIT_DATA_ROOT"):
        fetch(f"file://{tmp_path}/a.txt", limits(None))


def test_oversize_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(b"z" * 2000)
    with pytest.raises(BadReference, match="limit of 1000"):
        fetch(f"file://{tmp_path}/big.bin", limits(tmp_path, max_bytes=1000))


def test_unsupported_scheme_is_refused() -> None:
    with pytest.raises(BadReference, match="unsupported reference scheme 'ftp'"):
        fetch("ftp://example.com/a", limits())


# --------------------------------------------------------------------------------------------- http


def test_http_reference_downloads_when_private_addresses_are_allowed(server: str) -> None:
    assert fetch(f"{server}/ok.txt", limits(allow=True)) == BODY


def test_http_reference_to_loopback_is_refused_by_default(server: str) -> None:
    with pytest.raises(BadReference, match=r"loopback address 127\.0\.0\.1"):
        fetch(f"{server}/ok.txt", limits(allow=False))
    port = server.rsplit(":", 1)[1]
    with pytest.raises(BadReference, match="loopback"):
        fetch(f"http://localhost:{port}/ok.txt", limits(allow=False))


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("169.254.169.254", "link-local"),
        ("0.0.0.0", "unspecified"),
    ],
)
def test_private_and_link_local_addresses_are_refused(host: str, why: str) -> None:
    # Literal addresses: getaddrinfo does no lookup, and resolve() never connects.
    with pytest.raises(OutboundRefused, match=why):
        resolve(host, 80, OutboundPolicy())
    assert resolve(host, 80, OutboundPolicy.parse(f"{host}/32")) == host


def test_ipv4_mapped_ipv6_loopback_is_refused() -> None:
    with pytest.raises(OutboundRefused, match="loopback"):
        resolve("::ffff:127.0.0.1", 80, OutboundPolicy())


def test_request_goes_to_the_checked_address_with_the_original_host(server: str) -> None:
    port = server.rsplit(":", 1)[1]
    assert fetch(f"http://localhost:{port}/host", limits(allow=True)) == f"localhost:{port}".encode()


def test_redirect_is_followed_and_checked(server: str) -> None:
    assert fetch(f"{server}/redirect", limits(allow=True)) == BODY


def test_declared_oversize_download_is_refused(server: str) -> None:
    with pytest.raises(BadReference, match="larger than the limit of 50000"):
        fetch(f"{server}/declared-big", limits(allow=True))


def test_streamed_oversize_download_is_cut_off(server: str) -> None:
    with pytest.raises(BadReference, match="larger than the limit of 50000"):
        fetch(f"{server}/streamed-big", limits(allow=True))


def test_slow_download_times_out(server: str) -> None:
    t = time.monotonic()
    with pytest.raises(BadReference, match=r"timed out after 0\.5 s"):
        fetch(f"{server}/slow", limits(allow=True, timeout=0.5))
    assert time.monotonic() - t < 1.4


def test_http_error_status_is_an_item_error_without_the_body(server: str) -> None:
    with pytest.raises(BadReference, match="HTTP 404 Not Found") as info:
        fetch(f"{server}/missing", limits(allow=True))
    assert "no" not in str(info.value).replace("Not Found", "")


def test_unresolvable_host_is_an_item_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_host(*args: object, **kwargs: object) -> list[object]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)  # no DNS query leaves the machine
    with pytest.raises(BadReference, match="cannot resolve host"):
        fetch("http://no-such-host.invalid/a.png", limits(allow=False))


# ------------------------------------------------------------------------------------------ decoders


def png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def test_grayscale_png_decodes_to_h_w_1_and_resizes() -> None:
    img = np.arange(28 * 28, dtype=np.uint8).reshape(28, 28)
    out = decode_image(png_bytes(img), "L", None)
    assert out.shape == (28, 28, 1) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[:, :, 0], img)
    assert decode_image(png_bytes(img), "RGB", (14, 20)).shape == (14, 20, 3)


def test_unreadable_image_is_an_item_error() -> None:
    with pytest.raises(BadReference, match="unreadable image"):
        decode_image(b"this is not a png", "L", None)
    with pytest.raises(BadReference, match="unreadable image"):
        decode_image(png_bytes(np.zeros((8, 8), np.uint8))[:40], "L", None)


def test_npy_is_loaded_without_pickle() -> None:
    buf = io.BytesIO()
    np.save(buf, np.arange(5, dtype=np.float64))
    np.testing.assert_array_equal(decode_npy(buf.getvalue()), np.arange(5))
    obj = io.BytesIO()
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(BadReference, match=r"unreadable \.npy"):
        decode_npy(obj.getvalue())


def test_text_must_be_utf8() -> None:
    assert decode_text("héllo".encode()) == "héllo"
    with pytest.raises(BadReference, match="not UTF-8"):
        decode_text(b"\xff\xfe\x00bad")

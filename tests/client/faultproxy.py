"""A real HTTP proxy on a loopback port that loses answers on purpose: the request reaches the service,
which does its work and answers, and the proxy then hangs up on the client without passing the answer
on (what a dropped connection or a proxy timeout does to a client). Or it refuses a request before the
service sees it. It records what went through, so a test can see what the client sent."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int | None  # the service's answer (None: never forwarded)
    passed_on: bool

    def npz_ids(self) -> list[str]:
        """The ids of a bulk .npz body."""
        with np.load(io.BytesIO(self.body)) as z:
            return [str(i) for i in z["ids"]]


# A rule looks at (method, path, how many matching requests came before) and says what to do.
Rule = Callable[[str, str], str | None]  # "lose_answer" | "refuse" | None


@dataclass
class FaultProxy:
    upstream: str
    rule: Rule = lambda method, path: None
    seen: list[Seen] = field(default_factory=list)
    url: str = ""

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "content-length")
                }
                action = proxy.rule(self.command, self.path)
                if action == "refuse":
                    proxy.seen.append(Seen(self.command, self.path, headers, body, None, False))
                    self.close_connection = True
                    return  # hang up without an answer; the service never saw it
                r = httpx.request(self.command, proxy.upstream + self.path, headers=headers, content=body, timeout=120)
                passed = action != "lose_answer"
                proxy.seen.append(Seen(self.command, self.path, headers, body, r.status_code, passed))
                if not passed:
                    self.close_connection = True
                    return  # the service did the work; the client never hears of it
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        return Handler


@contextmanager
def fault_proxy(upstream: str, rule: Rule) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream=upstream, rule=rule)
    server = ThreadingHTTPServer(("127.0.0.1", 0), proxy._handler())
    proxy.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()


def nth(method: str, fragment: str, which: set[int], action: str) -> Rule:
    """A rule: ``action`` on the requests number ``which`` (from 1) of ``method`` whose path has ``fragment``."""
    count = 0
    lock = threading.Lock()

    def rule(m: str, path: str) -> str | None:
        nonlocal count
        if m != method or fragment not in path:
            return None
        with lock:
            count += 1
            return action if count in which else None

    return rule

"""The one outbound guard: every HTTP request the service makes goes through :class:`OutboundClient`.

Users are data references (``worker.references``), outgoing webhooks (``worker.webhooks``) and Label
Studio (``service.labelstudio``, from the api at connect time and from workers). A tenant chooses these
URLs, so a request must not reach the host or the internal network:

- The host name is resolved once; every address it resolves to is checked, and the connection goes to
  the first checked address (:class:`PinnedTransport` rewrites the request to that IP; the ``Host``
  header and the TLS SNI/certificate check keep the name), so a second DNS answer cannot slip in
  between check and connect.
- Refused unless the operator allowlist names them (``BAIT_OUTBOUND_ALLOW``: host names, IP
  addresses or CIDRs, comma-separated): loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7),
  link-local (169.254/16 with the cloud metadata address, fe80::/10), CGNAT 100.64/10, 6to4 2002::/16,
  NAT64 64:ff9b::/96, Teredo, unspecified, multicast, documentation and reserved ranges. An
  IPv4-mapped IPv6 address (``::ffff:10.0.0.1``) is judged by the IPv4 address it carries.
- Redirects are followed by hand (at most ``max_redirects``), each hop resolved and checked again;
  303 (and 301/302 after a POST) continue as GET; credentials are dropped when the origin changes.
- Every exchange has a total time limit and a response size limit (declared length and counted bytes).

Errors are :class:`OutboundError` (:class:`OutboundRefused` for a refused destination) with messages
of our own: a foreign server's body is never part of them.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import httpx

from service.errors import BadRequest
from service.urls import http_url

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_REDIRECTS = 3

# (network, why) in the order they are checked; the first match names the refusal.
_BLOCKED: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), why)
    for net, why in (
        ("0.0.0.0/8", "unspecified"),
        ("127.0.0.0/8", "loopback"),
        ("10.0.0.0/8", "private"),
        ("172.16.0.0/12", "private"),
        ("192.168.0.0/16", "private"),
        ("169.254.0.0/16", "link-local (cloud metadata)"),
        ("100.64.0.0/10", "carrier-grade NAT"),
        ("192.0.0.0/24", "reserved"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("::/96", "IPv4-compatible"),
        ("64:ff9b::/96", "NAT64"),
        ("64:ff9b:1::/48", "NAT64"),
        ("100::/64", "discard"),
        ("2001::/32", "Teredo"),
        ("2001:db8::/32", "documentation"),
        ("2002::/16", "6to4"),
        ("fc00::/7", "private (unique local)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    )
)


class OutboundError(Exception):
    """An outbound request failed; the message is ours (never a foreign body) and safe to show a tenant."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code


class OutboundRefused(OutboundError):
    """The destination is refused by the guard (its address, its scheme, or the name does not resolve)."""


class DestinationRefused(BadRequest):
    """API error: a URL a tenant gave points where the service may not send requests."""

    code = "destination_refused"


def status_line(status_code: int) -> str:
    """``HTTP 500 Internal Server Error``: the standard reason phrase, never the peer's own."""
    try:
        phrase = HTTPStatus(status_code).phrase
    except ValueError:
        phrase = ""
    return f"HTTP {status_code} {phrase}".rstrip()


# ------------------------------------------------------------------------------------------ policy


def _parse_allow(entries: Iterable[str]) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    hosts: set[str] = set()
    nets: list[IPNetwork] = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        try:
            nets.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            if "/" in entry or " " in entry:
                raise ValueError(
                    f"BAIT_OUTBOUND_ALLOW entry {entry!r} is neither a host name nor an address/CIDR"
                ) from None
            hosts.add(entry.lower().rstrip("."))
    return frozenset(hosts), tuple(nets)


@dataclass(frozen=True)
class OutboundPolicy:
    """What the guard lets through beyond public addresses.

    Attributes:
        allow_hosts: host names (lowercase) whose every address is allowed (the operator trusts their DNS).
        allow_networks: addresses and CIDRs allowed although they are in a refused range.
        allow_all: every address allowed (the deprecated ``BAIT_ALLOW_PRIVATE_URLS=true``).
    """

    allow_hosts: frozenset[str] = frozenset()
    allow_networks: tuple[IPNetwork, ...] = ()
    allow_all: bool = False

    @classmethod
    def parse(cls, allow: str | Iterable[str] = "", *, allow_all: bool = False) -> OutboundPolicy:
        entries = allow.split(",") if isinstance(allow, str) else list(allow)
        hosts, nets = _parse_allow(entries)
        return cls(allow_hosts=hosts, allow_networks=nets, allow_all=allow_all)

    @classmethod
    def from_settings(cls, settings: Any) -> OutboundPolicy:
        allow_all = bool(getattr(settings, "allow_private_urls", False))
        return cls.parse(getattr(settings, "outbound_allow", "") or "", allow_all=allow_all)

    def refusal(self, host: str, address: str) -> str | None:
        """Why ``address`` (one of ``host``'s) is refused, or None when a request may go there."""
        if self.allow_all or host.lower().rstrip(".") in self.allow_hosts:
            return None
        addr: IPAddress = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped  # judged (and allowlisted) by the IPv4 address it carries
        if any(addr.version == net.version and addr in net for net in self.allow_networks):
            return None
        for net, why in _BLOCKED:
            if addr.version == net.version and addr in net:
                return why
        if not addr.is_global:
            return "reserved"
        return None


# ------------------------------------------------------------------------------------------ resolving


def resolve(host: str, port: int, policy: OutboundPolicy) -> str:
    """The address to connect to: every address ``host`` resolves to is checked, the first is used.

    Raises:
        OutboundRefused: the name does not resolve, or resolves to a refused address.
    """
    name = host.strip("[]")
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise OutboundRefused(f"cannot resolve host {host!r}: {exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise OutboundRefused(f"host {host!r} has no address")
    for a in addresses:
        why = policy.refusal(name, a)
        if why is not None:
            shown = "" if a == name else f"{host!r} resolves to "
            raise OutboundRefused(
                f"refused: {shown}the {why} address {a}: the service does not send requests to loopback, private, "
                "link-local or other internal addresses (an operator may allow a host or network with "
                "BAIT_OUTBOUND_ALLOW)"
            )
    return addresses[0]


def _host_port(url: str) -> tuple[str, str, int]:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise OutboundRefused(f"malformed URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise OutboundRefused(f"unsupported scheme {scheme or '(none)'!r}: only http:// and https:// URLs are allowed")
    host = parts.hostname
    if not host:
        raise OutboundRefused(f"URL without a host: {url!r}")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise OutboundRefused(f"URL with an invalid port: {url!r}") from None
    return scheme, host, port


def check_url(url: str, policy: OutboundPolicy) -> None:
    """Resolve and check a URL a tenant gives (a webhook, Label Studio) before it is stored.

    Raises:
        OutboundRefused: unsupported scheme, no host, a name that does not resolve, or a refused address.
    """
    _, host, port = _host_port(url)
    resolve(host, port, policy)


def check_destination(url: str, policy: OutboundPolicy, what: str) -> None:
    """:func:`check_url` for API handlers: a malformed URL is a 400 ``invalid_url``
    (:func:`service.urls.http_url`), a refusal a 400 ``destination_refused``."""
    parts = http_url(url, what)
    try:
        check_url(url, policy)
    except OutboundRefused as exc:
        raise DestinationRefused(f"{what} {exc.message}", {"url_host": parts.hostname}) from None


# ------------------------------------------------------------------------------------------ transport


class PinnedTransport(httpx.BaseTransport):
    """Resolves and checks each request's host, then connects to that checked address.

    The request URL is rewritten to the IP (so no second lookup happens); the ``Host`` header httpx
    built from the name stays, and TLS uses the name for SNI and certificate verification. One inner
    connection pool per host name, so a TLS connection made for one name never carries another's.
    """

    def __init__(self, policy: OutboundPolicy) -> None:
        self.policy = policy
        self._inner: dict[str, httpx.HTTPTransport] = {}
        self._lock = threading.Lock()

    def _transport(self, host: str) -> httpx.HTTPTransport:
        with self._lock:
            t = self._inner.get(host)
            if t is None:
                t = self._inner[host] = httpx.HTTPTransport(retries=0)
            return t

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        scheme = request.url.scheme
        if scheme not in ("http", "https") or not host:
            raise OutboundRefused(f"unsupported URL {scheme}://{host}")
        port = request.url.port or (443 if scheme == "https" else 80)
        address = resolve(host, port, self.policy)
        request.url = request.url.copy_with(host=address)
        if scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": host}
        return self._transport(host).handle_request(request)

    def close(self) -> None:
        with self._lock:
            for t in self._inner.values():
                t.close()
            self._inner.clear()


# ------------------------------------------------------------------------------------------ client


@dataclass
class OutboundClient:
    """A synchronous HTTP client whose every request passes the guard (thread-safe, reusable).

    Args:
        policy: what may be reached beyond public addresses.
        timeout: total seconds of one :meth:`request`, redirects and body included.
        max_bytes: largest response body read (declared ``Content-Length`` or counted), per request.
        max_redirects: redirects followed by hand, each re-checked.
    """

    policy: OutboundPolicy
    timeout: float = 30.0
    max_bytes: int = 32 * 2**20
    max_redirects: int = MAX_REDIRECTS
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._client = httpx.Client(
            transport=PinnedTransport(self.policy), follow_redirects=False, trust_env=False, timeout=self.timeout
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OutboundClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        json: Any = None,
        content: bytes | None = None,
        follow_redirects: bool = True,
        timeout: float | None = None,
        max_bytes: int | None = None,
        read_body: bool = True,
    ) -> httpx.Response:
        """Send one request (following redirects when asked) and read its body within the limits.

        ``read_body=False``: only the status and headers are wanted; the body is not read (the
        returned response is empty).

        Returns:
            The final response with its body read (a 3xx when ``follow_redirects`` is False).

        Raises:
            OutboundRefused: a refused destination (first hop or any redirect).
            OutboundError: timeout, connection failure, too many redirects, or a body over the limit.
        """
        limit_s = self.timeout if timeout is None else timeout
        cap = self.max_bytes if max_bytes is None else max_bytes
        deadline = time.monotonic() + limit_s
        send_headers = {"Accept-Encoding": "identity", **(headers or {})}
        current = httpx.URL(url)
        origin = (current.scheme, current.host, current.port)
        body_kwargs: dict[str, Any] = {"json": json} if json is not None else {"content": content}
        hops = 0
        while True:
            _host_port(str(current))  # scheme and host of this hop (the transport resolves and checks it)
            left = deadline - time.monotonic()
            if left <= 0:
                raise OutboundError(f"request to {current.host} timed out after {limit_s:g} s")
            try:
                with self._client.stream(
                    method, current, headers=send_headers, params=params, timeout=httpx.Timeout(left), **body_kwargs
                ) as r:
                    location = r.headers.get("location") if r.is_redirect else None
                    if location is None or not follow_redirects:
                        if not read_body:
                            return httpx.Response(r.status_code, headers=_plain(r.headers), request=r.request)
                        return _read(r, str(current.host), cap, deadline, limit_s)
            except OutboundError:
                raise
            except httpx.TimeoutException:
                raise OutboundError(f"request to {current.host} timed out after {limit_s:g} s") from None
            except httpx.HTTPError as exc:
                raise OutboundError(f"request to {current.host} failed: {type(exc).__name__}: {exc}") from None
            hops += 1
            if hops > self.max_redirects:
                raise OutboundError(f"more than {self.max_redirects} redirects from {httpx.URL(url).host}")
            nxt = current.join(location)
            if r.status_code == 303 or (r.status_code in (301, 302) and method.upper() == "POST"):
                method, body_kwargs = "GET", {"content": None}
            if (nxt.scheme, nxt.host, nxt.port) != origin:
                send_headers = {k: v for k, v in send_headers.items() if k.lower() not in ("authorization", "cookie")}
            params = None  # the Location carries its own query
            current = nxt


def _read(r: httpx.Response, host: str, cap: int, deadline: float, limit_s: float) -> httpx.Response:
    declared = r.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise OutboundError(
            f"answer of {declared} bytes from {host} is larger than the limit of {cap}",
            status_code=r.status_code,
        )
    body = bytearray()
    for chunk in r.iter_bytes():
        body.extend(chunk)
        if len(body) > cap:
            raise OutboundError(
                f"answer from {host} is larger than the limit of {cap} bytes", status_code=r.status_code
            )
        if time.monotonic() > deadline:
            raise OutboundError(f"request to {host} timed out after {limit_s:g} s", status_code=r.status_code)
    return httpx.Response(r.status_code, headers=_plain(r.headers), content=bytes(body), request=r.request)


def _plain(headers: httpx.Headers) -> list[tuple[str, str]]:
    """The headers of a response rebuilt from bytes already decoded (no encoding, no length)."""
    skip = ("content-encoding", "content-length", "transfer-encoding")
    return [(k, v) for k, v in headers.multi_items() if k.lower() not in skip]


def client_from_settings(settings: Any, *, timeout: float, max_bytes: int | None = None) -> OutboundClient:
    """An :class:`OutboundClient` with the operator's policy."""
    cap = int(max_bytes if max_bytes is not None else getattr(settings, "outbound_max_response_bytes", 32 * 2**20))
    return OutboundClient(OutboundPolicy.from_settings(settings), timeout=timeout, max_bytes=cap)

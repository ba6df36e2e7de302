"""The client's logic without I/O, shared by :class:`bait_client.Client` and :class:`bait_client.AsyncClient`.

An operation is a :class:`Call` (one request and how to read its answer) or a generator that yields
steps and gets their results back:

- :class:`Call`: send this request (with the retry policy); the generator receives the parsed result,
  or the :class:`~bait_client.errors.BaitError` is thrown into it;
- :class:`Sleep`: wait this long (polling a job);
- :class:`Emit`: hand this value to the caller (iterators over paged lists).

:func:`expand` turns an operation into the three I/O primitives (:class:`Send`, :class:`Sleep`,
:class:`Emit`); the sync and async clients each only run those: ``httpx.Client.send`` or
``await httpx.AsyncClient.send``, ``time.sleep`` or ``await asyncio.sleep``. Requests are built, retries
decided and answers parsed here, once.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import logging
import random
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from bait_client.errors import BaitError, ConnectionFailed, error_from_response, retry_after_seconds

log = logging.getLogger("bait_client")

T = TypeVar("T")

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


def _json_or_none(response: httpx.Response) -> Any:
    if response.status_code == 204 or not response.content:
        return None
    return response.json()


@dataclass
class Call(Generic[T]):
    """One API request and how to read its answer.

    Attributes:
        idempotent: sending it twice has the effect of sending it once (so it may be re-sent after a
            connection error that may have reached the service). True for GET/PUT/DELETE, for a request
            with an ``Idempotency-Key``, and for POSTs marked so (upserts by id, predictions).
    """

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    files: Mapping[str, Any] | None = None
    data: Mapping[str, Any] | None = None
    headers: Mapping[str, str] | None = None
    parse: Callable[[Any], T] = field(default=lambda body: body)  # receives the JSON body (None for 204)
    idempotent: bool | None = None

    @property
    def safe_to_resend(self) -> bool:
        if self.idempotent is not None:
            return self.idempotent
        return self.method in IDEMPOTENT_METHODS or bool(self.headers and "Idempotency-Key" in self.headers)

    def build(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        params = {k: _param(v) for k, v in (self.params or {}).items() if v is not None}
        return http.build_request(
            self.method,
            self.path,
            params=params or None,
            json=self.json,
            content=self.content,
            files=self.files,
            data=self.data,
            headers=dict(self.headers or {}),
        )

    def read(self, response: httpx.Response) -> T:
        """The parsed answer; the typed error for a 4xx/5xx."""
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = None
            raise error_from_response(response.status_code, body, response.headers, response.text)
        return self.parse(_json_or_none(response))


def _param(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


@dataclass(frozen=True)
class Send:
    """I/O primitive: send ``call`` once; the driver sends back the ``httpx.Response`` or the
    ``httpx.TransportError`` it raised."""

    call: Call[Any]


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Emit:
    value: Any


Step = Call[Any] | Sleep | Emit
Op = Call[T] | Generator[Step, Any, T]
Primitive = Send | Sleep | Emit


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long the client waits and sends a request again.

    - 429 ``rate_limited`` and 503 ``unavailable``: wait the ``Retry-After`` the service sent (at most
      ``max_wait`` seconds per wait) plus a random share of it up to ``jitter`` (so many clients throttled
      at once do not come back in step), then send again. Any request: the service did nothing with it.
    - 502/504 from a proxy: the same, for requests that are safe to re-send.
    - Connection errors: a refused connection (nothing was sent) for any request; a connection lost or a
      read timeout after sending only for requests that are safe to re-send (idempotent, or carrying an
      ``Idempotency-Key``), with exponential backoff and full jitter from ``backoff`` seconds.

    At most ``max_retries`` re-sends per request and ``max_total`` seconds of waiting; then the last
    error is raised (:class:`~bait_client.RateLimited`, :class:`~bait_client.Unavailable`,
    :class:`~bait_client.ConnectionFailed`). ``RetryPolicy.off()`` (or ``retry=False``) never retries.
    """

    max_retries: int = 10
    max_wait: float = 60.0
    max_total: float = 300.0
    backoff: float = 0.5
    max_backoff: float = 10.0
    jitter: float = 0.25
    retry_statuses: frozenset[int] = frozenset({429, 503})
    retry_if_safe_statuses: frozenset[int] = frozenset({502, 504})
    retry_connection_errors: bool = True

    @classmethod
    def off(cls) -> RetryPolicy:
        return cls(max_retries=0)

    def _backoff(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.max_backoff, self.backoff * 2**attempt))

    def delay(
        self, call: Call[Any], outcome: httpx.Response | Exception, attempt: int, waited: float, rng: random.Random
    ) -> float | None:
        """Seconds to wait before sending ``call`` again, or None to stop (``attempt``: re-sends so far)."""
        if attempt >= self.max_retries:
            return None
        if isinstance(outcome, Exception):
            if not self.retry_connection_errors:
                return None
            nothing_sent = isinstance(outcome, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
            if not (nothing_sent or call.safe_to_resend):
                return None
            wait = self._backoff(attempt, rng)
        elif outcome.status_code in self.retry_statuses or (
            outcome.status_code in self.retry_if_safe_statuses and call.safe_to_resend
        ):
            after = retry_after_seconds(outcome.headers)
            if after is None:
                wait = self._backoff(attempt, rng)
            else:
                base = min(after, self.max_wait)
                wait = base + rng.uniform(0, self.jitter * max(base, 1.0))
        else:
            return None
        if waited + wait > self.max_total:
            return None
        return wait


def perform(call: Call[T], policy: RetryPolicy, rng: random.Random) -> Generator[Primitive, Any, T]:
    """Send ``call`` until it gets an answer that is not retried; its parsed result or its typed error."""
    attempt = 0
    waited = 0.0
    while True:
        outcome = yield Send(call)
        wait = policy.delay(call, outcome, attempt, waited, rng)
        if wait is None:
            if isinstance(outcome, Exception):
                raise ConnectionFailed(
                    None, "connection_failed", f"{call.method} {call.path}: {outcome!r}"
                ) from outcome
            return call.read(outcome)
        what = repr(outcome) if isinstance(outcome, Exception) else f"{outcome.status_code}"
        log.info("%s %s: %s; retrying in %.2f s (retry %d)", call.method, call.path, what, wait, attempt + 1)
        yield Sleep(wait)
        waited += wait
        attempt += 1


def expand(op: Op[T], policy: RetryPolicy, rng: random.Random) -> Generator[Primitive, Any, T]:
    """An operation as I/O primitives: each :class:`Call` it yields is performed with the retry policy
    and its result (or error) handed back to it."""
    if isinstance(op, Call):
        return (yield from perform(op, policy, rng))
    value: Any = None
    error: BaitError | None = None
    while True:
        try:
            step = op.throw(error) if error is not None else op.send(value)
        except StopIteration as stop:
            result: T = stop.value
            return result
        value, error = None, None
        if isinstance(step, Call):
            try:
                value = yield from perform(step, policy, rng)
            except BaitError as exc:
                error = exc
        else:
            yield step


def run_sync(op: Op[T], http: httpx.Client, policy: RetryPolicy, rng: random.Random) -> T:
    """Run an operation that emits nothing, on a sync httpx client."""
    gen = expand(op, policy, rng)
    value: Any = None
    while True:
        try:
            step = gen.send(value)
        except StopIteration as stop:
            result: T = stop.value
            return result
        value = _primitive_sync(step, http)


def iterate_sync(op: Op[Any], http: httpx.Client, policy: RetryPolicy, rng: random.Random) -> Any:
    """Run an operation, yielding what it emits (a generator)."""
    gen = expand(op, policy, rng)
    value: Any = None
    while True:
        try:
            step = gen.send(value)
        except StopIteration:
            return
        if isinstance(step, Emit):
            yield step.value
            value = None
        else:
            value = _primitive_sync(step, http)


def _primitive_sync(step: Primitive, http: httpx.Client) -> Any:
    if isinstance(step, Send):
        try:
            return http.send(step.call.build(http))
        except httpx.TransportError as exc:
            return exc
    if isinstance(step, Sleep):
        time.sleep(step.seconds)
        return None
    raise TypeError(f"an operation run for its result emitted {step.value!r}; iterate it instead")


async def run_async(op: Op[T], http: httpx.AsyncClient, policy: RetryPolicy, rng: random.Random) -> T:
    gen = expand(op, policy, rng)
    value: Any = None
    while True:
        try:
            step = gen.send(value)
        except StopIteration as stop:
            result: T = stop.value
            return result
        value = await _primitive_async(step, http)


async def iterate_async(op: Op[Any], http: httpx.AsyncClient, policy: RetryPolicy, rng: random.Random) -> Any:
    gen = expand(op, policy, rng)
    value: Any = None
    while True:
        try:
            step = gen.send(value)
        except StopIteration:
            return
        if isinstance(step, Emit):
            yield step.value
            value = None
        else:
            value = await _primitive_async(step, http)


async def _primitive_async(step: Primitive, http: httpx.AsyncClient) -> Any:
    if isinstance(step, Send):
        try:
            return await http.send(step.call.build(http))
        except httpx.TransportError as exc:
            return exc
    if isinstance(step, Sleep):
        await asyncio.sleep(step.seconds)
        return None
    raise TypeError(f"an operation run for its result emitted {step.value!r}; iterate it instead")


def dumps(value: Any) -> str:
    return jsonlib.dumps(value, separators=(",", ":"))

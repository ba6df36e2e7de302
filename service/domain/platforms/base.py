"""The annotation-platform interface: what the service asks of a tool people label in (Label Studio first).

A platform is connected to a pool as an :class:`~service.store.models.Integration` row (``kind`` names the
platform, ``url``/``project_id``/``token`` where it lives, ``config`` its options and the mapping checked
at connect, ``state`` what it keeps between runs). Everything around it is the platform's business only
where this interface says so; the rest is shared by every platform:

- the integration rows, their secrets and the ML-backend authentication (:mod:`service.domain.integrations`),
- links between tasks and items and the label writes (:mod:`service.store.integrations`,
  :mod:`service.domain.labels`),
- reconcile runs as readable jobs, the auto-batch policy (:mod:`service.domain.autobatch`), and the jobs
  that run all this (:mod:`worker.annotation`), which look the platform up by ``integration.kind``
  (:func:`service.domain.platforms.platform_for`).

What a platform provides (docs/platforms.md says it for people who write one):

- :meth:`AnnotationPlatform.push_batch`: push a batch's items as tasks (in the batch job, before the batch
  is ``succeeded``; again from the retry endpoint);
- :meth:`AnnotationPlatform.reconcile`: read every annotation back and make the pool's labels match;
- :meth:`AnnotationPlatform.apply_event`: apply one annotation the platform announced (a webhook);
- :meth:`AnnotationPlatform.handle_webhook`: turn a webhook into queued work, in the web process;
- :meth:`AnnotationPlatform.predict`: serve the pool model's predictions in the platform's format;
- :meth:`AnnotationPlatform.health`: report the integration's state (the API's and the dashboard's view).

Jobs run the worker-side methods with a :class:`PlatformEnv`: the worker's session factory and settings,
and its ``predict`` job function (the numerics stay in the worker: ``service`` never imports them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.crypto import SecretKeyError
from service.errors import ServiceError
from service.queue import JobQueue
from service.store.models import Integration

#: ``predict(pool_id, item_ids) -> {"checkpoint_id", "round", "predictions": [...]}`` (worker.predict.predict).
Predict = Callable[[str, list[str]], dict[str, Any]]


@dataclass(frozen=True)
class PlatformEnv:
    """What a platform's job-side methods run with (built by the worker from its job context)."""

    sessionmaker: sessionmaker[Session]
    settings: Settings
    predict: Predict


class AnnotationPlatform(ABC):
    """One annotation platform. Implementations are stateless singletons registered by ``kind``."""

    #: the ``Integration.kind`` of this platform's integrations, e.g. ``"labelstudio"``
    kind: str
    #: how people call it, in messages
    title: str

    # ------------------------------------------------------------------------------ job side (workers)

    @abstractmethod
    def push_batch(self, env: PlatformEnv, integration_id: str, batch_id: str) -> bool:
        """Push the batch's items that have no task yet into the platform as tasks (ranked, with the model's
        predictions where the integration asks for them), link each task to its item, and note the outcome
        on the batch (``diagnostics``; ``error`` when it failed) and on the integration (``status``,
        ``last_error``). Never raises for the platform's failures. Returns True when it went through."""

    @abstractmethod
    def reconcile(
        self, env: PlatformEnv, integration_id: str, *, deadline: float | None = None, raise_errors: bool = False
    ) -> dict[str, int] | None:
        """Read every task with its annotations back and make the pool's labels match: write, change or remove
        the labels the platform owns, adopt tasks that carry an item id but no link. Returns counts (None:
        the integration is gone). A failure is recorded on the integration, and raised with ``raise_errors``.
        ``deadline`` (``time.monotonic()``) bounds the reading."""

    @abstractmethod
    def apply_event(self, env: PlatformEnv, integration_id: str, event: dict[str, Any]) -> str:
        """Apply one annotation event queued by :meth:`handle_webhook` (once per annotation and version);
        returns what happened, ``"written"`` when a label was written or changed."""

    # ------------------------------------------------------------------------------ web side (the api)

    @abstractmethod
    def handle_webhook(
        self,
        session: Session,
        queue: JobQueue,
        integration: Integration,
        payload: dict[str, Any],
        *,
        verified: bool,
        hint_interval_s: float = 60.0,
    ) -> dict[str, Any]:
        """Queue what a webhook of the platform asks for (submitted when ``session`` commits); never raises for
        a payload it does not handle. ``verified`` is False for an event that came without credentials: only
        a hint, to be read back from the platform before anything is written; such hints must not let
        anyone who knows an integration's id make the service hammer the platform (coalesce them, and
        start no costly sync within ``hint_interval_s`` of the last)."""

    @abstractmethod
    def predict(
        self,
        session: Session,
        queue: JobQueue,
        settings: Settings,
        integration: Integration,
        tasks: list[dict[str, Any]],
    ) -> list[dict[str, Any]]:
        """The pool model's predictions for the platform's ``tasks``, in its format, one per task in order."""

    @abstractmethod
    def health(self, session: Session, integration: Integration) -> dict[str, Any]:
        """The integration as the API and the dashboard show it: ``id``, ``kind``, ``status`` (``ok`` |
        ``error``), ``last_error``, ``last_synced_at``, ``tasks_linked``, ``train_requested``, timestamps,
        and the platform's own fields (where it lives, its options)."""

    # ------------------------------------------------------------------------------ shared

    def describe_error(self, exc: BaseException) -> str:
        """The message a failure leaves on the integration (errors written for users verbatim)."""
        if isinstance(exc, SecretKeyError | ServiceError):
            return str(exc)
        return f"internal error: {type(exc).__name__}: {exc}"

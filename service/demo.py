"""`bait demo`: the whole labeling loop against a running service, on data that ships with scikit-learn.

It talks HTTP only (httpx + numpy; scikit-learn's bundled ``load_digits``: 1,797 images of 8 x 8 pixels,
no download), so it shows what any client does:

1. creates a pool with a name of its own (pool names are unique per tenant),
2. uploads every image as a 64-value embedding (pixels / 16) in one ``.npz`` request,
3. labels a random seed set from the ground truth (never from the validation part: the first 300 images),
4. for each round: asks for a batch picked by BAIT, waits for it, reads through the predictions endpoint
   the accuracy of the head that batch trained, on the validation images it was not trained on (a batch
   may pick validation images too: once labeled, they leave the validation set), and labels the picked
   items from the ground truth,
5. deletes its pool.

Everything random is drawn from ``seed`` (the split, the seed set, the batches' seeds), so two runs on
the same machine print the same numbers; the timings, and on other machines the last digits of the
numbers, vary.
"""

from __future__ import annotations

import io
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

CLASSES = [str(c) for c in range(10)]
TERMINAL = ("succeeded", "failed", "cancelled")


class DemoError(RuntimeError):
    """What went wrong, in one line a newcomer can act on."""


@dataclass(frozen=True)
class Digits:
    ids: list[str]
    embeddings: np.ndarray  # n x 64, float32
    labels: list[str]


def load_data(n_items: int | None = None, seed: int = 0) -> Digits:
    """scikit-learn's digits, shuffled by ``seed``: ids ``digit-0000``..., pixels / 16, class names."""
    from sklearn.datasets import load_digits

    data = load_digits()
    order = np.random.default_rng(seed).permutation(len(data.target))[:n_items]
    return Digits(
        ids=[f"digit-{int(i):04d}" for i in order],
        embeddings=(data.data[order] / 16.0).astype(np.float32),
        labels=[str(int(y)) for y in data.target[order]],
    )


class Demo:
    def __init__(self, http: httpx.Client, out: Any = None) -> None:
        self.http = http
        self.out = out or sys.stdout

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise DemoError(
                f"cannot reach the service at {self.http.base_url} ({exc.__class__.__name__}): start it with "
                "`make run` (or `.venv/bin/bait serve`) in another terminal, or pass --url"
            ) from exc
        if resp.status_code == 401:
            raise DemoError(
                "the service refused the API key: use the key `bait serve` printed at first start, or mint one "
                "with `.venv/bin/bait keys create --tenant NAME`"
            )
        if resp.status_code >= 400:
            try:
                message = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = resp.text[:200]
            raise DemoError(f"{method} {path} answered {resp.status_code}: {message}")
        return None if resp.status_code == 204 else resp.json()

    def wait(self, pool_id: str, batch_id: str, timeout: float, poll: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            batch: dict[str, Any] = self.call("GET", f"/v1/pools/{pool_id}/batches/{batch_id}")
            if batch["status"] in TERMINAL:
                return batch
            if time.monotonic() > deadline:
                raise DemoError(f"batch {batch_id} still {batch['status']} after {timeout:g} s")
            time.sleep(poll)

    def accuracy(self, pool_id: str, ids: Sequence[str], truth: dict[str, str]) -> float:
        preds = self.call("POST", f"/v1/pools/{pool_id}/predictions", json={"item_ids": list(ids)})["predictions"]
        return float(np.mean([p["label"] == truth[p["item_id"]] for p in preds]))

    def label(self, pool_id: str, ids: Sequence[str], truth: dict[str, str]) -> int:
        body = {"labels": [{"item_id": i, "label": truth[i]} for i in ids]}
        n: int = self.call("PUT", f"/v1/pools/{pool_id}/labels", json=body)["labeled"]
        return n


def seed_set(selectable: list[str], truth: dict[str, str], n_seed: int, rng: np.random.Generator) -> list[str]:
    """``n_seed`` random items with at least 2 of each class (``n_seed >= 20``), so that round 1 trains a head
    and runs the requested strategy rather than the cold start (``service.domain.coldstart``)."""
    by_class: dict[str, list[str]] = {}
    for i in selectable:
        by_class.setdefault(truth[i], []).append(i)
    chosen = [c for ids in by_class.values() for c in rng.choice(ids, size=min(2, len(ids)), replace=False).tolist()]
    taken = set(chosen)
    rest = [i for i in selectable if i not in taken]
    extra = max(0, n_seed - len(chosen))
    return chosen + [rest[i] for i in rng.choice(len(rest), size=extra, replace=False)]


def run_loop(
    http: httpx.Client,
    *,
    rounds: int = 3,
    batch_size: int = 20,
    n_seed: int = 50,
    n_heldout: int = 300,
    n_items: int | None = None,
    seed: int = 0,
    strategy: str = "bait",
    poll: float = 0.2,
    timeout: float = 600.0,
    out: Any = None,
) -> list[float]:
    """The loop of the module docstring; returns the held-out accuracy of each round's head.

    Raises:
        DemoError: the service cannot be reached, refuses the key, or answers an error.
    """
    demo = Demo(http, out)
    demo.call("GET", "/v1/pools")  # reachable, and the key is accepted
    data = load_data(n_items, seed)
    n = len(data.ids)
    truth = dict(zip(data.ids, data.labels, strict=True))
    heldout, selectable = data.ids[:n_heldout], data.ids[n_heldout:]
    demo.say(f"data: scikit-learn's digits, {n} images of 8x8 pixels as 64-value embeddings (pixels / 16), seed {seed}")
    name = f"digits-demo-{uuid.uuid4().hex[:8]}"  # pool names are unique per tenant
    body = {"name": name, "task": "classification", "classes": CLASSES, "embedding_dim": 64, "head": {"kind": "mlp"}}
    pool = demo.call("POST", "/v1/pools", json=body)
    pool_id = pool["id"]
    demo.say(f"created pool {name} (id {pool_id}): 10 classes, 64-d embeddings, an MLP head")
    accuracies: list[float] = []
    try:
        buf = io.BytesIO()
        np.savez(buf, ids=np.array(data.ids), embeddings=data.embeddings)
        up = demo.call("POST", f"/v1/pools/{pool_id}/items:bulk", content=buf.getvalue())
        demo.say(f"uploaded {up['created']} items in one .npz request; {len(heldout)} of them measure accuracy")
        rng = np.random.default_rng(seed)
        seed_ids = seed_set(selectable, truth, n_seed, rng)
        labeled = set(seed_ids)
        demo.say(f"labeled a random seed set of {demo.label(pool_id, seed_ids, truth)} items, at least 2 per class")
        for r in range(1, rounds + 1):
            req = {"size": batch_size, "strategy": strategy, "params": {"seed": seed + r}}
            created = demo.call("POST", f"/v1/pools/{pool_id}/batches", json=req)
            batch = demo.wait(pool_id, created["id"], timeout, poll)
            if batch["status"] != "succeeded":
                raise DemoError(f"batch {batch['id']} {batch['status']}: {batch['error']}")
            t = batch["diagnostics"].get("timings", {})
            objective = "" if batch["objective"] is None else f", objective {batch['objective']:.4g}"
            demo.say(
                f"round {r}: {strategy} picked {len(batch['item_ids'])} items in {t.get('total', 0):.1f} s "
                f"(train {t.get('train', 0):.2f} s, select {t.get('select', 0):.2f} s){objective}"
            )
            evaluated = [i for i in heldout if i not in labeled]
            acc = demo.accuracy(pool_id, evaluated, truth)
            accuracies.append(acc)
            demo.say(
                f"         its head, trained on {len(labeled)} labels: accuracy {acc:.3f} "
                f"on the {len(evaluated)} validation items it was not trained on"
            )
            demo.label(pool_id, batch["item_ids"], truth)
            labeled |= set(batch["item_ids"])
            demo.say(f"         labeled the {len(batch['item_ids'])} picked items from the ground truth")
    finally:
        demo.call("DELETE", f"/v1/pools/{pool_id}")
        demo.say(f"deleted pool {name}")
    return accuracies


def run(url: str, key: str | None, *, rounds: int = 3, batch_size: int = 20, seed: int = 0) -> int:
    """`bait demo`: 0 when the loop ran, 2 with one line on stderr when it could not."""
    key = key or os.environ.get("BAIT_API_KEY")
    if not key:
        print(
            "error: no API key: pass --key or set BAIT_API_KEY (`make run` prints one at first start; "
            "or `.venv/bin/bait keys create --tenant NAME --scope read,label,select,admin`: "
            "deleting its pool needs admin)",
            file=sys.stderr,
        )
        return 2
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=120.0) as http:
        try:
            run_loop(http, rounds=rounds, batch_size=batch_size, seed=seed)
        except DemoError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0

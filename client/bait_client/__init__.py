"""bait-client: a typed Python client of bait-service.

from bait_client import Client
with Client("http://127.0.0.1:8000", api_key="...") as bait:
    pool = bait.create_pool("reviews", classes=["pos", "neg"], embedding_dim=384)
    bait.upload(pool.id, X, ids=ids)
    batch = bait.wait(pool.id, bait.request_batch(pool.id, size=20))
"""

from bait_client.client import BaitError, BatchFailed, Client
from bait_client.models import (
    Batch,
    Checkpoint,
    Delivery,
    Integration,
    Item,
    Pool,
    Prediction,
    Predictions,
    Progress,
    UpsertResult,
    Webhook,
)
from bait_client.webhooks import verify as verify_signature

__all__ = [
    "BaitError",
    "Batch",
    "BatchFailed",
    "Checkpoint",
    "Client",
    "Delivery",
    "Integration",
    "Item",
    "Pool",
    "Prediction",
    "Predictions",
    "Progress",
    "UpsertResult",
    "Webhook",
    "verify_signature",
]

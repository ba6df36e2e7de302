"""Wire models of pools, items and labels (pydantic). Shape rules live here; rules that depend on a
pool (dimension, classes, task) live in the domain functions."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

from service.textcheck import find_bad_text

ExternalId = Annotated[str, StringConstraints(min_length=1, max_length=512)]
# Numbers only (no "1.5" strings); NaN/Infinity literals parse but are rejected by the domain check.
Number = StrictFloat | StrictInt


# Budgets of a pool's model head (checked at pool creation, documented in docs/security.md, "Input limits"):
# a worker trains it and every round stores a checkpoint of it, so its size is bounded up front.
MAX_CLASSES = 10_000
MAX_OUTPUTS = 10_000
MAX_HEAD_PARAMETERS = 20_000_000  # 80 MB of float32 weights per checkpoint


class RequestModel(BaseModel):
    """Request models: unknown fields refused, and every string (values and keys, nested ones too) free of
    NUL bytes and lone surrogates (400 ``invalid_string``; see service/textcheck.py)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _storable_text(self) -> Self:
        for name in type(self).model_fields:
            found = find_bad_text(getattr(self, name), (name,))
            if found is not None:
                path, problem = found
                where = ".".join(str(p) for p in path)
                raise PydanticCustomError("invalid_string", "{where} {problem}", {"where": where, "problem": problem})
        return self


# ---------------------------------------------------------------------------------------------- pools


class HeadConfigIn(RequestModel):
    """Model head trained on the embeddings by the worker (see selection.heads.HeadConfig)."""

    kind: Literal["linear", "mlp"] = "mlp"
    hidden: int = Field(default=128, ge=1, le=65536, description="hidden ReLU units of `mlp`")
    lr: float | None = Field(default=None, gt=0, le=10)
    batch_size: int | None = Field(default=None, ge=1, le=1_000_000)
    max_epochs: int | None = Field(default=None, ge=1, le=100_000)
    target_train_accuracy: float | None = Field(default=None, gt=0, le=1)
    patience: int | None = Field(default=None, ge=1, le=100_000)
    tolerance: float | None = Field(default=None, ge=0)
    weight_decay: float | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0)
    dtype: Literal["float32", "float64"] | None = None


class PoolCreate(RequestModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "digits",
                    "task": "classification",
                    "classes": ["0", "1", "2"],
                    "embedding_dim": 64,
                    "head": {"kind": "mlp", "hidden": 128},
                }
            ]
        },
    )

    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
    task: Literal["classification", "regression"]
    classes: list[Annotated[str, StringConstraints(min_length=1, max_length=200)]] | None = Field(
        default=None,
        description=f"class names (classification, 2 to {MAX_CLASSES}, unique)",
        max_length=MAX_CLASSES,
    )
    n_outputs: int | None = Field(
        default=None, ge=1, le=MAX_OUTPUTS, description=f"number of targets (regression, at most {MAX_OUTPUTS})"
    )
    embedding_dim: int = Field(ge=1, le=65536)
    head: HeadConfigIn = Field(default_factory=HeadConfigIn)
    encoder: EncoderConfigIn | None = Field(default=None, description="for items given by uri/text")
    validation: ValidationConfigIn | None = Field(
        default=None, description="hold out a random fraction of incoming labels as validation items"
    )

    @model_validator(mode="after")
    def _task_fields(self) -> PoolCreate:
        if self.task == "classification":
            if self.n_outputs is not None:
                raise ValueError("a classification pool takes `classes`, not `n_outputs`")
            if self.classes is None or len(self.classes) < 2:
                raise ValueError("a classification pool needs `classes`: at least 2 class names")
            dupes = sorted(c for c, n in Counter(self.classes).items() if n > 1)  # linear, not count() per class
            if dupes:
                raise ValueError(f"class names must be unique; repeated: {dupes[:10]}")
        else:
            if self.classes is not None:
                raise ValueError("a regression pool takes `n_outputs`, not `classes`")
            if self.n_outputs is None:
                raise ValueError("a regression pool needs `n_outputs` (number of targets, >= 1)")
        outputs = len(self.classes) if self.classes is not None else (self.n_outputs or 1)
        d, h = self.embedding_dim, self.head.hidden
        n_params = d * outputs + outputs if self.head.kind == "linear" else d * h + h + h * outputs + outputs
        if n_params > MAX_HEAD_PARAMETERS:
            raise ValueError(
                f"the {self.head.kind} head would have {n_params:,} parameters (embedding_dim {d}, "
                + (f"hidden {h}, " if self.head.kind == "mlp" else "")
                + f"{outputs} outputs), above the budget of {MAX_HEAD_PARAMETERS:,}: use fewer hidden units, "
                "a smaller embedding or fewer classes"
            )
        return self


class PoolCounts(BaseModel):
    items: int
    unlabeled: int
    reserved: int
    labeled: int


class ValidationCounts(BaseModel):
    items: int = Field(description="items in the validation split (never selected, reserved or trained on)")
    labeled: int = Field(description="labeled validation items: they score every head")


class ValidationConfigIn(RequestModel):
    """Hold out a fraction of incoming labels at random: an item's first label sends it to the validation
    split with probability `fraction` (a reproducible draw from `seed` and the item id)."""

    fraction: float = Field(gt=0, lt=1, description="share of newly labeled items held out, e.g. 0.1")
    seed: int = Field(default=0, ge=0, le=2**31 - 1)


class EmbeddingCounts(BaseModel):
    ready: int = Field(description="items with an embedding (only these are selected)")
    pending: int = Field(description="items given by reference, not encoded yet")
    error: int = Field(description="items whose reference could not be encoded (see embedding_error)")


class EncoderConfigIn(RequestModel):
    """The encoder that turns a pool's data references (uri/text) into embeddings."""

    kind: Literal["identity", "text-minilm", "torchscript"] = Field(
        description="identity: uri points at a stored .npy vector; text-minilm: all-MiniLM-L6-v2 (384-d); "
        "torchscript: an uploaded module (model_id from POST /v1/encoders)"
    )
    model_id: Annotated[str, StringConstraints(min_length=1, max_length=32)] | None = None

    @model_validator(mode="after")
    def _model(self) -> EncoderConfigIn:
        if (self.kind == "torchscript") != (self.model_id is not None):
            raise ValueError("`model_id` is required with kind torchscript, and only with it")
        return self


class PoolPatch(RequestModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"encoder": {"kind": "text-minilm"}}]})

    encoder: EncoderConfigIn | None = Field(
        default=None, description="the new encoder (null: none); items given by reference are embedded again"
    )
    validation: ValidationConfigIn | None = Field(
        default=None, description="the random hold-out of incoming labels (null: none); moves no item already labeled"
    )


class PoolOut(BaseModel):
    id: str
    name: str
    task: str
    classes: list[str] | None
    n_outputs: int
    embedding_dim: int
    head: dict[str, object]
    encoder: dict[str, object] | None = None
    validation: dict[str, object] | None = Field(default=None, description="random hold-out of incoming labels")
    counts: PoolCounts = Field(description="every item by status (validation items included)")
    validation_counts: ValidationCounts
    embedding_counts: EmbeddingCounts | None = Field(
        default=None, description="items by embedding status (pools with an encoder)"
    )
    created_at: datetime


class PoolList(BaseModel):
    pools: list[PoolOut]


# ---------------------------------------------------------------------------------------------- items


class ItemIn(RequestModel):
    """An item given by its embedding, or by a reference that the pool's encoder turns into one."""

    id: ExternalId
    embedding: list[Number] | None = Field(default=None, description="embedding_dim numbers")
    uri: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = Field(
        default=None, description="file:///path under the data root, or http(s)://; encoded by the pool's encoder"
    )
    text: Annotated[str, StringConstraints(min_length=1, max_length=100_000)] | None = Field(
        default=None, description="inline text (text encoders)"
    )
    split: Literal["train", "validation"] | None = Field(
        default=None,
        description="validation: held out (never selected or trained on; scores each head). "
        "Omitted: new items are train, existing ones keep their split",
    )
    data: dict[str, Any] | None = Field(
        default=None,
        description='content shown to annotators (a JSON object, e.g. {"text": ...} or {"image": url}); '
        "at most 64 KiB; omitted: the item keeps the data it has",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ItemIn:
        if sum(v is not None for v in (self.embedding, self.uri, self.text)) != 1:
            raise ValueError("give exactly one of `embedding`, `uri` or `text`")
        return self


class ItemsUpsert(RequestModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "items": [
                        {"id": "img-0001", "embedding": [0.1, 0.2, 0.3]},
                        {"id": "doc-7", "text": "a sentence to embed"},
                    ]
                }
            ]
        },
    )

    items: list[ItemIn] = Field(min_length=1)


class UpsertResult(BaseModel):
    created: int
    updated: int
    embed_job_id: str | None = Field(
        default=None, description="only when items were given by reference: the embed job that encodes them"
    )


class ItemOut(BaseModel):
    id: str
    status: Literal["unlabeled", "reserved", "labeled"]
    label: str | None = Field(default=None, description="class name (classification pools)")
    target: list[float] | None = Field(default=None, description="target vector (regression pools)")
    batch_id: str | None = Field(default=None, description="last batch that selected the item")
    reserved_until: datetime | None = None
    labeled_at: datetime | None = None
    split: Literal["train", "validation"] = Field(default="train", description="validation items are held out")
    embedding: list[float] | None = Field(default=None, description="only with include_embedding=true")
    uri: str | None = Field(default=None, description="the item's data reference (items given by uri)")
    embedding_status: Literal["ready", "pending", "error"] = Field(
        default="ready", description="pending: not encoded yet; error: see embedding_error (never selected)"
    )
    embedding_error: str | None = Field(default=None, description="why the reference could not be encoded")
    embedding_source: str | None = Field(default=None, description="encoder name@version that computed it")
    data: dict[str, Any] | None = Field(default=None, description="the item's content (JSON object), if any")


class ItemPage(BaseModel):
    items: list[ItemOut]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last page")


# --------------------------------------------------------------------------------------------- labels


class LabelIn(RequestModel):
    item_id: ExternalId
    label: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    target: list[Number] | None = None
    annotator: Annotated[str, StringConstraints(max_length=200)] | None = None

    @model_validator(mode="after")
    def _one_value(self) -> LabelIn:
        if (self.label is None) == (self.target is None):
            raise ValueError("give exactly one of `label` (class name) or `target` (list of numbers)")
        return self


class LabelsPut(RequestModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"labels": [{"item_id": "img-0001", "label": "cat"}], "annotator": "alice"}]},
    )

    labels: list[LabelIn] = Field(min_length=1)
    annotator: Annotated[str, StringConstraints(max_length=200)] | None = Field(
        default=None, description="default annotator of every label without its own"
    )


class LabelsResult(BaseModel):
    labeled: int


class LabelEvent(BaseModel):
    value: str | list[float] | None
    annotator: str | None
    deleted: bool
    created_at: datetime


class LabelHistory(BaseModel):
    item_id: str
    history: list[LabelEvent]


# ------------------------------------------------------------------------------------------- encoders


class TorchScriptInputConfig(RequestModel):
    """How the worker decodes inputs for an uploaded TorchScript module (stored with it)."""

    input: Literal["image", "array"] = Field(
        default="image",
        description="image: Pillow-decoded, N x C x H x W float32, (pixel/255 - mean)/std; array: .npy, N x *shape",
    )
    image_mode: Literal["L", "RGB"] = Field(default="RGB", description="L: 1 channel, RGB: 3 channels")
    image_size: tuple[Annotated[int, Field(ge=1, le=8192)], Annotated[int, Field(ge=1, le=8192)]] | None = Field(
        default=None, description="[H, W] every image is resized to (bilinear); null: images must share a size"
    )
    mean: list[Number] | None = Field(default=None, description="per channel, subtracted after scaling to [0, 1]")
    std: list[Number] | None = Field(default=None, description="per channel, divided by after the mean")
    output_dim: int | None = Field(default=None, ge=1, le=65536, description="embedding size (checked against pools)")

    @model_validator(mode="after")
    def _channels(self) -> TorchScriptInputConfig:
        c = 1 if self.image_mode == "L" else 3
        for name, values in (("mean", self.mean), ("std", self.std)):
            if values is not None and len(values) != c:
                raise ValueError(f"`{name}` needs {c} value(s) for image_mode {self.image_mode}")
        if self.std is not None and any(not v > 0 for v in self.std):
            raise ValueError("`std` values must be positive")
        return self


class EncoderOut(BaseModel):
    id: str
    name: str
    kind: str
    config: dict[str, object]
    size_bytes: int
    sha256: str
    created_at: datetime


class EncoderList(BaseModel):
    encoders: list[EncoderOut]


class Attempt(BaseModel):
    """One attempt of a job: when and where it ran, and how it ended."""

    n: int = Field(description="attempt number, from 1")
    started_at: datetime
    ended_at: datetime | None = Field(description="null while it runs")
    worker: str | None = Field(description="the worker process that ran it (host:pid)")
    outcome: Literal["running", "succeeded", "failed", "cancelled", "worker_lost"] = Field(
        description="worker_lost: its worker stopped sending heartbeats (killed, lost machine) and the job was "
        "re-queued or, out of attempts, failed"
    )
    reason: str | None = Field(description="why it ended so: the error, or how long the heartbeat was missing")

"""Wire models of pools, items and labels (pydantic). Shape rules live here; rules that depend on a
pool (dimension, classes, task) live in the domain functions."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StringConstraints, model_validator

ExternalId = Annotated[str, StringConstraints(min_length=1, max_length=512)]
# Numbers only (no "1.5" strings); NaN/Infinity literals parse but are rejected by the domain check.
Number = StrictFloat | StrictInt


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------------------- pools


class HeadConfigIn(_Strict):
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


class PoolCreate(_Strict):
    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
    task: Literal["classification", "regression"]
    classes: list[Annotated[str, StringConstraints(min_length=1, max_length=200)]] | None = Field(
        default=None, description="class names (classification, at least 2, unique)", max_length=100_000
    )
    n_outputs: int | None = Field(default=None, ge=1, le=100_000, description="number of targets (regression)")
    embedding_dim: int = Field(ge=1, le=65536)
    head: HeadConfigIn = Field(default_factory=HeadConfigIn)

    @model_validator(mode="after")
    def _task_fields(self) -> PoolCreate:
        if self.task == "classification":
            if self.n_outputs is not None:
                raise ValueError("a classification pool takes `classes`, not `n_outputs`")
            if self.classes is None or len(self.classes) < 2:
                raise ValueError("a classification pool needs `classes`: at least 2 class names")
            dupes = sorted({c for c in self.classes if self.classes.count(c) > 1})
            if dupes:
                raise ValueError(f"class names must be unique; repeated: {dupes[:10]}")
        else:
            if self.classes is not None:
                raise ValueError("a regression pool takes `n_outputs`, not `classes`")
            if self.n_outputs is None:
                raise ValueError("a regression pool needs `n_outputs` (number of targets, >= 1)")
        return self


class PoolCounts(BaseModel):
    items: int
    unlabeled: int
    reserved: int
    labeled: int


class PoolOut(BaseModel):
    id: str
    name: str
    task: str
    classes: list[str] | None
    n_outputs: int
    embedding_dim: int
    head: dict[str, object]
    counts: PoolCounts
    created_at: datetime


class PoolList(BaseModel):
    pools: list[PoolOut]


# ---------------------------------------------------------------------------------------------- items


class ItemIn(_Strict):
    id: ExternalId
    embedding: list[Number] = Field(description="embedding_dim numbers")


class ItemsUpsert(_Strict):
    items: list[ItemIn] = Field(min_length=1)


class UpsertResult(BaseModel):
    created: int
    updated: int


class ItemOut(BaseModel):
    id: str
    status: Literal["unlabeled", "reserved", "labeled"]
    label: str | None = Field(default=None, description="class name (classification pools)")
    target: list[float] | None = Field(default=None, description="target vector (regression pools)")
    batch_id: str | None = Field(default=None, description="last batch that selected the item")
    reserved_until: datetime | None = None
    labeled_at: datetime | None = None
    embedding: list[float] | None = Field(default=None, description="only with include_embedding=true")


class ItemPage(BaseModel):
    items: list[ItemOut]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last page")


# --------------------------------------------------------------------------------------------- labels


class LabelIn(_Strict):
    item_id: ExternalId
    label: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    target: list[Number] | None = None
    annotator: Annotated[str, StringConstraints(max_length=200)] | None = None

    @model_validator(mode="after")
    def _one_value(self) -> LabelIn:
        if (self.label is None) == (self.target is None):
            raise ValueError("give exactly one of `label` (class name) or `target` (list of numbers)")
        return self


class LabelsPut(_Strict):
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

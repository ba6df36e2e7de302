"""The operator allowlist of uploaded TorchScript encoders, and its command-line check.

An encoder may compute with tensors and nothing else. Every method of the module and of all its
submodules (``forward``, helpers, ``__setstate__``) and every scripted hook is taken as a graph, its
calls are inlined (``torch._C._jit_pass_inline`` on a copy), and every node, in nested blocks too,
must be an operator of :data:`ALLOWED_ATEN` or :data:`ALLOWED_PRIM`. Anything else is refused and
named: ``aten::from_file`` and ``aten::save`` (host files), storage and pointer ops, ``prim::Print``,
RPC and fork ops, ``prim::PythonOp``, calls that could not be inlined (``prim::CallMethod`` on a custom
class, ``prim::CallFunction``), and every namespace but ``aten`` and ``prim``.

``python -m worker.torchscript_check NONCE`` reads the module's bytes on stdin and prints one line
``NONCE{"ok": true}`` or ``NONCE{"ok": false, "operator": ..., "where": ..., "message": ...}``. It
caps its own memory and CPU time first (``--memory-bytes``, ``--cpu-seconds``), because loading a
module runs its ``__setstate__``; the API runs it as a child with no secrets (:mod:`service.sandbox`).
The nonce lets the parent tell its answer from anything the module might have printed while loading.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


# Tensor math, nn functional ops, shapes, reductions, creation, and the scalar/list/str helpers that
# scripted Python lowers to. In-place variants (``relu_``) are allowed when their base name is.
def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


ALLOWED_ATEN: frozenset[str] = _words(
    """
    abs absolute acos arccos acosh arccosh add addcdiv addcmul asin arcsin asinh arcsinh atan arctan atan2
    arctan2 atanh arctanh ceil clamp clamp_min clamp_max clip cos cosh div divide true_divide floor_divide
    erf erfc erfinv exp exp2 expm1 floor frac lerp lgamma log log10 log1p log2 logaddexp logaddexp2 logit
    maximum minimum fmax fmin fmod remainder mul multiply neg negative pow float_power reciprocal round
    rsqrt sigmoid sign sgn signbit sin sinh sqrt square sub subtract rsub tan tanh trunc fix hypot
    nan_to_num where masked_fill masked_select masked_scatter bitwise_and bitwise_or bitwise_not bitwise_xor
    logical_and logical_or logical_not logical_xor eq ne lt le gt ge equal isnan isinf isfinite isclose
    allclose copysign deg2rad rad2deg heaviside xlogy sinc logsumexp
    relu relu6 leaky_relu elu selu celu gelu silu mish softplus softsign hardtanh hardsigmoid hardswish
    hardshrink softshrink tanhshrink threshold prelu rrelu glu log_sigmoid softmax log_softmax _softmax
    _log_softmax softmin
    linear bilinear matmul mm bmm addmm addmv addbmm baddbmm mv dot vdot einsum tensordot outer ger
    conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d _convolution convolution
    _convolution_mode batch_norm instance_norm layer_norm group_norm native_layer_norm native_batch_norm
    _batch_norm_impl_index dropout feature_dropout alpha_dropout feature_alpha_dropout embedding
    embedding_bag max_pool1d max_pool2d max_pool3d max_pool1d_with_indices max_pool2d_with_indices
    max_pool3d_with_indices avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d
    adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d pixel_shuffle
    pixel_unshuffle channel_shuffle upsample_nearest1d upsample_nearest2d upsample_nearest3d upsample_linear1d
    upsample_bilinear2d upsample_bicubic2d upsample_trilinear3d _upsample_nearest_exact1d
    _upsample_nearest_exact2d _upsample_nearest_exact3d _upsample_bilinear2d_aa _upsample_bicubic2d_aa
    _upsample_lanczos2d_aa grid_sampler grid_sampler_2d affine_grid_generator pad constant_pad_nd
    reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d replication_pad3d
    circular_pad1d circular_pad2d circular_pad3d _pad_circular _pad_enum scaled_dot_product_attention
    _native_multi_head_attention _transformer_encoder_layer_fwd cosine_similarity pairwise_distance cdist
    linalg_vector_norm linalg_norm norm frobenius_norm renorm one_hot lstm gru rnn_tanh rnn_relu lstm_cell
    gru_cell rnn_tanh_cell rnn_relu_cell
    sum mean prod max min amax amin aminmax argmax argmin std var std_mean var_mean median nanmedian
    nanmean nansum cumsum cumprod cummax cummin all any count_nonzero topk sort argsort kthvalue
    view reshape flatten unflatten squeeze unsqueeze permute transpose t contiguous expand expand_as repeat
    repeat_interleave tile cat concat concatenate stack hstack vstack dstack split split_with_sizes
    tensor_split chunk unbind narrow select slice index_select gather scatter scatter_add index index_put
    index_add index_copy index_fill take_along_dim flip fliplr flipud roll rot90 movedim moveaxis swapaxes
    swapdims diagonal diag diag_embed tril triu view_as reshape_as unfold im2col col2im detach clone type_as
    to float double half bfloat16 int long short bool byte char broadcast_to broadcast_tensors meshgrid
    nonzero unique _unique2 unique_consecutive bucketize searchsorted numel size dim stride fill zero copy
    zeros ones empty full zeros_like ones_like empty_like full_like arange linspace logspace eye rand randn
    randint rand_like randn_like randint_like randperm normal bernoulli tensor scalar_tensor new_zeros
    new_ones new_full new_empty new_tensor
    Int Float Bool Complex ScalarImplicit IntImplicit FloatImplicit ComplexImplicit item _local_scalar_dense
    __getitem__ _set_item __contains__ __is__ __isnot__ __not__ __and__ __or__ __xor__ __round_to_zero_floordiv
    __range_length __derive_index floordiv len append extend insert pop list reverse count clear keys
    values items get setdefault dict format str warn _unwrap_optional is_floating_point is_complex
    is_grad_enabled is_autocast_enabled is_autocast_cpu_enabled is_contiguous requires_grad_ divmod
    mathremainder
    """
)
ALLOWED_PRIM: frozenset[str] = _words(
    """
    Constant ListConstruct ListUnpack TupleConstruct TupleUnpack TupleIndex TupleSlice DictConstruct
    DictIndex GetAttr SetAttr If Loop RaiseException Uninitialized unchecked_cast NumToTensor device dtype
    layout is_cuda is_cpu is_nested is_mkldnn is_quantized is_sparse is_meta requires_grad type shape min
    max abs isinstance data AutogradZero
    """
)
# Never allowed, even where a base name or an in-place spelling would match (named for the reader).
REFUSED: frozenset[str] = frozenset(
    {
        "aten::from_file",
        "aten::save",
        "aten::set_",
        "aten::as_strided",
        "aten::as_strided_",
        "aten::_pin_memory",
        "aten::pin_memory",
        "aten::record_stream",
        "prim::Print",
        "prim::PythonOp",
        "prim::CallFunction",
        "prim::CallMethod",
        "prim::fork",
        "prim::rpc_async",
        "prim::rpc_sync",
        "prim::rpc_remote",
        "prim::CreateObject",
    }
)


MAX_FILE_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Refusal:
    operator: str
    where: str

    @property
    def message(self) -> str:
        return (
            f"the encoder uses the operator {self.operator} (in {self.where}), which is not on the allowlist "
            "of tensor operators: encoders may compute on their input tensor, not read files, print, "
            "call Python or other processes"
        )


def allowed(kind: str) -> bool:
    """Whether a node kind (``aten::relu_``, ``prim::If``, ...) is on the allowlist."""
    if kind in REFUSED:
        return False
    namespace, _, name = kind.partition("::")
    if namespace == "aten":
        return name in ALLOWED_ATEN or (name.endswith("_") and name[:-1] in ALLOWED_ATEN)
    if namespace == "prim":
        return name in ALLOWED_PRIM
    return False


def _nodes(block: Any) -> Iterator[Any]:
    for node in block.nodes():
        yield node
        for sub in node.blocks():
            yield from _nodes(sub)


def _graphs(module: Any) -> Iterator[tuple[str, Any]]:
    """``(where, graph)`` of every method and hook of ``module`` and of all its submodules."""
    for prefix, sub in module.named_modules():
        owner = f"{prefix}." if prefix else ""
        c = sub._c
        for name in c._method_names():
            yield f"method {owner}{name}", c._get_method(name).graph
        for hook in (*c._get_forward_pre_hooks(), *c._get_forward_hooks()):
            yield f"hook {owner}{hook.name}", hook.graph


def check_module(module: Any) -> Refusal | None:
    """The first operator of ``module`` not on the allowlist, or None when it computes only on tensors."""
    import torch

    for where, graph in _graphs(module):
        inlined = graph.copy()
        torch._C._jit_pass_inline(inlined)
        for node in _nodes(inlined):
            kind = node.kind()
            if not allowed(kind):
                return Refusal(kind, where)
    return None


def check_bytes(data: bytes) -> dict[str, Any]:
    """The verdict on a ``torch.jit.save`` archive as a JSON-able dict (never raises)."""
    import torch

    try:
        module = torch.jit.load(io.BytesIO(data), map_location="cpu")
    except Exception as exc:  # not TorchScript, or refers to ops this torch lacks
        return {"ok": False, "unloadable": True, "message": f"cannot load the module: {type(exc).__name__}: {exc}"}
    try:
        refusal = check_module(module)
    except Exception as exc:
        return {"ok": False, "unloadable": True, "message": f"cannot inspect the module: {type(exc).__name__}: {exc}"}
    if refusal is None:
        return {"ok": True}
    return {"ok": False, "operator": refusal.operator, "where": refusal.where, "message": refusal.message}


def address_space_bytes() -> int:
    """This process's virtual address space now (``/proc/self/statm``), 0 where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def limit_self(memory_bytes: int | None, cpu_seconds: int | None) -> None:
    """Cap this process's address space and CPU time (before any untrusted code is loaded).

    The address-space cap is ``memory_bytes`` on top of what the process maps already: callers import
    torch (trusted) first. A CUDA build of torch maps several GB of libraries and reservations on
    import (seen on an H100 worker: a flat 2-3 GB cap failed with "libtorch_cpu.so: failed to map
    segment"), so a flat cap would refuse every module there while bounding nothing the module does.
    """
    import torch  # noqa: F401  (mapped before the cap: see above)

    if memory_bytes:
        cap = address_space_bytes() + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    if cpu_seconds:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))  # what it prints goes to a file


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("nonce")
    p.add_argument("--memory-bytes", type=int, default=None)
    p.add_argument("--cpu-seconds", type=int, default=None)
    args = p.parse_args(argv)
    limit_self(args.memory_bytes, args.cpu_seconds)
    data = sys.stdin.buffer.read()
    verdict = check_bytes(data)
    sys.stdout.write(args.nonce + json.dumps(verdict) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

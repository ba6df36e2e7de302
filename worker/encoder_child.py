"""Run an uploaded TorchScript encoder in a child process, fed and read through pipes.

The parent (a worker, or the in-process runner of embedded mode) holds the database and the secret
key; the child holds neither: it starts with the environment of :func:`service.sandbox.child_env`
(no ``BAIT_*`` variables), in a temporary folder that holds only the module file, with its address
space capped (``RLIMIT_AS``, CPU devices: the limit on top of the interpreter with torch imported)
before the module is loaded. The parent bounds every forward
pass by a wall-clock limit and kills the child's process group when it is exceeded.

Protocol (little-endian): the parent writes frames ``u64 length`` + ``.npy`` bytes (the ``N x ...``
float32 input batch; length 0 ends the child); the child answers ``u8 status`` + ``u64 length`` +
payload: status 0 with the ``N x d`` float32 output as ``.npy``, 1 with the message of an error of
this input (the forward pass raised), 2 with the message of an error of the encoder itself (it
cannot load, uses an operator outside the allowlist, or returns something other than one row per
input). After loading (and checking the module's operators again, for modules stored before the
upload check existed) it sends one status-0 frame with an empty payload (ready) or a status-2 frame.

``python -m worker.encoder_child MODEL_PATH DEVICE [--memory-bytes N]``
"""

from __future__ import annotations

import argparse
import io
import os
import struct
import sys
from typing import Any, BinaryIO

import numpy as np

OK, INPUT_ERROR, ENCODER_ERROR = 0, 1, 2
HEADER = struct.Struct("<Q")
REPLY = struct.Struct("<BQ")


def read_exact(stream: BinaryIO, n: int) -> bytes | None:
    chunks = []
    while n > 0:
        chunk = stream.read(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def reply(out: BinaryIO, status: int, payload: bytes) -> None:
    out.write(REPLY.pack(status, len(payload)))
    out.write(payload)
    out.flush()


def to_npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def error_line(exc: BaseException) -> str:
    """The error itself, without the TorchScript traceback that precedes it in the message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    last = lines[-1] if lines else type(exc).__name__
    return (last if ":" in last else f"{type(exc).__name__}: {last}")[:1000]


def forward(module: Any, x: np.ndarray, device: str) -> tuple[int, bytes]:
    """One forward pass: ``(status, payload)`` per the protocol."""
    import torch

    try:
        with torch.inference_mode():
            out = module(torch.from_numpy(x).to(device))
    except Exception as exc:  # the module rejected this input (or ran out of memory on it)
        return INPUT_ERROR, error_line(exc).encode()
    if isinstance(out, tuple | list) and out:
        out = out[0]
    if not isinstance(out, torch.Tensor):
        return ENCODER_ERROR, f"the TorchScript encoder returned {type(out).__name__}, not a tensor".encode()
    n = int(x.shape[0])
    if out.dim() == 0 or out.shape[0] != n:
        rows = "a scalar" if out.dim() == 0 else f"{out.shape[0]} rows"
        return ENCODER_ERROR, f"the TorchScript encoder returned {rows} for {n} inputs".encode()
    emb = np.ascontiguousarray(out.reshape(n, -1).to(torch.float32).cpu().numpy())
    return OK, to_npy(emb)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model_path")
    p.add_argument("device")
    p.add_argument("--memory-bytes", type=int, default=None)
    args = p.parse_args(argv)

    from worker.torchscript_check import check_module, limit_self

    limit_self(args.memory_bytes, None)
    # The protocol owns the original stdout; anything else written to fd 1 goes to stderr.
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    proto_in = sys.stdin.buffer

    import torch

    try:
        module = torch.jit.load(args.model_path, map_location=args.device)
        module.eval()
    except Exception as exc:
        reply(proto_out, ENCODER_ERROR, f"cannot load the TorchScript encoder: {type(exc).__name__}: {exc}".encode())
        return 0
    # Checked at upload already; checked again so that modules stored before the check existed never run.
    refusal = check_module(module)
    if refusal is not None:
        reply(proto_out, ENCODER_ERROR, refusal.message.encode())
        return 0
    reply(proto_out, OK, b"")
    while True:
        head = read_exact(proto_in, HEADER.size)
        if head is None:
            return 0
        (n,) = HEADER.unpack(head)
        if n == 0:
            return 0
        data = read_exact(proto_in, n)
        if data is None:
            return 0
        x = np.load(io.BytesIO(data), allow_pickle=False)
        status, payload = forward(module, x, args.device)
        reply(proto_out, status, payload)


if __name__ == "__main__":
    raise SystemExit(main())

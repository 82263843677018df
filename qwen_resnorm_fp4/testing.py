"""Test-only ops, for the test suite and nothing else: the release package never registers them.

Importing this module defines the ``qwen_fp4_testing`` ops and loads their small CUDA library
(``_C_testing*.so``, built by setup.py next to ``_C``):

- ``torch.ops.qwen_fp4_testing.rcp_approx(x)``: the GPU's approximate reciprocal (rcp.approx.ftz.f32),
  element-wise on fp32, so that the reference reproduces fast mode byte for byte (:func:`gpu_rcp`);
- ``torch.ops.qwen_fp4_testing.e2m1_codes(x, toolkit)``: E2M1 codes of fp32 values by the kernels'
  conversion, or (toolkit=True) by cuda_fp4.h, for the exhaustive equality test;
- ``torch.ops.qwen_fp4_testing.div_full_rcp(x)``: the GPU's div.full.f32(1, x), the FP8 ops' inverse input
  scale, element-wise on fp32 (:func:`gpu_div_full_rcp`), which reference.fp8_inverse_scale must equal.

All take float32 CUDA tensors; without the library they have no implementation (:func:`available`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import torch

from . import ops  # noqa: F401 - the release ops and their library first (the test library links nothing of it)

NAMESPACE = "qwen_fp4_testing"
SCHEMAS = {
    "rcp_approx": "rcp_approx(Tensor x) -> Tensor",
    "e2m1_codes": "e2m1_codes(Tensor x, bool toolkit) -> Tensor",
    "div_full_rcp": "div_full_rcp(Tensor x) -> Tensor",
}

_lib = torch.library.Library(NAMESPACE, "DEF")
for _schema in SCHEMAS.values():
    _lib.define(_schema)


@torch.library.register_fake(f"{NAMESPACE}::rcp_approx")
def _rcp_approx_fake(x):
    return torch.empty_like(x)


@torch.library.register_fake(f"{NAMESPACE}::div_full_rcp")
def _div_full_rcp_fake(x):
    return torch.empty_like(x)


@torch.library.register_fake(f"{NAMESPACE}::e2m1_codes")
def _e2m1_codes_fake(x, toolkit):
    return torch.empty_like(x, dtype=torch.uint8)


def _load() -> Optional[Path]:
    candidates = sorted(Path(__file__).parent.glob("_C_testing.*so"))
    if not candidates:
        return None
    torch.ops.load_library(str(candidates[0]))
    return candidates[0]


_loaded = _load()


def available() -> bool:
    """True when the test library is loaded (its ops serve CUDA tensors)."""
    return _loaded is not None


def gpu_rcp(x: torch.Tensor) -> torch.Tensor:
    """The GPU's approximate reciprocal (rcp.approx.ftz.f32) of an fp32 CUDA tensor."""
    return torch.ops.qwen_fp4_testing.rcp_approx(x.float().contiguous())


def gpu_div_full_rcp(x: torch.Tensor) -> torch.Tensor:
    """The GPU's div.full.f32(1, x) of an fp32 CUDA tensor: the FP8 ops' inverse input scale."""
    return torch.ops.qwen_fp4_testing.div_full_rcp(x.float().contiguous())


def e2m1_codes(x: torch.Tensor, toolkit: bool) -> torch.Tensor:
    """E2M1 codes (uint8) of fp32 CUDA values by the kernels' conversion, or by cuda_fp4.h (``toolkit``)."""
    return torch.ops.qwen_fp4_testing.e2m1_codes(x, toolkit)


def reference_rcp_for(device: torch.device) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    """The reciprocal that makes the reference's fast mode byte-exact on ``device`` (None: IEEE 1/x)."""
    return gpu_rcp if torch.device(device).type == "cuda" else None


__all__ = ["available", "gpu_rcp", "gpu_div_full_rcp", "e2m1_codes", "reference_rcp_for", "NAMESPACE"]

"""GPU: the kernels on a sequence shard give the bytes of the same rows of the full call (context parallelism:
each rank runs the op on its shard, with the static global scale calibrated on the whole sequence).

For every modulation form a sharded model passes (tests/helpers/shards.py: [D], [B, D], per token contiguous, chunk
views, stride-0 expanded views, modulate_index with its boundary inside the shard), widths 1536 (a generic
shape), 3072 and 5120 (the fixed shapes), and shards whose row count is not a multiple of 128:

- NVFP4 ``resnorm_quant``: the shard's packed bytes, its scale bytes read through the 128x4 layout (padding
  rows zero) and residual_out equal those rows of the full call, bit for bit, whatever block shape each call's
  row count selects (the LayerNorm sums add in an order fixed by D alone: csrc/reduce.cuh row_sum), the
  "cross" geometry included (2600 rows take the many-rows shapes, its 1300-row shard the few-rows ones).
- The fused path (``try_fused_resnorm_quant``) serves every shard (no decline) with the raw op's bytes.
- A stride-0 per-token view gives the bytes of its contiguous copy (the op reads it in place).
- FP8 ``resnorm_quant_fp8`` (the FP8 output op): the same comparisons of its E4M3 bytes and residual_out.
"""

from __future__ import annotations

from typing import Dict

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import _library
from qwen_resnorm_fp4.linear import FP4_AMAX_SCALE
from helpers.tiers import sweep
from helpers.shards import FORMS, full_inputs, shard_inputs, shard_matches_full

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and _library.cuda_available()),
                       reason="needs a CUDA GPU and the compiled library"),
]

OPS = torch.ops.qwen_fp4
DIMS = (1536, 3072, 5120)
GEOMETRIES = {
    "few-b2": (2, 333, 111, 222),          # 666 rows, shard 222
    "few-split-b1": (1, 1000, 450, 550),   # shard 100 rows: the two-CTAs-a-row kernel at 3072 / 5120
    "many-b2": (2, 2100, 1050, 2100),      # 4200 rows, shard 2100
    "many-b1": (1, 4500, 2000, 4250),      # shard 2250
    "cross-b1": (1, 2600, 1300, 2600),     # 2600 rows (many), shard 1300 (few)
    "cross-split-b1": (1, 2200, 1000, 1100),  # 2200 rows (many), shard 100 (the two-CTAs-a-row kernel)
}
# The default run's subset (the rest: the exhaustive sweep): every form and both formats, at a generic and a
# tuned width, on a split-kernel shard, a many-rows shard of a many-rows call, and a shard of the other class.
DEFAULT_DIMS = (1536, 3072)
DEFAULT_GEOMETRIES = ("few-split-b1", "many-b2", "cross-b1")
EPS = 1e-6
#: E4M3's largest finite value: the FP8 input scale is amax / 448 (the ModelOpt convention).
E4M3_MAX = 448.0

FP8_OP = torch.ops.qwen_fp4.resnorm_quant_fp8
FORMATS = ["nvfp4", "fp8"]


def _contiguous_index(inp):
    """The raw op reads modulate_index as a contiguous [B, S] (the typed wrappers copy a shard's view)."""
    index = inp["modulate_index"]
    return None if index is None else index.contiguous()


def _nvfp4(inp, global_scale):
    """(packed, scales, residual_out) of the raw op, gate/scale/shift read where they are."""
    return OPS.resnorm_quant(inp["residual"], inp["x"], None, inp["gate"], inp["scale"], inp["shift"], global_scale,
                             EPS, True, None, None, _contiguous_index(inp))


def _resnorm(inp):
    return OPS.resnorm(inp["residual"], inp["x"], None, inp["gate"], inp["scale"], inp["shift"], EPS, None, None,
                       _contiguous_index(inp))


def _fp8(inp, input_scale):
    """(E4M3 bytes as uint8, residual_out) of resnorm_quant_fp8, its arguments bound by the op's schema names."""
    values = dict(residual=inp["residual"], x=inp["x"], bias=None, gate=inp["gate"], scale=inp["scale"],
                  shift=inp["shift"], input_scale=input_scale, eps=EPS, weight=None, norm_bias=None,
                  modulate_index=_contiguous_index(inp))
    kwargs = {}
    for arg in FP8_OP.default._schema.arguments:
        if arg.name in values:
            kwargs[arg.name] = values[arg.name]
        elif not arg.has_default_value():
            raise AssertionError(f"resnorm_quant_fp8 takes {arg.name!r}, which this test does not pass: add it to "
                                 "_fp8's values")
    y, residual_out = FP8_OP.default(**kwargs)[:2]
    return y.view(torch.uint8), residual_out


def _cases(fmt: str, full: Dict[str, object], shard: Dict[str, object]):
    """(full outputs, shard outputs) of one format with its static scale from the full call's y."""
    y, _ = _resnorm(full)
    amax = y.float().abs().amax().clamp(min=1e-6).reshape(1)
    if fmt == "nvfp4":
        g = (FP4_AMAX_SCALE / amax).float()
        return _nvfp4(full, g), _nvfp4(shard, g), g
    s = (amax / E4M3_MAX).float()
    return _fp8(full, s), _fp8(shard, s), s


@pytest.mark.parametrize("fmt", FORMATS)
@sweep("D", DIMS, DEFAULT_DIMS)
@sweep("geometry", list(GEOMETRIES), DEFAULT_GEOMETRIES)
@pytest.mark.parametrize("form", FORMS)
def test_shard_equals_rows_of_full_gpu(form, geometry, D, fmt):
    B, S, s0, s1 = GEOMETRIES[geometry]
    full = full_inputs(B, S, D, form, boundary=s0 + (s1 - s0) // 3, seed=D + S, device="cuda",
                       generate_on_device=True)
    shard = shard_inputs(full, s0, s1)
    if form == "indexed":
        assert bool((shard["modulate_index"] == 0).any()) and bool((shard["modulate_index"] != 0).any())
    f_out, s_out, static_scale = _cases(fmt, full, shard)
    torch.cuda.synchronize()

    if fmt == "nvfp4":
        problem = shard_matches_full(f_out, s_out, B, S, s0, s1, quantized_exact=True)
        assert problem is None, problem
        # the fused path serves the shard as a sharded model hands it over (index view included)
        fc1 = type("FC1", (), {"in_features": D, "input_global_scale": static_scale})()
        result = q.try_fused_resnorm_quant(shard["residual"], shard["x"], shard["gate"], shard["scale"],
                                           shard["shift"], fc1, eps=EPS, modulate_index=shard["modulate_index"],
                                           fast_math=True)
        assert result is not None, (q.last_decline_reason(), q.last_decline_detail())
        (packed, scales), residual_out, _ = result
        assert torch.equal(packed, s_out[0]) and torch.equal(scales, s_out[1]) and torch.equal(residual_out, s_out[2])
    else:
        (f_y, f_res), (y, res) = f_out, s_out
        assert torch.equal(res, f_res[:, s0:s1])
        assert torch.equal(y, f_y[:, s0:s1])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("D", DIMS)
def test_stride0_per_token_equals_its_copy_gpu(D, fmt):
    """The op reads a stride-0 per-token view in place and gets the bytes of its contiguous copy, on the full
    sequence and on a shard of it."""
    B, S, s0, s1 = 2, 777, 300, 777
    full = full_inputs(B, S, D, "token_stride0", boundary=0, seed=D, device="cuda", generate_on_device=True)
    assert full["gate"].stride()[1] == 0
    for inp in (full, shard_inputs(full, s0, s1)):
        copied = dict(inp, **{k: inp[k].contiguous() for k in ("gate", "scale", "shift")})
        a, b, _ = _cases(fmt, inp, copied)
        for x, y in zip(a, b):
            assert torch.equal(x, y)

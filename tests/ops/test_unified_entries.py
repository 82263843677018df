"""The unified entries (api.residual_norm, norm_modulate_quantize, quantize): the output format an argument,
the op found in the op table's FUSIONS, the same bytes as the format's own wrapper; a setting of another
format, an unknown format and a missing or extra quantization scale are refused, naming the argument."""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4 as q
import qwen_resnorm_fp4.ops as ops
from helpers.inputs import make_inputs

GS, INPUT_SCALE = torch.tensor([40.0]), torch.tensor([0.02])


def _same_bytes(a, b) -> bool:
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    return len(a) == len(b) and all(torch.equal(u.view(torch.uint8), v.view(torch.uint8))
                                    if u.element_size() == 1 else torch.equal(u, v) for u, v in zip(a, b))


@pytest.fixture
def inp():
    return make_inputs(2, 4, 128, "batch", torch.bfloat16, seed=7, affine=True)


@pytest.mark.parametrize("fmt,own", [("nvfp4", q.resnorm_quant), ("fp8", q.resnorm_quant_fp8), ("bf16", q.resnorm)])
def test_residual_norm_equals_the_formats_own_wrapper(inp, fmt, own):
    args = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"])
    kw = dict(weight=inp["weight"], norm_bias=inp["norm_bias"])
    scale = {"nvfp4": GS, "fp8": INPUT_SCALE, "bf16": None}[fmt]
    want = own(*args, *(() if scale is None else (scale,)), 1e-5, **kw)
    assert _same_bytes(q.residual_norm(*args, scale, 1e-5, format=fmt, **kw), want)


@pytest.mark.parametrize("fmt,own,scale", [("nvfp4", q.norm_modulate_quant, GS),
                                           ("fp8", q.norm_modulate_quant_fp8, INPUT_SCALE)])
def test_norm_modulate_quantize_equals_the_formats_own_wrapper(inp, fmt, own, scale):
    args = (inp["x"], inp["scale"], inp["shift"], scale)
    assert _same_bytes(q.norm_modulate_quantize(*args, format=fmt), own(*args))


@pytest.mark.parametrize("fmt,own,scale", [("nvfp4", q.nvfp4_quantize, GS), ("fp8", q.fp8_quantize, INPUT_SCALE)])
def test_quantize_equals_the_formats_own_wrapper(inp, fmt, own, scale):
    assert _same_bytes(q.quantize(inp["x"], scale, format=fmt), own(inp["x"], scale))


def test_every_fusion_of_the_table_has_an_entry_point():
    """Each fusion of the table has its unified entry, exported by the package."""
    import qwen_resnorm_fp4.api as api

    assert set(api.ENTRY_POINTS) == {fusion for fusion, _ in ops.FUSIONS}
    assert all(getattr(q, fn.__name__) is fn for fn in api.ENTRY_POINTS.values())
    assert all(ops.OPS[name].format == fmt for (_, fmt), name in ops.FUSIONS.items())


def test_gelu_tanh_quantize_equals_the_fp8_wrapper_and_has_no_other_format(inp):
    assert _same_bytes(q.gelu_tanh_quantize(inp["x"], INPUT_SCALE), q.gelu_tanh_fp8_quantize(inp["x"], INPUT_SCALE))
    with pytest.raises(ValueError, match=r"^format must be one of \['fp8'\]"):
        q.gelu_tanh_quantize(inp["x"], GS, format="nvfp4")


@pytest.mark.parametrize("kw,error,pattern", [
    (dict(format="fp8", fast_math=True), ValueError, r"^fast_math is a setting of the NVFP4 quantizer"),
    (dict(format="fp8", nvfp4_4over6=None), ValueError, r"^nvfp4_4over6 is a setting of the NVFP4 quantizer"),
    (dict(format="int4"), ValueError, r"^format must be one of \['bf16', 'fp8', 'nvfp4'\]"),
    (dict(format="bf16", quant_scale=GS), ValueError, r"^quant_scale must be None"),
    (dict(format="nvfp4", quant_scale=None), ValueError, r"^quant_scale is required"),
])
def test_refusals_name_the_argument(inp, kw, error, pattern):
    kw = dict(kw)
    scale = kw.pop("quant_scale", INPUT_SCALE if kw["format"] == "fp8" else GS)
    args = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"], scale)
    with pytest.raises(error, match=pattern):
        q.residual_norm(*args, **kw)

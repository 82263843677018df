"""GPU tests of the 4over6 recipe (skipped without a GPU and the compiled library): for every configuration
and both modes, resnorm_quant and nvfp4_quantize on the GPU give the bytes of the reference quantizer applied
to the GPU's own y (fast mode with the GPU's rcp.approx, qwen_resnorm_fp4.testing.gpu_rcp), the fused op the
bytes of resnorm + nvfp4_quantize; special values and extreme global scales; the C++ refusal of bad codes;
and on Blackwell the bytes of flashinfer.fp4_quantize(..., nvfp4_4over6=...)."""

from __future__ import annotations

import itertools

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import reference
from qwen_resnorm_fp4.linear import FP4_AMAX_SCALE
from qwen_resnorm_fp4.testing import gpu_rcp
from qwen_resnorm_fp4.recipe import NVFP44Over6Config, nvfp4_4over6_code
from helpers.tiers import sweep
from helpers.reliability import block_inputs, special_values_y

pytestmark = pytest.mark.gpu

CONFIGS = [NVFP44Over6Config(e4m3_max=e, err_mode=m, err_use_fast_math=f)
           for e, m, f in itertools.product((448, 256), ("MAE", "MSE"), (False, True))]
MODES = pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
EVERY_CONFIG = pytest.mark.parametrize("config", CONFIGS, ids=repr)
# The shape matrix's default configurations: one of each e4m3_max, error mode and error form; every configuration
# runs by default in test_general_parameters and test_special_values_and_extreme_global_scales.
DEFAULT_CONFIGS = [NVFP44Over6Config(e4m3_max=448, err_mode="MSE", err_use_fast_math=False),
                   NVFP44Over6Config(e4m3_max=256, err_mode="MAE", err_use_fast_math=True)]



def _reference(y, G, fast, code):
    return reference.nvfp4_quantize(y, G, fast, rcp=gpu_rcp if fast else None, nvfp4_4over6_code=code)


def _global_scale(y, config):
    amax = y.float().abs().amax().clamp(min=1e-6)
    return (config.e4m3_max * 6.0 / amax).reshape(1).float()


@sweep("config", CONFIGS, DEFAULT_CONFIGS, ids=repr)
@MODES
@pytest.mark.parametrize("cols", (64, 3072, 5120, 16384))
@sweep("rows", (1, 17, 129, 2048, 4113), (129, 4113))
def test_fused_and_quantize_match_reference(config, fast, cols, rows, seed):
    name = f"{config!r} fast={fast} rows={rows} D={cols} seed={seed}"
    kw = block_inputs(rows, cols, bias=False, device="cuda", generate_on_device=True, seed=seed)
    args = (kw["residual"], kw["x"], kw["bias"], kw["gate"], kw["scale"], kw["shift"])
    y, r_out = q.resnorm(*args, 1e-6)
    G = _global_scale(y, config)
    code = nvfp4_4over6_code(config)
    packed, scales, r_fused = q.resnorm_quant(*args, G, 1e-6, fast, nvfp4_4over6=config)
    packed_u, scales_u = q.nvfp4_quantize(y, G, fast, nvfp4_4over6=config)
    assert torch.equal(packed, packed_u), name
    assert torch.equal(scales, scales_u), name
    assert torch.equal(r_fused, r_out), name
    p_ref, s_ref = _reference(y, G, fast, code)
    assert torch.equal(scales, s_ref), f"{name}: scales differ from the reference"
    assert torch.equal(packed, p_ref), f"{name}: packed differs from the reference"
    if rows >= 129:  # the recipe was exercised: its bytes are not the standard recipe's
        assert not torch.equal(scales, q.nvfp4_quantize(y, G, fast, nvfp4_4over6=None)[1]), name


@EVERY_CONFIG
@MODES
@pytest.mark.parametrize("param_dtype,bias,affine,form", ((torch.float32, True, True, "batch"),
                                                           (torch.bfloat16, False, False, "indexed")))
def test_general_parameters(config, fast, param_dtype, bias, affine, form, seed):
    """fp32 parameters, bias, an affine norm and modulate_index: the recipe's one row kernel per shape serves
    them all, with the bytes of resnorm + nvfp4_quantize."""
    kw = block_inputs(512, 3072, batches=2, form=form, param_dtype=param_dtype, bias=bias, affine=affine,
                      device="cuda", generate_on_device=True, seed=seed)
    args = (kw["residual"], kw["x"], kw["bias"], kw["gate"], kw["scale"], kw["shift"])
    extra = dict(weight=kw["weight"], norm_bias=kw["norm_bias"], modulate_index=kw["modulate_index"])
    y, _ = q.resnorm(*args, 1e-6, **extra)
    G = _global_scale(y, config)
    packed, scales, _ = q.resnorm_quant(*args, G, 1e-6, fast, nvfp4_4over6=config, **extra)
    p_ref, s_ref = _reference(y, G, fast, nvfp4_4over6_code(config))
    assert torch.equal(scales, s_ref) and torch.equal(packed, p_ref)


@EVERY_CONFIG
def test_special_values_and_extreme_global_scales(config, seed):
    """Zeros, signed zeros, subnormals, huge values, inf, NaN (also with the sign bit), all-zero, all-NaN and
    half -0 blocks, at global scales from 0 and negative to 1e20 (zero-scale candidates, no guard in fast
    mode)."""
    y = special_values_y(1000, 1024, seed)
    y[4, :16] = 3.0  # equal values: the candidates tie
    code = nvfp4_4over6_code(config)
    for fast in (True, False):
        for gs in (1.0, 448 * 6 / 3.0, 2.0 ** -100, 1e-20, 1e20, 3e38, -2.0, 0.0):
            G = torch.tensor([gs], device="cuda")
            packed, scales = q.nvfp4_quantize(y, G, fast, nvfp4_4over6=config)
            p_ref, s_ref = _reference(y, G, fast, code)
            assert torch.equal(scales, s_ref), f"{config!r} fast={fast} G={gs}: scales"
            assert torch.equal(packed, p_ref), f"{config!r} fast={fast} G={gs}: packed"


def test_cuda_op_refuses_bad_codes():
    y = torch.randn(4, 64, device="cuda").bfloat16()
    G = torch.tensor([1.0], device="cuda")
    for code in (-1, 2, 9, 13, 32):
        with pytest.raises((RuntimeError, ValueError), match="nvfp4_4over6_code"):
            torch.ops.qwen_fp4.nvfp4_quantize(y, G, True, code)


def test_cuda_graph_replay_matches_eager(seed):
    kw = block_inputs(256, 3072, bias=False, device="cuda", generate_on_device=True, seed=seed)
    args = (kw["residual"], kw["x"], kw["bias"], kw["gate"], kw["scale"], kw["shift"])
    config = NVFP44Over6Config(err_mode="MSE")
    G = torch.tensor([FP4_AMAX_SCALE / 8.0], device="cuda")
    eager = q.resnorm_quant(*args, G, 1e-6, True, nvfp4_4over6=config)
    q.resnorm_quant(*args, G, 1e-6, True, nvfp4_4over6=config)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = q.resnorm_quant(*args, G, 1e-6, True, nvfp4_4over6=config)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(eager, captured))


@pytest.mark.blackwell
@EVERY_CONFIG
@MODES
def test_matches_flashinfer_fp4_quantize(config, fast, monkeypatch, seed):
    flashinfer = pytest.importorskip("flashinfer")
    if not fast:
        monkeypatch.setenv("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "1")
    theirs = flashinfer.NVFP44Over6Config(e4m3_max=config.e4m3_max, err_mode=config.err_mode,
                                         err_use_fast_math=config.err_use_fast_math)
    kw = block_inputs(4113, 3072, bias=False, device="cuda", generate_on_device=True, seed=seed)
    args = (kw["residual"], kw["x"], None, kw["gate"], kw["scale"], kw["shift"])
    y, _ = q.resnorm(*args)
    G = _global_scale(y, config)
    for ours in (config, theirs):  # FlashInfer's config object is taken as it is
        packed, scales, _ = q.resnorm_quant(*args, G, 1e-6, fast, nvfp4_4over6=ours)
        fi_packed, fi_scales = flashinfer.fp4_quantize(y.reshape(-1, 3072), G, 16, False, True,
                                                       nvfp4_4over6=theirs)
        assert torch.equal(packed, fi_packed.view(torch.uint8).reshape(packed.shape))
        assert torch.equal(scales.reshape(-1), fi_scales.view(torch.uint8).reshape(-1)[: scales.numel()])
        p_q, s_q = q.nvfp4_quantize(y, G, fast, nvfp4_4over6=ours)
        assert torch.equal(p_q, packed) and torch.equal(s_q, scales)

"""``convert_transformer(format="fp8")``: diffusers' Qwen-Image, Qwen-Image 2.1, FLUX.1 and Wan with FP8Linear
layers and the fused segment writing FC1's E4M3 input; fused and unfused byte-identical, every segment
counted, restore exact; the ``linears`` presets ("fc1", "all", "modelopt") and lists of names; the errors.

CPU tests (skipped when diffusers is not importable): the small models of tests/helpers/diffusers_models.py
(width 64, 1-2 blocks, random bf16 weights, batch 2). The real-width GPU case is in
tests/gemm/test_gpu_fp8_linear.py.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch

import qwen_resnorm_fp4.integrations.diffusers as qd
from qwen_resnorm_fp4 import FP8Linear, NVFP4Linear
from helpers.reliability import rel_err
from helpers.diffusers_models import SMALL_CASES, flux, fused_then_unfused, needs_diffusers, qwen_image, run, sha256


def check_fp8_fused_equals_unfused(model, inputs: List[Dict[str, Any]], segments: int, *, linears,
                                   allow_cpu: bool = True) -> List[str]:
    """Calibrated FP8 conversion; fused == unfused (bytes) with every segment counted; the converted layers
    are FP8Linear and the others untouched; restore gives the original outputs back. Returns report lines."""
    originals = [run(model, inp) for inp in inputs]
    qd.convert_transformer(model, mode="fused", format="fp8", linears=linears, calibration_inputs=inputs,
                           allow_cpu=allow_cpu)
    lines = []
    try:
        info = qd.conversion_info(model)
        assert info.format == "fp8" and info.model_type == type(model).__name__
        # the FFN segments, plus the GELU -> FP8 FC2 ones and, in Qwen-Image, norm1 -> FP8 q/k/v: per stream
        # three with linears="all", two with "modelopt" (FC2 stays BF16)
        qwen = type(model).__name__ == "QwenImageTransformer2DModel"
        per_stream = {"fc1": 1, "all": 3 if qwen else None, "modelopt": 2 if qwen else None}.get(linears) \
            if isinstance(linears, str) else None
        if per_stream is None:
            assert info.segments_per_forward >= segments
        else:
            assert info.segments_per_forward == per_stream * segments, info.segments_per_forward
        segments = info.segments_per_forward
        names = set(qd.linear_names(model, linears, "fp8"))
        assert set(info.input_amax) == names
        for name, module in model.named_modules():
            if name in names:
                assert isinstance(module, FP8Linear), name
                assert torch.equal(module.input_scale, torch.tensor([info.input_amax[name] / 448.0],
                                                                    device=module.input_scale.device)), name
            assert not isinstance(module, NVFP4Linear), name
        for inp, original in zip(inputs, originals):
            fused = fused_then_unfused(model, inp, segments)
            err = rel_err(fused, original)
            assert 0 < err < 0.1, err
            lines.append(f"{type(model).__name__} fp8 linears={linears}: {len(names)} FP8 layers, rel. error vs "
                         f"BF16 {err:.4f}, sha256 {sha256(fused)[:16]} (fused and unfused)")
    finally:
        qd.restore_transformer(model)
    for inp, original in zip(inputs, originals):
        assert torch.equal(run(model, inp), original)
    return lines


@needs_diffusers
@pytest.mark.parametrize("linears", ["fc1", "all", "modelopt"])
@pytest.mark.parametrize("case", list(SMALL_CASES))
def test_small_model_fp8_fused_equals_unfused_cpu(case, linears):
    model, inputs, segments = SMALL_CASES[case]()
    check_fp8_fused_equals_unfused(model, inputs, segments, linears=linears)


@needs_diffusers
def test_modelopt_preset_keeps_what_sglang_keeps_in_bf16():
    model, inputs, _ = qwen_image(False)
    names = qd.linear_names(model, "modelopt", "fp8")
    block = [n[len("transformer_blocks.0."):] for n in names if n.startswith("transformer_blocks.0.")]
    assert sorted(block) == sorted([
        "img_mlp.net.0.proj", "txt_mlp.net.0.proj", "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
        "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"])
    every = set(qd.linear_names(model, "all", "fp8"))
    assert every - set(names) == {f"transformer_blocks.{b}.{n}" for b in (0, 1)
                                  for n in ("img_mod.1", "txt_mod.1", "img_mlp.net.2", "txt_mlp.net.2")}
    qd.convert_transformer(model, format="fp8", linears="modelopt", calibration_inputs=inputs, allow_cpu=True)
    try:
        b = model.transformer_blocks[0]
        assert type(b.img_mod[1]) is torch.nn.Linear and type(b.img_mlp.net[2]) is torch.nn.Linear
        assert isinstance(b.attn.to_out[0], FP8Linear) and isinstance(b.img_mlp.net[0].proj, FP8Linear)
        assert type(model.proj_out) is torch.nn.Linear and type(model.img_in) is torch.nn.Linear
    finally:
        qd.restore_transformer(model)
    # FLUX.1: the single-stream blocks' modulation Linear stays BF16 too
    fmodel, _, _ = flux(2, 32, 1)
    fnames = qd.linear_names(fmodel, "modelopt", "fp8")
    assert "single_transformer_blocks.0.norm.linear" not in fnames
    assert "single_transformer_blocks.0.proj_mlp" in fnames and "transformer_blocks.0.norm1.linear" not in fnames


@needs_diffusers
def test_list_of_names():
    model, inputs, segments = qwen_image(True)
    fc1 = qd.linear_names(model, "fc1")
    relative = ["img_mlp.net.0.proj", "txt_mlp.net.0.proj", "attn.to_q", "attn.to_out.0"]
    names = qd.linear_names(model, relative, "fp8")
    assert names == [n for n in qd.linear_names(model, "all", "fp8")
                     if any(n.endswith("." + r) for r in relative)]
    assert len(names) == 4 * 2
    full = fc1 + ["transformer_blocks.1.attn.to_k"]
    assert qd.linear_names(model, full, "fp8") == [n for n in qd.linear_names(model, "all", "fp8") if n in full]
    lines = check_fp8_fused_equals_unfused(model, inputs, segments, linears=relative)
    assert lines
    qd.convert_transformer(model, format="fp8", linears=tuple(full), calibration_inputs=inputs, allow_cpu=True)
    try:
        assert qd.conversion_info(model).linears == tuple(full)
        assert isinstance(model.transformer_blocks[1].attn.to_k, FP8Linear)
        assert type(model.transformer_blocks[0].attn.to_k) is torch.nn.Linear
    finally:
        qd.restore_transformer(model)


@needs_diffusers
def test_differing_qkv_input_scales_keep_each_layers_own_quantization():
    """Block 0's to_k with its own input amax (a checkpoint's scales): that stream keeps diffusers' norm1 and
    each projection's quantization; the others share one; fused == unfused still."""
    model, inputs, segments = qwen_image(False)
    amax = qd.calibrate_input_amax(model, inputs, "all", "fp8")
    amax["transformer_blocks.0.attn.to_k"] *= 2
    qd.convert_transformer(model, format="fp8", linears="all", input_amax=amax, allow_cpu=True)
    try:
        stats = qd.fused_path_stats(model, per_block=True)["blocks"]
        assert set(stats["transformer_blocks.0"]) == {"img", "txt", "img.gelu", "txt.gelu", "txt.attn"}
        assert set(stats["transformer_blocks.1"]) == {"img", "txt", "img.gelu", "txt.gelu", "img.attn", "txt.attn"}
        assert qd.conversion_info(model).segments_per_forward == 11
        fused = run(model, inputs[0])
        assert qd.fused_path_stats(model, reset=True)["fused"] == 11
        qd.set_mode(model, "unfused")
        assert torch.equal(fused, run(model, inputs[0]))
    finally:
        qd.restore_transformer(model)


@needs_diffusers
def test_nvfp4_takes_the_new_linears_forms_too():
    model, inputs, segments = qwen_image(False)
    qd.convert_transformer(model, format="nvfp4", linears="modelopt", calibration_inputs=inputs, allow_cpu=True)
    try:
        assert qd.conversion_info(model).format == "nvfp4"
        assert isinstance(model.transformer_blocks[0].attn.to_q, NVFP4Linear)
        assert type(model.transformer_blocks[0].img_mod[1]) is torch.nn.Linear
        fused = run(model, inputs[0])
        qd.set_mode(model, "unfused")
        assert torch.equal(fused, run(model, inputs[0]))
    finally:
        qd.restore_transformer(model)


@needs_diffusers
def test_fp8_conversion_errors_leave_the_model_untouched():
    model, inputs, _ = qwen_image(False)
    original = run(model, inputs[0])
    with pytest.raises(ValueError, match="format must be one of"):
        qd.convert_transformer(model, format="int8", input_amax=1.0)
    with pytest.raises(ValueError, match="fast_math is a setting of the NVFP4 quantizer"):
        qd.convert_transformer(model, format="fp8", input_amax=1.0, fast_math=True)
    with pytest.raises(ValueError, match="gemm_backend is a setting of NVFP4Linear"):
        qd.convert_transformer(model, format="fp8", input_amax=1.0, gemm_backend="reference")
    with pytest.raises(TypeError, match="use_fast_accum"):
        qd.convert_transformer(model, format="fp8", input_amax=1.0, use_fast_accum=1)
    with pytest.raises(ValueError, match="must include every block's FFN input layers"):
        qd.convert_transformer(model, format="fp8", input_amax=1.0, linears=["attn.to_q"])
    with pytest.raises(ValueError, match="not a block Linear"):
        qd.convert_transformer(model, format="fp8", input_amax=1.0,
                               linears=qd.linear_names(model, "fc1") + ["proj_out"])
    with pytest.raises(TypeError, match="linears must be one of"):
        qd.convert_transformer(model, format="fp8", input_amax=1.0, linears=[])
    with pytest.raises(ValueError, match="linears must be one of"):
        qd.convert_transformer(model, format="fp8", input_amax=1.0, linears="attention")
    assert qd.conversion_info(model) is None
    assert all(not isinstance(m, (FP8Linear, NVFP4Linear)) for m in model.modules())
    assert torch.equal(run(model, inputs[0]), original)


@needs_diffusers
def test_fp8_fused_declines_on_cpu_without_allow_cpu_and_falls_back():
    model, inputs, segments = qwen_image(True)
    qd.convert_transformer(model, format="fp8", calibration_inputs=inputs)
    try:
        fallback = run(model, inputs[0])
        stats = qd.fused_path_stats(model)
        assert stats["fused"] == 0 and stats["decline_reasons"] == {"cpu_tensors": segments}
        qd.set_mode(model, "unfused")
        assert torch.equal(fallback, run(model, inputs[0]))
    finally:
        qd.restore_transformer(model)


@needs_diffusers
def test_fp8_model_keeps_its_format_when_moved():
    model, inputs, _ = qwen_image(False)
    qd.convert_transformer(model, format="fp8", linears="all", calibration_inputs=inputs, allow_cpu=True)
    try:
        before = run(model, inputs[0])
        model.to(torch.bfloat16)
        fc1 = model.transformer_blocks[0].img_mlp.net[0].proj
        assert fc1.weight.dtype == torch.float8_e4m3fn and fc1.input_scale.dtype == torch.float32
        assert torch.equal(run(model, inputs[0]), before)
    finally:
        qd.restore_transformer(model)

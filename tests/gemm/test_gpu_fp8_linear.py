"""FP8Linear and the FP8 conversion on a CUDA GPU (marked gpu; needs the compiled library).

- FP8Linear's GEMM is torch._scaled_mm called directly (the same bytes), tensor-wise and row-wise (per-channel
  weight scales), with and without bias, use_fast_accum on and off, at Qwen-Image's shapes; it is close to
  the float64 oracle of the dequantized GEMM; the BF16 and the pre-quantized input give the same bytes.
- torch.compile(fullgraph=True) and CUDA-graph capture/replay give the eager bytes.
- A real-width Qwen-Image transformer (2 blocks at width 3072, 4096 image tokens, with and without
  zero_cond_t) converted with format="fp8" (linears "all" and "modelopt"; two of the four pairs by default, all
  four in the exhaustive sweep): fused == unfused bit for bit,
  every segment fused, exactly one launch fewer per segment, restore exact; the error against BF16 printed.
"""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4 as q
import qwen_resnorm_fp4.integrations.diffusers as qd
from qwen_resnorm_fp4 import FP8Linear
from helpers.tiers import sweep
from helpers.reliability import capture_graph, count_named, rel_err
from helpers.diffusers_models import (QwenImageTransformer2DModel, calibration, fused_then_unfused,
                                      launches_by_mode, make_inputs, needs_diffusers, run, sha256)

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
#: (K, N) of Qwen-Image's block Linears: q/k/v/out, FC1, FC2.
SHAPES = ((3072, 3072), (3072, 12288), (12288, 3072))
ROWS = (1, 17, 256, 4096)


def make_layer(k: int, n: int, *, per_channel: bool, bias: bool, use_fast_accum: bool, seed: int = 0) -> FP8Linear:
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias, device="cuda").to(BF16)
    return FP8Linear.from_linear(lin, 6.0, per_channel=per_channel, use_fast_accum=use_fast_accum)


def direct_scaled_mm(layer: FP8Linear, a: torch.Tensor) -> torch.Tensor:
    """torch._scaled_mm as its documentation describes the call, written out here independently."""
    m = a.shape[0]
    if layer.per_channel:
        scale_a = torch.full((m, 1), float(layer.input_scale), dtype=torch.float32, device="cuda")
        scale_b = layer.weight_scale.reshape(1, -1).contiguous()
        if layer.bias is not None:  # row-wise: the documented bf16 output, then the bias added to it
            return torch._scaled_mm(a, layer.weight.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=BF16,
                                    use_fast_accum=layer.use_fast_accum) + layer.bias
    else:
        scale_a, scale_b = layer.input_scale.reshape(()), layer.weight_scale.reshape(())
    return torch._scaled_mm(a, layer.weight.t(), scale_a=scale_a, scale_b=scale_b, bias=layer.bias,
                            out_dtype=BF16, use_fast_accum=layer.use_fast_accum)


def oracle(layer: FP8Linear, a: torch.Tensor) -> torch.Tensor:
    out = (a.double() @ layer.weight.double().t()) * layer.input_scale.double() * layer.weight_scale.double()
    return out if layer.bias is None else out + layer.bias.double()


@pytest.mark.parametrize("use_fast_accum", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gemm_is_scaled_mm_and_close_to_the_dequantized_gemm(shape, per_channel, bias, use_fast_accum):
    k, n = shape
    layer = make_layer(k, n, per_channel=per_channel, bias=bias, use_fast_accum=use_fast_accum)
    for m in ROWS:
        x = torch.randn(m, k, device="cuda").to(BF16)
        a = q.fp8_quantize(x, layer.input_scale)
        out = layer(a)
        assert out.shape == (m, n) and out.dtype == BF16
        assert torch.equal(out, direct_scaled_mm(layer, a)), (m, shape)
        assert torch.equal(layer(x), out)  # the BF16 form quantizes with the same scale: the same bytes
        exact = oracle(layer, a)
        err = (out.double() - exact).norm() / exact.norm()
        assert err < 4e-3, (m, float(err))  # bf16 output rounding (~1e-3) plus the accumulation's


def test_leading_dimensions_and_empty_input():
    layer = make_layer(3072, 3072, per_channel=False, bias=True, use_fast_accum=True)
    x = torch.randn(2, 77, 3072, device="cuda").to(BF16)
    out = layer(x)
    assert out.shape == (2, 77, 3072)
    assert torch.equal(out.reshape(-1, 3072), layer(x.reshape(-1, 3072)))


@pytest.mark.parametrize("per_channel", [False, True])
def test_compile_fullgraph_and_cuda_graph(per_channel):
    layer = make_layer(3072, 12288, per_channel=per_channel, bias=True, use_fast_accum=True)
    x = torch.randn(2, 300, 3072, device="cuda").to(BF16)
    eager = layer(x)
    xq = q.fp8_quantize(x, layer.input_scale)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    assert torch.equal(compiled(x), eager)
    assert torch.equal(compiled(xq), eager)

    static = x.clone()
    graph, captured = capture_graph(layer, static)
    static.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, layer(static))


def test_modelopt_export_on_cuda_is_not_requantized():
    layer = make_layer(3072, 3072, per_channel=False, bias=True, use_fast_accum=True)
    sd = {"w.weight": layer.weight.clone(), "w.weight_scale": layer.weight_scale.reshape(()).clone(),
          "w.input_scale": layer.input_scale.reshape(()).clone(), "w.bias": layer.bias.clone()}
    loaded = FP8Linear.from_modelopt_state_dict(sd, "w.")
    assert loaded.weight.device.type == "cuda"
    assert torch.equal(loaded.weight.view(torch.uint8), layer.weight.view(torch.uint8))
    x = torch.randn(64, 3072, device="cuda").to(BF16)
    assert torch.equal(loaded(x), layer(x))


# ------------------------------------------------------------------------------------------------------------
# The converted real-width Qwen-Image
# ------------------------------------------------------------------------------------------------------------

GPU_LAYERS = 2


# Each case builds, converts and runs a real-width model: by default two that take each value of both
# parameters; the other two in the exhaustive sweep.
@needs_diffusers
@sweep("zero_cond_t,linears", [(False, "all"), (True, "all"), (False, "modelopt"), (True, "modelopt")],
       [(False, "all"), (True, "modelopt")],
       ids=lambda v: ("zero_cond_t" if v else "plain") if isinstance(v, bool) else v)
def test_real_width_qwen_image_fp8_fused_equals_unfused(zero_cond_t, linears, capsys):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=GPU_LAYERS, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56), zero_cond_t=zero_cond_t)
    model = model.to(BF16).eval()
    ffn = 2 * GPU_LAYERS  # the norm2 + FFN segments; per stream also norm1 -> q/k/v, and GELU -> FC2 with "all"
    attn, gelu = ffn, (ffn if linears == "all" else 0)
    segments = ffn + attn + gelu
    inputs = [make_inputs(b, t, zero_cond_t, small=False, seed=10 * b + t, device="cuda") for b, t in ((1, 17),
                                                                                                        (2, 77))]
    originals = [run(model, inp) for inp in inputs]
    qd.convert_transformer(model, format="fp8", linears=linears, mode="fused",
                           calibration_inputs=calibration(zero_cond_t, small=False, device="cuda"))
    lines = []
    try:
        assert all(isinstance(model.get_submodule(n), FP8Linear) for n in qd.conversion_info(model).input_amax)
        assert qd.conversion_info(model).segments_per_forward == segments
        for inp, original in zip(inputs, originals):
            fused = fused_then_unfused(model, inp, segments, unfused_runs=2)
            err = rel_err(fused, original)
            assert err < 0.1, err
            lines.append(f"zero_cond_t={zero_cond_t} linears={linears} batch={inp['hidden_states'].shape[0]}: "
                         f"rel. error vs BF16 {err:.4f}, sha256 {sha256(fused)[:16]} (fused and unfused)")
        fused_k, unfused_k = launches_by_mode(model, inputs[-1])
        fused_n, unfused_n = ({k: count_named(names, k) for k in ("resnorm_fp8_kernel", "resnorm_kernel", "layer_norm",
                                                                  "norm_modulate_fp8_kernel", "GeluCUDAKernelImpl")}
                              for names in (fused_k, unfused_k))
        assert (fused_n["resnorm_fp8_kernel"], fused_n["resnorm_kernel"], fused_n["norm_modulate_fp8_kernel"]) == (
            ffn, 0, attn), fused_k
        assert fused_n["layer_norm"] == unfused_n["layer_norm"]  # norm_out's: every block norm is ours
        assert (fused_n["GeluCUDAKernelImpl"], unfused_n["GeluCUDAKernelImpl"]) == (ffn - gelu, ffn)
        assert (unfused_n["resnorm_fp8_kernel"], unfused_n["norm_modulate_fp8_kernel"],
                unfused_n["resnorm_kernel"]) == (0, 0, ffn + attn), unfused_k
        # unfused: FFN resnorm + fp8_quantize; norm1 two zero fills + resnorm + fp8_quantize; GELU + fp8_quantize
        assert len(unfused_k) - len(fused_k) == ffn + 3 * attn + gelu, (len(unfused_k), len(fused_k))
        lines.append(f"zero_cond_t={zero_cond_t} linears={linears}: launches per forward fused {len(fused_k)}, "
                     f"unfused {len(unfused_k)} ({segments} segments)")
    finally:
        qd.restore_transformer(model)
    for inp, original in zip(inputs, originals):
        assert torch.equal(run(model, inp), original)
    with capsys.disabled():
        print()
        for line in lines:
            print("  " + line)

"""Small diffusers transformers and their inputs, shared by the integration tests (tests/integrations/:
test_diffusers_integration, test_diffusers_models, test_diffusers_fp8, test_diffusers_options,
test_compile_models, test_offload, test_context_parallel) and
tests/gemm/test_gpu_fp8_linear.py.

- ``SKIP_REASON`` (None when diffusers imports at a supported version), ``needs_diffusers`` (the skipif mark),
  ``QwenImageTransformer2DModel`` (None without diffusers).
- Qwen-Image: ``SMALL`` / ``SMALL_LAYERS`` (the small model's configuration), ``build_small(zero_cond_t)``,
  ``make_inputs(batch, text_len, zero_cond_t, small=..., seed=...)`` (the model's forward arguments; not
  helpers.inputs.make_inputs, the ops' arguments), ``calibration(zero_cond_t)``, ``image_shapes``.
- Other families, each returning (model, [input dict], converted segments per forward): ``qwen21`` (Qwen-Image
  2.1), ``flux`` (FLUX.1), ``wan`` (Wan 2.1 / 2.2 TI2V), ``qwen_image``; ``SMALL_CASES``: the small CPU cases
  by name.
- ``real_width_qwen_image(fmt, zero_cond_t)``: a real-width (24 heads x 128) one-block Qwen-Image on the GPU,
  converted (``linears="all"``), and two inputs (77 text tokens).
- ``format_model_sweep()``: the parametrization of a test over format x (plain, zero_cond_t) Qwen-Image, by
  default FP8 on the plain model and NVFP4 on zero_cond_t (each format and each modulation form once).
- ``run(model, inp)``: one forward without grad; ``fused_then_unfused(model, inp, segments)``: the same input
  fused, then unfused, every segment counted, the bytes equal; ``sha256(tensor)``; ``launches_by_mode(model,
  inp)``: the CUDA kernels one forward launches fused and unfused (helpers.reliability.kernel_names).
"""

from __future__ import annotations

import hashlib
import importlib.util
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch

import qwen_resnorm_fp4.integrations.diffusers as qd
from helpers.reliability import kernel_names
from helpers.tiers import sweep


def _import() -> Tuple[Any, Optional[str]]:
    if importlib.util.find_spec("diffusers") is None:
        return None, "diffusers is not installed (pip install 'qwen-resnorm-fp4[diffusers]')"
    try:
        from diffusers import QwenImageTransformer2DModel
        import diffusers.utils.logging as dlog

        dlog.set_verbosity_error()  # "modules that should be kept in float32: []" on .to(bfloat16)
    except Exception as e:  # noqa: BLE001 - any import failure: skip with the reason
        return None, f"diffusers does not import: {type(e).__name__}: {e}"
    try:
        qd.check_diffusers_version()
    except ValueError as e:
        return None, str(e)
    return QwenImageTransformer2DModel, None


QwenImageTransformer2DModel, SKIP_REASON = _import()
needs_diffusers = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


def sha256(t: torch.Tensor) -> str:
    """SHA-256 of the tensor's bytes."""
    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


# ------------------------------------------------------------------------------------------------------------
# Qwen-Image: models and inputs
# ------------------------------------------------------------------------------------------------------------

SMALL = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=32,
             num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(8, 12, 12))
SMALL_LAYERS = SMALL["num_layers"]


def image_shapes(zero_cond_t: bool, small: bool) -> List[Tuple[int, int, int]]:
    """One sample's img_shapes: the target latent, plus a condition image with zero_cond_t (its tokens get
    modulate_index 1)."""
    if small:
        return [(1, 4, 4), (1, 4, 2)] if zero_cond_t else [(1, 6, 4)]  # 24 image tokens
    return [(1, 64, 32), (1, 64, 32)] if zero_cond_t else [(1, 64, 64)]  # 4096 image tokens


def make_inputs(batch: int, text_len: int, zero_cond_t: bool, *, small: bool, seed: int,
                device: str = "cpu") -> Dict[str, Any]:
    cfg_in = SMALL["in_channels"] if small else 64
    cfg_txt = SMALL["joint_attention_dim"] if small else 3584
    g = torch.Generator().manual_seed(seed)
    shapes = image_shapes(zero_cond_t, small)
    s = sum(f * h * w for f, h, w in shapes)
    mask = torch.ones(batch, text_len, dtype=torch.bool)
    if batch > 1:
        mask[1, text_len - 3:] = False  # the negative prompt is shorter: padding tokens
    return dict(
        hidden_states=torch.randn(batch, s, cfg_in, generator=g).to(torch.bfloat16).to(device),
        encoder_hidden_states=torch.randn(batch, text_len, cfg_txt, generator=g).to(torch.bfloat16).to(device),
        encoder_hidden_states_mask=mask.to(device),
        timestep=torch.rand(batch, generator=g).to(device),
        img_shapes=[shapes] * batch,
        return_dict=False,
    )


def build_small(zero_cond_t: bool, seed: int = 0):
    torch.manual_seed(seed)
    return QwenImageTransformer2DModel(**SMALL, zero_cond_t=zero_cond_t).to(torch.bfloat16).eval()


def real_width_qwen_image(fmt: str, zero_cond_t: bool):
    """A real-width Qwen-Image (24 heads x 128) of one block on the GPU, converted (linears="all")."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=1, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56), zero_cond_t=zero_cond_t)
    model = model.to(torch.bfloat16).eval()
    inputs = [make_inputs(1, 77, zero_cond_t, small=False, seed=s, device="cuda") for s in (1, 2)]
    qd.convert_transformer(model, format=fmt, linears="all", calibration_inputs=inputs[:1])
    return model, inputs


def format_model_sweep():
    """``sweep("fmt,zero_cond_t", ...)`` over both formats x the plain and zero_cond_t Qwen-Image; by default
    ("fp8", plain) and ("nvfp4", zero_cond_t). Ids: "<plain|zero_cond_t>-<fmt>"."""
    cases = [(fmt, zct) for zct in (False, True) for fmt in ("fp8", "nvfp4")]
    return sweep("fmt,zero_cond_t", cases, [("fp8", False), ("nvfp4", True)],
                 ids=[f"{'zero_cond_t' if zct else 'plain'}-{fmt}" for fmt, zct in cases])


def run(model, inp) -> torch.Tensor:
    """One forward without grad; the output tensor."""
    with torch.no_grad():
        return model(**inp)[0]


def fused_then_unfused(model, inp, segments: int, *, unfused_runs: int = 1) -> torch.Tensor:
    """One input through a converted model fused, then unfused (``unfused_runs`` times, each the same bytes):
    every segment counted in its mode, fused == unfused bit for bit, finite. Returns the fused output."""
    qd.set_mode(model, "fused")
    fused = run(model, inp)
    stats = qd.fused_path_stats(model, reset=True)
    assert stats == {"fused": segments, "unfused": 0, "fallback": 0, "decline_reasons": {},
                     "compiled": {}}, stats
    qd.set_mode(model, "unfused")
    unfused = run(model, inp)
    for _ in range(unfused_runs - 1):
        assert torch.equal(unfused, run(model, inp)), "run-to-run nondeterminism (unfused twice)"
    assert qd.fused_path_stats(model, reset=True)["unfused"] == unfused_runs * segments
    assert torch.equal(fused, unfused) and sha256(fused) == sha256(unfused)
    assert torch.isfinite(fused.float()).all()
    return fused


def calibration(zero_cond_t: bool, small: bool = True, device: str = "cpu") -> List[Dict[str, Any]]:
    """The calibration inputs of a conversion: one batch-2 input (text length 11, seed 100)."""
    return [make_inputs(2, 11, zero_cond_t, small=small, seed=100, device=device)]


def launches_by_mode(model, inp) -> Tuple[List[str], List[str]]:
    """(fused, unfused): the CUDA kernels one forward of ``inp`` launches in each mode (:func:`kernel_names`);
    the model is left unfused."""
    launches = []
    for mode in ("fused", "unfused"):
        qd.set_mode(model, mode)
        launches.append(kernel_names(lambda: run(model, inp)))
    return launches[0], launches[1]


def _classes():
    """The diffusers module (None without it)."""
    if SKIP_REASON is not None:
        return None
    import diffusers

    return diffusers


# ------------------------------------------------------------------------------------------------------------
# Other model families: (builder, list of input dicts, segments per forward)
# ------------------------------------------------------------------------------------------------------------


def qwen21(width_heads: int, head_dim: int, layers: int, causal_condition: bool, *, device: str = "cpu",
           batch: int = 2, target_hw: Tuple[int, int] = (4, 4), seed: int = 0):
    """Qwen-Image 2.1 and one input: 6 text slots with a condition image (2 slots = 8 tokens) inside, then the
    target image (target_hw tokens, 4 per slot)."""
    torch.manual_seed(seed)
    ctx = 32 if head_dim == 32 else 3584
    with torch.device(device):
        model = _classes().QwenImage21Transformer2DModel(
            patch_size=1, in_channels=16, out_channels=16, num_layers=layers, attention_head_dim=head_dim,
            num_attention_heads=width_heads, context_in_dim=ctx, axes_dims_rope=(8, 12, 12) if head_dim == 32 else
            (16, 56, 56), causal_condition=causal_condition)
    model = model.to(torch.bfloat16).eval()
    g = torch.Generator().manual_seed(seed + 1)
    text, target = 6, target_hw[0] * target_hw[1]
    img_mask = torch.zeros(batch, text + target // 4, dtype=torch.bool)
    img_mask[:, 2:4] = True
    img_mask[:, text:] = True
    inp = dict(hidden_states=torch.randn(batch, 8 + target, 16, generator=g).to(torch.bfloat16).to(device),
               encoder_hidden_states=torch.randn(batch, text, ctx, generator=g).to(torch.bfloat16).to(device),
               timestep=torch.rand(batch, generator=g).to(device), img_shapes=[[(1, 2, 4), (1, *target_hw)]] * batch,
               img_mask=img_mask.to(device), return_dict=False)
    return model, [inp], layers


def flux(heads: int, head_dim: int, layers: int, *, device: str = "cpu", batch: int = 2, tokens: int = 16,
         text: int = 7, seed: int = 0):
    torch.manual_seed(seed)
    ctx, pooled = (32, 16) if head_dim == 32 else (4096, 768)
    with torch.device(device):
        model = _classes().FluxTransformer2DModel(
            patch_size=1, in_channels=16, out_channels=16, num_layers=layers, num_single_layers=1,
            attention_head_dim=head_dim, num_attention_heads=heads, joint_attention_dim=ctx,
            pooled_projection_dim=pooled, guidance_embeds=False,
            axes_dims_rope=(8, 12, 12) if head_dim == 32 else (16, 56, 56))
    model = model.to(torch.bfloat16).eval()
    g = torch.Generator().manual_seed(seed + 1)
    inp = dict(hidden_states=torch.randn(batch, tokens, 16, generator=g).to(torch.bfloat16).to(device),
               encoder_hidden_states=torch.randn(batch, text, ctx, generator=g).to(torch.bfloat16).to(device),
               pooled_projections=torch.randn(batch, pooled, generator=g).to(torch.bfloat16).to(device),
               timestep=torch.rand(batch, generator=g).to(device), img_ids=torch.zeros(tokens, 3, device=device),
               txt_ids=torch.zeros(text, 3, device=device), return_dict=False)
    return model, [inp], 2 * layers


def wan(heads: int, head_dim: int, ffn_dim: int, layers: int, per_token: bool, *, device: str = "cpu",
        batch: int = 2, frames: int = 2, hw: int = 8, seed: int = 0):
    """Wan and one input: latents [B, 4, frames, hw, hw] (patch 1x2x2); ``per_token``: a timestep per token
    (Wan 2.2 TI2V), else one per sample."""
    torch.manual_seed(seed)
    text_dim = 32 if head_dim == 32 else 4096
    with torch.device(device):
        model = _classes().WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim, in_channels=4,
            out_channels=4, text_dim=text_dim, freq_dim=32 if head_dim == 32 else 256, ffn_dim=ffn_dim,
            num_layers=layers, rope_max_seq_len=32 if head_dim == 32 else 1024)
    model = model.to(torch.bfloat16).eval()
    g = torch.Generator().manual_seed(seed + 1)
    tokens = frames * (hw // 2) ** 2
    timestep = torch.rand(batch, tokens, generator=g) * 1000 if per_token else torch.rand(batch, generator=g) * 1000
    inp = dict(hidden_states=torch.randn(batch, 4, frames, hw, hw, generator=g).to(torch.bfloat16).to(device),
               encoder_hidden_states=torch.randn(batch, 7, text_dim, generator=g).to(torch.bfloat16).to(device),
               timestep=timestep.to(device), return_dict=False)
    return model, [inp], layers


def qwen_image(zero_cond_t: bool):
    return build_small(zero_cond_t), [make_inputs(2, 7, zero_cond_t, small=True, seed=5)], 2 * 2


SMALL_CASES: Dict[str, Callable] = {
    "qwen_image21_masked": lambda: qwen21(2, 32, 2, True),
    "qwen_image21_unmasked": lambda: qwen21(2, 32, 1, False),
    "flux": lambda: flux(2, 32, 1),
    "wan21": lambda: wan(2, 32, 128, 2, False),
    "qwen_image_zero_cond_t": lambda: qwen_image(True),
}

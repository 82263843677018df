"""diffusers' Qwen-Image 2.1, FLUX.1 and Wan transformers (and Qwen-Image with linears="all") converted to NVFP4
+ the fused path: fused and unfused outputs byte-identical, every segment counted, restore exact.

CPU tests (skipped when diffusers is not importable): small models (width 64, 1-2 blocks, random bf16 weights),
batch 2, ``linears="fc1"`` and ``"all"``; Qwen-Image 2.1 with target_token_mask (causal_condition, a condition
image) and without; Wan 2.1 modulation ([B, 1, D]) and Wan 2.2 TI2V per-token modulation (timestep [B, S]:
[B, S, D] chunk views of one [B, S, 6, D] tensor), both fused; and the offline example of each model page
(docs/diffusers.md, qwen_image21.md, flux.md, wan.md) runs as written.

GPU tests (marked gpu; need CUDA and the compiled library): the real widths (Qwen-Image 2.1 4096, FLUX.1 3072,
Wan 1536 and 5120, Wan 2.2 TI2V's per-token modulation at 3072), 1-2 blocks, a few hundred tokens: fused == unfused
bytes, exactly one kernel launch fewer per converted segment, and the relative error against the BF16 model printed.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List

import pytest
import torch

import qwen_resnorm_fp4.integrations.diffusers as qd
from qwen_resnorm_fp4 import NVFP4Linear
from helpers.diffusers_models import (SMALL_CASES, flux, fused_then_unfused, launches_by_mode,
                                      needs_diffusers, qwen21, run, sha256, wan)
from helpers.paths import REPO_ROOT
from helpers.reliability import count_named, rel_err


def check_fused_equals_unfused(model, inputs: List[Dict[str, Any]], segments: int, *, linears: str,
                               allow_cpu: bool, device: str) -> List[str]:
    """Originals, calibrated conversion, fused == unfused (bytes) with every segment counted, on CUDA one launch
    fewer per segment, restore gives the originals back. Returns report lines."""
    originals = [run(model, inp) for inp in inputs]
    qd.convert_transformer(model, mode="fused", linears=linears, calibration_inputs=inputs, allow_cpu=allow_cpu)
    lines = []
    try:
        info = qd.conversion_info(model)
        assert info.linears == linears and info.model_type == type(model).__name__
        assert set(info.input_amax) == set(qd.linear_names(model, linears))
        for name in info.input_amax:
            assert isinstance(model.get_submodule(name), NVFP4Linear), name
        if linears == "all":
            assert len(info.input_amax) > len(qd.linear_names(model))
        for inp, original in zip(inputs, originals):
            fused = fused_then_unfused(model, inp, segments)
            err = rel_err(fused, original)
            assert 0 < err < 0.5, err
            lines.append(f"{type(model).__name__} linears={linears}: rel. error vs BF16 {err:.4f}, "
                         f"sha256 {sha256(fused)[:16]} (fused and unfused)")
        if device == "cuda":
            fused_k, unfused_k = launches_by_mode(model, inputs[-1])
            assert count_named(fused_k, "resnorm_quant") == segments, fused_k
            assert count_named(unfused_k, "resnorm_kernel") == segments, unfused_k
            assert len(unfused_k) - len(fused_k) == segments, (len(unfused_k), len(fused_k))
            lines.append(f"{type(model).__name__}: launches per forward fused {len(fused_k)}, unfused "
                         f"{len(unfused_k)} ({segments} segments)")
    finally:
        qd.restore_transformer(model)
    for inp, original in zip(inputs, originals):
        assert torch.equal(run(model, inp), original)
    return lines


# ------------------------------------------------------------------------------------------------------------
# CPU
# ------------------------------------------------------------------------------------------------------------


@needs_diffusers
@pytest.mark.parametrize("linears", ["fc1", "all"])
@pytest.mark.parametrize("case", list(SMALL_CASES))
def test_small_model_fused_equals_unfused_cpu(case, linears):
    model, inputs, segments = SMALL_CASES[case]()
    check_fused_equals_unfused(model, inputs, segments, linears=linears, allow_cpu=True, device="cpu")


@needs_diffusers
def test_wan_per_token_modulation_fused_cpu():
    """Wan 2.2 TI2V (a timestep per token): per-token modulation, served by the fused path."""
    model, inputs, segments = wan(2, 32, 128, 1, True)
    check_fused_equals_unfused(model, inputs, segments, linears="fc1", allow_cpu=True, device="cpu")


@needs_diffusers
def test_qwen_image21_swiglu_inputs_share_one_scale():
    model, inputs, _ = qwen21(2, 32, 1, True)
    names = qd.linear_names(model)
    assert names == ["transformer_blocks.0.img_mlp.proj", "transformer_blocks.0.img_mlp.gate_layer"]
    amax = qd.calibrate_input_amax(model, inputs)
    assert amax[names[0]] == amax[names[1]] > 0  # one input: the modulated activation
    with pytest.raises(ValueError, match="one input amax"):
        qd.convert_qwen_image21_transformer(model, input_amax={names[0]: 1.0, names[1]: 2.0})
    assert qd.conversion_info(model) is None
    qd.convert_qwen_image21_transformer(model, input_amax=amax, allow_cpu=True)
    try:
        proj, gate_layer = (model.get_submodule(n) for n in names)
        assert torch.equal(proj.input_global_scale, gate_layer.input_global_scale)
    finally:
        qd.restore_transformer(model)


@needs_diffusers
def test_model_specific_converters_refuse_other_models():
    model, _, _ = flux(2, 32, 1)
    for convert in (qd.convert_qwen_image_transformer, qd.convert_qwen_image21_transformer,
                    qd.convert_wan_transformer):
        with pytest.raises(TypeError, match="model must be a diffusers"):
            convert(model, input_amax=1.0)
    with pytest.raises(TypeError, match="FluxTransformer2DModel"):
        qd.convert_transformer(torch.nn.Linear(64, 64), input_amax=1.0)
    with pytest.raises(ValueError, match="linears"):
        qd.convert_flux_transformer(model, input_amax=1.0, linears="attention")
    assert qd.conversion_info(model) is None
    # linears="all" reaches the single-stream blocks too (their forward stays diffusers' own)
    names = qd.linear_names(model, "all")
    assert any(n.startswith("single_transformer_blocks.0.") for n in names)
    assert "transformer_blocks.0.attn.to_q" in names and "transformer_blocks.0.ff.net.2" in names


DOCS = REPO_ROOT / "docs"


@needs_diffusers
@pytest.mark.parametrize("page", ["diffusers.md", "qwen_image21.md", "flux.md", "wan.md"])
def test_doc_example_runs_as_written(page, capsys):
    """Each model page's offline example (its first python block after "## Example") runs as written."""
    if not DOCS.is_dir():
        pytest.skip("docs/ not in this copy of the tests")
    text = (DOCS / page).read_text()
    example = text[text.index("## Example"):]
    code = re.search(r"```python\n(.*?)```", example, re.S).group(1)
    exec(compile(code, f"docs/{page} (example)", "exec"), {"__name__": "doc_example"})


# ------------------------------------------------------------------------------------------------------------
# GPU: the real widths
# ------------------------------------------------------------------------------------------------------------

GPU_CASES: Dict[str, Callable] = {
    "qwen_image21_4096": lambda: qwen21(32, 128, 2, True, device="cuda", target_hw=(16, 16)),
    "flux_3072": lambda: flux(24, 128, 2, device="cuda", tokens=256, text=77),
    "wan_1536": lambda: wan(12, 128, 8960, 2, False, device="cuda", frames=2, hw=16),
    "wan_5120": lambda: wan(40, 128, 13824, 1, False, device="cuda", frames=2, hw=16),
    "wan_ti2v_3072": lambda: wan(24, 128, 14336, 1, True, device="cuda", frames=2, hw=16),
}


@pytest.mark.gpu
@needs_diffusers
@pytest.mark.parametrize("linears", ["fc1", "all"])
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_real_width_fused_equals_unfused(case, linears, capsys):
    model, inputs, segments = GPU_CASES[case]()
    lines = check_fused_equals_unfused(model, inputs, segments, linears=linears, allow_cpu=False, device="cuda")
    with capsys.disabled():
        print()
        for line in lines:
            print(f"  {case}: {line}")

"""diffusers' Qwen-Image transformer converted to NVFP4 FC1 + the fused path: byte-identical end to end.

CPU tests (skipped when diffusers is not importable): a small QwenImageTransformer2DModel (2 blocks, width 64)
with random bf16 weights; batch 1 and 2 (classifier-free guidance), with and without zero_cond_t
(modulate_index), text lengths 7 and 13 (with a padding mask at batch 2). The converted model in "fused" mode
(allow_cpu: the reference implements the fused op on CPU) and in "unfused" mode give the same bytes, and
restore gives back the original outputs exactly.

GPU test (marked gpu; skipped without CUDA and the compiled library): the real width (24 heads x 128 = 3072),
2 blocks, 4096 image tokens, 17 and 77 text tokens, batch 1 and 2, with and without zero_cond_t: fused and
unfused outputs are byte-identical, the fused forward launches exactly 2 kernels fewer per block (one per
stream), and the relative error of both against the original BF16 model is printed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Dict, List

import pytest
import torch

import qwen_resnorm_fp4.integrations.diffusers as qd
from qwen_resnorm_fp4 import NVFP4Linear
from helpers.diffusers_models import (SKIP_REASON, SMALL_LAYERS, QwenImageTransformer2DModel, build_small, calibration,
                                      launches_by_mode, make_inputs, needs_diffusers, run, sha256)
from helpers.paths import PACKAGE_PARENT, package_env
from helpers.reliability import count_named, rel_err


@pytest.fixture(scope="module")
def small_models():
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    return {zc: build_small(zc) for zc in (False, True)}


# ------------------------------------------------------------------------------------------------------------
# CPU
# ------------------------------------------------------------------------------------------------------------


@needs_diffusers
@pytest.mark.parametrize("text_len", [7, 13])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("zero_cond_t", [False, True], ids=["plain", "zero_cond_t"])
def test_fused_equals_unfused_and_restore_cpu(small_models, zero_cond_t, batch, text_len):
    model = small_models[zero_cond_t]
    inp = make_inputs(batch, text_len, zero_cond_t, small=True, seed=batch * 100 + text_len)
    original = run(model, inp)
    original_fc1 = model.transformer_blocks[0].img_mlp.net[0].proj
    qd.convert_qwen_image_transformer(model, mode="fused", calibration_inputs=calibration(zero_cond_t),
                                      allow_cpu=True)
    try:
        assert isinstance(model.transformer_blocks[0].img_mlp.net[0].proj, NVFP4Linear)
        fused = run(model, inp)
        stats = qd.fused_path_stats(model, reset=True)
        assert stats == {"fused": 2 * SMALL_LAYERS, "unfused": 0, "fallback": 0, "decline_reasons": {},
                     "compiled": {}}, stats

        qd.set_mode(model, "unfused")
        unfused = run(model, inp)
        stats = qd.fused_path_stats(model, reset=True)
        assert stats["unfused"] == 2 * SMALL_LAYERS and stats["fused"] == 0, stats
    finally:
        qd.restore_transformer(model)

    assert fused.dtype == torch.bfloat16 and fused.shape == original.shape
    assert torch.equal(fused, unfused)
    assert sha256(fused) == sha256(unfused)
    assert torch.isfinite(fused.float()).all()
    # The NVFP4 FC1 (and the contract's norm numerics) change the output, but not by much.
    assert not torch.equal(fused, original)
    assert rel_err(fused, original) < 0.5

    assert model.transformer_blocks[0].img_mlp.net[0].proj is original_fc1
    assert "forward" not in vars(model.transformer_blocks[0])
    assert not hasattr(model, "_qwen_fp4_conversion")
    restored = run(model, inp)
    assert torch.equal(restored, original)
    assert sha256(restored) == sha256(original)


@needs_diffusers
@pytest.mark.parametrize("zero_cond_t", [False, True], ids=["plain", "zero_cond_t"])
def test_convert_unfused_equals_fused_fresh_conversions(small_models, zero_cond_t):
    """Two independent conversions (mode="unfused" and mode="fused") from the same amax give the same bytes."""
    model = small_models[zero_cond_t]
    inp = make_inputs(2, 13, zero_cond_t, small=True, seed=7)
    outs = {}
    amax = None
    for mode in ("unfused", "fused"):
        kw = dict(input_amax=amax) if amax is not None else dict(calibration_inputs=calibration(zero_cond_t))
        qd.convert_qwen_image_transformer(model, mode=mode, allow_cpu=True, **kw)
        try:
            amax = qd.conversion_info(model).input_amax
            assert qd.conversion_info(model).mode == mode
            outs[mode] = run(model, inp)
        finally:
            qd.restore_transformer(model)
    assert torch.equal(outs["fused"], outs["unfused"])


@needs_diffusers
def test_fused_declines_on_cpu_without_allow_cpu_and_falls_back(small_models):
    model = small_models[True]
    inp = make_inputs(2, 7, True, small=True, seed=3)
    qd.convert_qwen_image_transformer(model, mode="fused", calibration_inputs=calibration(True))
    try:
        fallback = run(model, inp)
        stats = qd.fused_path_stats(model, per_block=True)
        assert stats["fused"] == 0 and stats["fallback"] == 2 * SMALL_LAYERS
        assert stats["decline_reasons"] == {"cpu_tensors": 2 * SMALL_LAYERS}
        assert stats["blocks"]["transformer_blocks.0"]["img"].fallback == 1
        qd.set_mode(model, "unfused")
        unfused = run(model, inp)
    finally:
        qd.restore_transformer(model)
    assert torch.equal(fallback, unfused)


@needs_diffusers
def test_input_amax_forms(small_models):
    model = small_models[False]
    inp = make_inputs(1, 7, False, small=True, seed=4)
    names = qd.linear_names(model)
    assert names == [f"transformer_blocks.{i}.{s}_mlp.net.0.proj" for i in range(SMALL_LAYERS) for s in ("img", "txt")]

    # calibration == the amax of diffusers' own FC1 inputs
    amax = qd.calibrate_input_amax(model, calibration(False))
    seen: Dict[str, float] = {}
    mods = dict(model.named_modules())
    hooks = [mods[n].register_forward_pre_hook(
        lambda m, a, n=n: seen.__setitem__(n, max(seen.get(n, 0.0), a[0].abs().amax().float().item())))
        for n in names]
    try:
        run(model, calibration(False)[0])
    finally:
        for h in hooks:
            h.remove()
    assert amax == seen

    # a dict of amax values reproduces the calibrated conversion byte for byte; a callable calibrates too
    outs = []
    for kw in (dict(calibration_inputs=calibration(False)), dict(input_amax=amax),
               dict(calibration_inputs=lambda m: m(**calibration(False)[0]))):
        qd.convert_qwen_image_transformer(model, mode="fused", allow_cpu=True, **kw)
        try:
            assert qd.conversion_info(model).input_amax == amax
            outs.append(run(model, inp))
        finally:
            qd.restore_transformer(model)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])

    # one number for every FC1
    qd.convert_qwen_image_transformer(model, mode="fused", allow_cpu=True, input_amax=4.0)
    try:
        assert set(qd.conversion_info(model).input_amax.values()) == {4.0}
        gs = model.transformer_blocks[1].txt_mlp.net[0].proj.input_global_scale
        assert torch.equal(gs, torch.tensor([448.0 * 6.0 / 4.0]))
    finally:
        qd.restore_transformer(model)

    bad = [
        (dict(), ValueError, "calibration_inputs"),
        (dict(input_amax=1.0, calibration_inputs=calibration(False)), ValueError, "not both"),
        (dict(input_amax={names[0]: 1.0}), ValueError, "no value"),
        (dict(input_amax={**{n: 1.0 for n in names}, "x.proj": 1.0}), ValueError, "not FC1"),
        (dict(input_amax=0.0), ValueError, "positive"),
        (dict(input_amax=float("nan")), ValueError, "positive"),
        (dict(calibration_inputs=[]), ValueError, "empty"),
        (dict(calibration_inputs=[1]), TypeError, "dict"),
    ]
    for kw, exc, text in bad:
        with pytest.raises(exc, match=text):
            qd.convert_qwen_image_transformer(model, **kw)
        assert qd.conversion_info(model) is None  # nothing half-converted
        assert isinstance(model.transformer_blocks[0].img_mlp.net[0].proj, torch.nn.Linear)


@needs_diffusers
def test_version_check(small_models, monkeypatch):
    assert qd.check_diffusers_version("0.42.1") == "0.42.1"
    for v in ("0.41.0", "0.42.0", "0.43.0", "1.0.0", "garbage"):
        with pytest.raises(ValueError, match=r">=0\.42\.1,<0\.43"):
            qd.check_diffusers_version(v)
    with pytest.warns(RuntimeWarning, match="not supported"):
        qd.check_diffusers_version("0.43.0", allow_untested_version=True)

    model = small_models[False]
    monkeypatch.setattr(qd, "diffusers_version", lambda: "0.99.0")
    with pytest.raises(ValueError, match="allow_untested_version"):
        qd.convert_qwen_image_transformer(model, input_amax=1.0)
    with pytest.warns(RuntimeWarning):
        qd.convert_qwen_image_transformer(model, input_amax=1.0, allow_untested_version=True)
    assert qd.conversion_info(model).diffusers_version == "0.99.0"
    qd.restore_transformer(model)


@needs_diffusers
def test_conversion_errors(small_models):
    model = small_models[False]
    with pytest.raises(TypeError, match="QwenImageTransformer2DModel"):
        qd.convert_qwen_image_transformer(torch.nn.Linear(64, 64), input_amax=1.0)
    with pytest.raises(ValueError, match="mode"):
        qd.convert_qwen_image_transformer(model, mode="fast", input_amax=1.0)
    with pytest.raises(ValueError, match="not converted"):
        qd.restore_transformer(model)
    with pytest.raises(ValueError, match="not converted"):
        qd.set_mode(model, "fused")

    qd.convert_qwen_image_transformer(model, input_amax=1.0)
    try:
        with pytest.raises(ValueError, match="already converted"):
            qd.convert_qwen_image_transformer(model, input_amax=1.0)
        with pytest.raises(ValueError, match="mode"):
            qd.set_mode(model, "other")
    finally:
        qd.restore_transformer(model)

    # keep_original=False frees the BF16 FC1s: restore refuses (on a copy, so the shared model survives)
    other = build_small(False)
    qd.convert_qwen_image_transformer(other, input_amax=1.0, keep_original=False)
    with pytest.raises(ValueError, match="keep_original=False"):
        qd.restore_transformer(other)

    # a block whose forward is already overridden (a hook) is refused, and nothing is converted
    block = model.transformer_blocks[1]
    block.forward = block.forward
    try:
        with pytest.raises(ValueError, match="own forward"):
            qd.convert_qwen_image_transformer(model, input_amax=1.0)
        assert qd.conversion_info(model) is None
        assert isinstance(model.transformer_blocks[0].img_mlp.net[0].proj, torch.nn.Linear)
        assert "forward" not in vars(model.transformer_blocks[0])
    finally:
        del block.forward

    # fp32 activations: a clear error (the converted path is bf16)
    fp32 = build_small(False).float()
    qd.convert_qwen_image_transformer(fp32, input_amax=1.0)
    inp = make_inputs(1, 7, False, small=True, seed=0)
    inp["hidden_states"] = inp["hidden_states"].float()
    inp["encoder_hidden_states"] = inp["encoder_hidden_states"].float()
    with pytest.raises(TypeError, match="bfloat16"):
        run(fp32, inp)


@needs_diffusers
def test_gemm_backend_typo_refused_before_calibration(small_models):
    """A misspelt gemm_backend is a ValueError naming the argument before the calibration pass runs."""
    model = small_models[False]
    calls = []
    with pytest.raises(ValueError, match="gemm_backend"):
        qd.convert_qwen_image_transformer(model, calibration_inputs=lambda m: calls.append(m(**calibration(False)[0])),
                                          gemm_backend="tensorcore")
    assert calls == []  # the model never ran
    with pytest.raises(TypeError, match="gemm_backend"):
        qd.convert_qwen_image_transformer(model, input_amax=1.0, gemm_backend=None)
    assert qd.conversion_info(model) is None


def test_public_names_only():
    """The Qwen-Image names of earlier releases are gone; the public names stay."""
    for old in ("restore_qwen_image_transformer", "set_qwen_image_mode", "fc1_names", "calibrate_fc1_input_amax",
                "QwenImageConversion"):
        assert not hasattr(qd, old), old
    for name in ("convert_transformer", "set_mode", "restore_transformer", "fused_path_stats"):
        assert callable(getattr(qd, name)), name
    assert all(hasattr(qd, name) for name in qd.__all__)


@needs_diffusers
def test_import_does_not_patch_diffusers():
    """Importing the integration leaves diffusers' flashinfer flag as diffusers set it, and diffusers' models
    import next to the package with no call of ours (the build leaves no unimportable flashinfer behind)."""
    code = textwrap.dedent("""
        import diffusers.utils.import_utils as iu
        before = iu._flashinfer_available
        import qwen_resnorm_fp4.integrations.diffusers as qd
        assert iu._flashinfer_available == before, (before, iu._flashinfer_available)
        assert not hasattr(qd, "hide_unimportable_flashinfer")
        from diffusers import QwenImageTransformer2DModel  # noqa: F401
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE_PARENT, capture_output=True, text=True,
                         env=package_env())
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# ------------------------------------------------------------------------------------------------------------
# GPU: the real width
# ------------------------------------------------------------------------------------------------------------

GPU_LAYERS = 2


def end_to_end(model, layers: int, zero_cond_t: bool, *, small: bool, device: str, text_lens=(17, 77),
               allow_cpu: bool = False) -> List[str]:
    """Originals for batch 1 and 2 x text_lens, convert (calibrated), then for each: fused == unfused (bytes and
    SHA-256), the fused path ran in every stream; on CUDA the launch counts; restore. Returns report lines."""
    configs = [(b, t) for b in (1, 2) for t in text_lens]
    inputs = {c: make_inputs(c[0], c[1], zero_cond_t, small=small, seed=10 * c[0] + c[1], device=device)
              for c in configs}
    originals = {c: run(model, inputs[c]) for c in configs}

    qd.convert_qwen_image_transformer(model, mode="fused", allow_cpu=allow_cpu,
                                      calibration_inputs=calibration(zero_cond_t, small=small, device=device))
    lines = []
    try:
        for c in configs:
            qd.set_mode(model, "fused")
            fused = run(model, inputs[c])
            stats = qd.fused_path_stats(model, reset=True)
            assert stats["fused"] == 2 * layers and stats["fallback"] == 0, stats
            qd.set_mode(model, "unfused")
            unfused = run(model, inputs[c])
            if c == configs[-1]:  # control: the unfused model is deterministic run to run
                assert torch.equal(unfused, run(model, inputs[c])), "run-to-run nondeterminism (unfused twice)"
            assert torch.equal(fused, unfused), f"batch {c[0]}, text {c[1]}: fused != unfused"
            assert sha256(fused) == sha256(unfused)
            assert torch.isfinite(fused.float()).all()
            e_f, e_u = rel_err(fused, originals[c]), rel_err(unfused, originals[c])
            assert e_f < 0.5, e_f
            lines.append(f"zero_cond_t={zero_cond_t} batch={c[0]} text={c[1]}: rel. Frobenius error vs BF16 "
                         f"fused {e_f:.4f} unfused {e_u:.4f}, sha256 {sha256(fused)[:16]} (both)")

        if device == "cuda":
            # Launches: the fused forward has exactly one launch fewer per stream, i.e. 2 per block.
            fused_k, unfused_k = launches_by_mode(model, inputs[configs[-1]])
            assert count_named(fused_k, "resnorm_quant") == 2 * layers, fused_k
            assert count_named(fused_k, "nvfp4_quantize_kernel") == 0 and count_named(fused_k, "resnorm_kernel") == 0
            assert count_named(unfused_k, "resnorm_quant") == 0
            assert count_named(unfused_k, "resnorm_kernel") == 2 * layers, unfused_k
            assert count_named(unfused_k, "nvfp4_quantize_kernel") == 2 * layers, unfused_k
            assert len(unfused_k) - len(fused_k) == 2 * layers, (len(unfused_k), len(fused_k))
            lines.append(f"zero_cond_t={zero_cond_t}: kernel launches in one forward ({layers} blocks, batch "
                         f"{configs[-1][0]}, text {configs[-1][1]}): fused {len(fused_k)}, unfused {len(unfused_k)}")
    finally:
        qd.restore_transformer(model)
    for c in configs:
        assert torch.equal(run(model, inputs[c]), originals[c]), f"restore: batch {c[0]}, text {c[1]}"
    return lines


@needs_diffusers
@pytest.mark.parametrize("zero_cond_t", [False, True], ids=["plain", "zero_cond_t"])
def test_end_to_end_small_cpu(small_models, zero_cond_t):
    """The GPU test's procedure on the small model on CPU (allow_cpu), text lengths 7 and 13."""
    end_to_end(small_models[zero_cond_t], SMALL_LAYERS, zero_cond_t, small=True, device="cpu", text_lens=(7, 13),
               allow_cpu=True)


@pytest.mark.gpu
@needs_diffusers
@pytest.mark.parametrize("zero_cond_t", [False, True], ids=["plain", "zero_cond_t"])
def test_gpu_real_width_fused_equals_unfused(zero_cond_t, capsys):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=GPU_LAYERS, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56), zero_cond_t=zero_cond_t)
    model = model.to(torch.bfloat16).eval()
    lines = end_to_end(model, GPU_LAYERS, zero_cond_t, small=False, device="cuda")
    with capsys.disabled():
        print()
        for line in lines:
            print("  " + line)

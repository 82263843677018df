"""The 4over6 recipe on the CPU: the reference against the independent oracle (helpers.oracles.nvfp4_4over6_oracle)
for all eight configurations in both modes, the recipe's rules on hand-made blocks (ties, zero blocks, the
fast mode's zero-scale case), the code packing and its refusals, the wrappers' nvfp4_4over6= argument and
environment, and NVFP4Linear's global-scale rule."""

from __future__ import annotations

import itertools
import math
import types

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import recipe, reference
from qwen_resnorm_fp4.env import FOUR_OVER_SIX_VARS
from qwen_resnorm_fp4.recipe import NVFP44Over6Config, nvfp4_4over6_code, nvfp4_4over6_from_code
from qwen_resnorm_fp4.recipe import NVFP4_4OVER6_CODES
from qwen_resnorm_fp4.validation import nvfp4_4over6_code_problem

from helpers.inputs import make_inputs
from helpers.oracles import e4m3_byte_oracle, nvfp4_4over6_oracle

CONFIGS = [NVFP44Over6Config(e4m3_max=e, err_mode=m, err_use_fast_math=f)
           for e, m, f in itertools.product((448, 256), ("MAE", "MSE"), (False, True))]
CODES = [nvfp4_4over6_code(c) for c in CONFIGS]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for v in FOUR_OVER_SIX_VARS:
        monkeypatch.delenv(v, raising=False)


def hard_y(rows: int = 12, cols: int = 128, seed: int = 0) -> torch.Tensor:
    """bf16 [rows, cols]: blocks over many magnitudes, with zeros, -0, subnormals, inf, NaN, an all-zero
    block, an all-NaN block, a block of equal values and a half block of -0."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-12, 12, (rows, 1), generator=g).float())
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -3e-39, 3.0e38])
    mask = torch.rand(rows, cols, generator=g) < 0.04
    y = torch.where(mask, special[torch.randint(0, special.numel(), (rows, cols), generator=g)], y)
    y[0, :16] = 0.0
    y[0, 16:32] = math.nan
    y[0, 32:48] = 3.0
    y[1, :8] = -0.0
    return y.to(torch.bfloat16)


def quantize(y, G, fast, code):
    return reference.nvfp4_quantize(y, torch.tensor([G]), fast, nvfp4_4over6_code=code)


@pytest.mark.parametrize("config", CONFIGS, ids=repr)
@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
@pytest.mark.parametrize("G", (448 * 6 / 5.0, 1e-30, 3e30, -2.0))
def test_reference_matches_oracle(config, fast, G):
    y = hard_y()
    code = nvfp4_4over6_code(config)
    packed, scales = quantize(y, G, fast, code)
    p_o, s_o = nvfp4_4over6_oracle(y, G, fast, config.err_mode == "MSE", config.err_use_fast_math)
    assert torch.equal(scales, s_o)
    assert torch.equal(packed, p_o)


@pytest.mark.parametrize("err_mode", ("MAE", "MSE"))
def test_both_candidates_win_somewhere(err_mode):
    """On ordinary data some blocks take amax -> 4 and some amax -> 6 (else the tests above check little)."""
    y = torch.randn(64, 1024, generator=torch.Generator().manual_seed(1)).bfloat16()
    G = 448 * 6 / y.float().abs().max().item()
    _, standard = quantize(y, G, False, 0)
    _, four_six = quantize(y, G, False, nvfp4_4over6_code(NVFP44Over6Config(err_mode=err_mode)))
    changed = (standard != four_six).float().mean().item()
    assert 0.05 < changed < 0.95


@pytest.mark.parametrize("code", CODES)
@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
def test_recipe_rules_on_hand_made_blocks(code, fast):
    """Byte by byte from the recipe: a tie takes candidate 6; a zero block (of +0 and -0) is byte 0 and codes
    0; with G = 1: amax 6 -> scale 1 (candidate 6), amax 4 -> scale 1 (candidate 4 = 1.5 x 2/3)."""
    y = torch.zeros(1, 64)
    y[0, :16] = 6.0  # both candidates exact (codes 7 at scale 1, codes 6 at scale 1.5): a tie -> 6
    y[0, 16:24] = -0.0  # the rest of that block +0: all zero
    y[0, 32:48] = torch.tensor([6.0, 4.5] * 8)  # 6: exact with scale 1 (4.5 ties to 4): 4 also exact at 1.5
    y[0, 48:64] = torch.tensor([6.0, 5.0] * 8)
    packed, scales = quantize(y.bfloat16(), 1.0, fast, code)
    sf = scales.reshape(-1)[reference.sf_offsets(1, 64, torch.device("cpu")).reshape(-1)]
    codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(4, 16)
    assert sf[0] == 0x38 and (codes[0] == 7).all()  # 1.0 = 0x38, 6.0 = code 7
    assert sf[1] == 0 and (codes[1] == 0).all()
    # block 2: candidate 6 (scale 1) codes 7, 6 (4.5 ties to even 4), error 8 * 0.5; candidate 4
    # (scale 1.5) codes 6, 5 (4.5 / 1.5 = 3 exactly), error 0: candidate 4 wins.
    assert sf[2] == 0x3C and codes[2].tolist() == [6, 5] * 8
    # block 3: candidate 6 codes 7, 6 (5 ties between 4 and 6: the even code, 4.0), error 8 * 1; candidate 4
    # codes 6, 5 (5 / 1.5 = 3.33 -> 3), error 8 * 0.5 (MAE) or 8 * 0.25 (MSE): candidate 4 wins.
    assert sf[3] == 0x3C and codes[3].tolist() == [6, 5] * 8


@pytest.mark.parametrize("code", CODES)
def test_fast_mode_has_no_zero_scale_guard(code):
    """A non-zero block whose candidate scales both round to E4M3 zero: fast mode's encode scale is rcp(0) =
    inf, so 0 * inf = NaN gives code 7 for its zero elements and 7 / 0xF for the others; exact mode's is
    FLT_MAX, so zeros stay 0. The errors tie (both scales 0): byte 0."""
    G = 2.0 ** -100  # s6 = amax / 6 * G far below E4M3's smallest subnormal 2^-9; 1 / G still finite
    y = torch.zeros(1, 64)
    y[0, :16] = torch.tensor([1.0, -1.0, 0.0, 0.0] * 4)
    assert e4m3_byte_oracle(torch.tensor([1.0 / 6 * G * 1.5]))[0] == 0
    for fast, zero_code in ((True, 7), (False, 0)):
        packed, scales = quantize(y.bfloat16(), G, fast, code)
        codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(4, 16)
        assert codes[0].tolist() == [7, 0xF, zero_code, zero_code] * 4
        assert not scales.any()


def test_ops_and_fused_equal_reference_on_cpu():
    inp = make_inputs(2, 9, 128, "batch", seed=3)
    args = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"], inp["global_scale"])
    for config, fast in itertools.product(CONFIGS, (True, False)):
        code = nvfp4_4over6_code(config)
        packed, scales, r_out = q.resnorm_quant(*args, 1e-6, fast, nvfp4_4over6=config)
        y, r_ref = reference.resnorm(*args[:6], 1e-6)
        p_ref, s_ref = reference.nvfp4_quantize(y, inp["global_scale"], fast, nvfp4_4over6_code=code)
        assert torch.equal(packed, p_ref) and torch.equal(scales, s_ref) and torch.equal(r_out, r_ref)
        p_op, s_op = torch.ops.qwen_fp4.nvfp4_quantize(y, inp["global_scale"], fast, code)
        assert torch.equal(p_op, p_ref) and torch.equal(s_op, s_ref)


def test_opcheck_with_a_recipe():
    y = torch.randn(17, 128).bfloat16()
    g = torch.tensor([30.0])
    torch.library.opcheck(torch.ops.qwen_fp4.nvfp4_quantize.default, (y, g, True, 21))
    inp = make_inputs(1, 5, 64, seed=2)
    torch.library.opcheck(torch.ops.qwen_fp4.resnorm_quant.default,
                          (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"],
                           inp["global_scale"], 1e-6, False, None, None, None, 7))


# --------------------------------------------------------------------------------------------------
# The code
# --------------------------------------------------------------------------------------------------

def test_code_packing_round_trip():
    assert nvfp4_4over6_code(None) == 0 and nvfp4_4over6_from_code(0) is None
    assert nvfp4_4over6_code(NVFP44Over6Config()) == 1
    assert nvfp4_4over6_code(NVFP44Over6Config(256, "MSE", True)) == 1 | 2 | 4 | 16
    assert nvfp4_4over6_code(NVFP44Over6Config(448, "mse", False)) == 5
    assert sorted(CODES) == sorted(NVFP4_4OVER6_CODES - {0})
    for config, code in zip(CONFIGS, CODES):
        assert nvfp4_4over6_from_code(code) == config
    # FlashInfer's own config, by its attributes (an IntEnum err_mode)
    fi = types.SimpleNamespace(e4m3_max=256, err_mode=1, err_use_fast_math=False)
    assert nvfp4_4over6_code(fi) == 1 | 2 | 4


def _flashinfer_recipe_module():
    """FlashInfer's nvfp4_quantization_utils.py, loaded by its path (it needs only torch; the flashinfer
    package itself may not import without a GPU), or a skip without FlashInfer."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("flashinfer")
    if spec is None or spec.origin is None:
        pytest.skip("flashinfer is not installed")
    path = Path(spec.origin).parent / "quantization" / "nvfp4_quantization_utils.py"
    if not path.is_file():
        pytest.skip(f"no {path}")
    module_spec = importlib.util.spec_from_file_location("flashinfer_nvfp4_recipe", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_code_matches_flashinfer_packing():
    fi = _flashinfer_recipe_module()
    for e, m, f in itertools.product((448, 256), ("MAE", "MSE"), (False, True)):
        theirs = fi.NVFP44Over6Config(e4m3_max=e, err_mode=m, err_use_fast_math=f)
        assert nvfp4_4over6_code(theirs) == fi.nvfp4_4over6_code(theirs)
        assert nvfp4_4over6_from_code(fi.nvfp4_4over6_code(theirs)) == NVFP44Over6Config(e, m, f)


@pytest.mark.parametrize("code", (-1, 2, 4, 9, 13, 29, 32, 33, 1 << 40))
def test_refused_codes(code):
    assert nvfp4_4over6_code_problem(code).error is ValueError
    y = torch.randn(4, 64).bfloat16()
    with pytest.raises(ValueError, match="nvfp4_4over6_code"):
        torch.ops.qwen_fp4.nvfp4_quantize(y, torch.tensor([1.0]), True, code)
    with pytest.raises(ValueError, match="nvfp4_4over6_code"):
        nvfp4_4over6_from_code(code)


def test_refused_configs():
    assert nvfp4_4over6_code_problem(True).error is TypeError
    with pytest.raises(ValueError, match="e4m3_max"):
        NVFP44Over6Config(e4m3_max=512)
    with pytest.raises(ValueError, match="err_mode"):
        NVFP44Over6Config(err_mode="MEDIAN")
    with pytest.raises(ValueError, match="err_mode"):
        NVFP44Over6Config(err_mode=2)
    with pytest.raises(TypeError, match="err_use_fast_math"):
        NVFP44Over6Config(err_use_fast_math=1)
    y = torch.randn(4, 64).bfloat16()
    with pytest.raises(TypeError, match="nvfp4_4over6"):
        q.nvfp4_quantize(y, torch.tensor([1.0]), nvfp4_4over6="MSE")


# --------------------------------------------------------------------------------------------------
# The argument and the environment
# --------------------------------------------------------------------------------------------------

def test_omitted_argument_reads_the_environment(monkeypatch):
    y = torch.randn(8, 256, generator=torch.Generator().manual_seed(4)).bfloat16()
    g = torch.tensor([100.0])
    standard = q.nvfp4_quantize(y, g, True, nvfp4_4over6=None)
    assert all(torch.equal(a, b) for a, b in zip(q.nvfp4_quantize(y, g, True), standard))
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "1")
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "mse")
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1")
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6_E4M3_USE_256", "1")
    assert recipe.resolve_nvfp4_4over6() == 23
    from_env = q.nvfp4_quantize(y, g, True)
    explicit = q.nvfp4_quantize(y, g, True, nvfp4_4over6=NVFP44Over6Config(256, "MSE", True))
    assert all(torch.equal(a, b) for a, b in zip(from_env, explicit))
    assert not torch.equal(from_env[1], standard[1])
    # None switches it off whatever the environment says
    assert all(torch.equal(a, b) for a, b in zip(q.nvfp4_quantize(y, g, True, nvfp4_4over6=None), standard))
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "true")  # only "1" turns it on
    assert recipe.resolve_nvfp4_4over6() == 0
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "1")
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "")
    with pytest.raises(ValueError, match="err_mode"):
        q.nvfp4_quantize(y, g, True)


def test_linear_global_scale_follows_e4m3_max():
    lin = torch.nn.Linear(128, 32).bfloat16()
    amax = 5.0
    for config, numerator in ((None, 448 * 6), (NVFP44Over6Config(), 448 * 6),
                              (NVFP44Over6Config(e4m3_max=256, err_mode="MSE"), 256 * 6)):
        layer = q.NVFP4Linear.from_linear(lin, amax, nvfp4_4over6=config)
        assert layer.nvfp4_4over6 == config
        assert layer.nvfp4_4over6_code == nvfp4_4over6_code(config)
        assert layer.input_global_scale.item() == pytest.approx(numerator / amax, rel=1e-7)
        w_amax = lin.weight.float().abs().max().item()
        assert layer.weight_global_scale.item() == pytest.approx(numerator / w_amax, rel=1e-6)
        x = torch.randn(3, 128).bfloat16()
        ref = reference.nvfp4_quantize(x, layer.input_global_scale, True, nvfp4_4over6_code=layer.nvfp4_4over6_code)
        got = layer.quantize_input(x)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])

"""round_up, the 128x4 swizzled scale layout, padding rows and the nibble order of the packed codes."""

import pytest
import torch

from helpers.oracles import round_up, sf_offsets_by_permute
from qwen_resnorm_fp4 import reference as R
from qwen_resnorm_fp4.layout import sf_offset_128x4

SHAPES = [(1, 64), (5, 128), (127, 64), (128, 192), (129, 256), (300, 512), (256, 3072), (3, 16384)]


def test_round_up():
    """round_up(n, m) is the smallest multiple of m that is >= n."""
    for m in (1, 16, 128):
        for n in range(0, 400, 7):
            r = round_up(n, m)
            assert r % m == 0 and n <= r < n + m


@pytest.mark.parametrize("M,D", SHAPES)
def test_offset_formula_equals_permute_construction(M, D):
    Mp, K = round_up(M, 128), D // 16
    m = torch.arange(Mp).unsqueeze(1)
    k = torch.arange(K).unsqueeze(0)
    got = sf_offset_128x4(m, k, D)
    assert torch.equal(got, sf_offsets_by_permute(M, D))


@pytest.mark.parametrize("M,D", SHAPES)
def test_offset_is_bijection(M, D):
    Mp, K = round_up(M, 128), D // 16
    off = sf_offset_128x4(torch.arange(Mp).unsqueeze(1), torch.arange(K).unsqueeze(0), D).reshape(-1)
    assert torch.equal(torch.sort(off).values, torch.arange(Mp * K))


def test_offset_on_python_ints_and_hand_values():
    D = 256  # K = 16 blocks, K4 = 4 tiles of 4 blocks a row tile: 2048 bytes per 128 rows
    assert sf_offset_128x4(0, 0, D) == 0
    assert sf_offset_128x4(0, 3, D) == 3
    assert sf_offset_128x4(0, 4, D) == 512                   # next k tile
    assert sf_offset_128x4(1, 0, D) == 16                    # m % 32 strides by 16
    assert sf_offset_128x4(32, 0, D) == 4                    # (m % 128) // 32 strides by 4
    assert sf_offset_128x4(33, 5, D) == 512 + 16 + 4 + 1
    assert sf_offset_128x4(128, 0, D) == 4 * 512             # next row tile
    assert sf_offset_128x4(200, 13, D) == 2048 + 3 * 512 + (200 % 32) * 16 + ((200 % 128) // 32) * 4 + 1


def _distinct_nonzero_blocks(M, D, seed=0):
    """y whose every 16-element block has a non-zero amax (so every real SF byte is non-zero)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(M, D, generator=g) + 3.0).to(torch.bfloat16)


@pytest.mark.parametrize("M,D", [(1, 64), (100, 128), (130, 192), (256, 256)])
@pytest.mark.parametrize("fast", [True, False])
def test_scales_are_placed_and_padding_is_zero(M, D, fast):
    y = _distinct_nonzero_blocks(M, D)
    packed, scales = R.nvfp4_quantize(y, torch.tensor([10.0]), fast)
    Mp, K = round_up(M, 128), D // 16
    assert scales.shape == (Mp, K) and scales.dtype == torch.uint8
    off = sf_offsets_by_permute(M, D)
    flat = scales.reshape(-1)
    real = flat[off[:M]]
    pad = flat[off[M:]]
    assert (real != 0).all()
    assert (pad == 0).all()
    # the logical scale of (m, k) is the SF of that block: amax * G / 6 within one E4M3 step
    sf = R.e4m3_to_float(real)
    amax = y.float().reshape(M, K, 16).abs().amax(-1)
    assert torch.allclose(sf, amax * 10.0 / 6.0, rtol=2 ** -4)


@pytest.mark.parametrize("M", [1, 127, 128, 129])
def test_all_zero_blocks_give_zero_scales_and_codes(M):
    D = 128
    y = torch.zeros(M, D, dtype=torch.bfloat16)
    for fast in (True, False):
        packed, scales = R.nvfp4_quantize(y, torch.tensor([448.0 * 6 / 3.0]), fast)
        assert scales.shape == (round_up(M, 128), D // 16)
        assert scales.count_nonzero() == 0 and packed.count_nonzero() == 0


def test_mixed_zero_and_nonzero_blocks():
    # row 0: block 0 zero, block 1 non-zero; row 1: block 0 non-zero, block 1 zero
    y = torch.zeros(2, 64)
    y[0, 16:32] = 1.0
    y[1, 0:16] = -2.0
    y = y.to(torch.bfloat16)
    packed, scales = R.nvfp4_quantize(y, torch.tensor([6.0]), False)
    flat = scales.reshape(-1)
    # with G = 6 the SF is amax: 1.0 -> 0x38, 2.0 -> 0x40
    assert flat[sf_offset_128x4(0, 0, 64)] == 0 and flat[sf_offset_128x4(0, 1, 64)] == 0x38
    assert flat[sf_offset_128x4(1, 0, 64)] == 0x40 and flat[sf_offset_128x4(1, 1, 64)] == 0
    assert flat.count_nonzero() == 2


def test_nibble_order_even_element_low():
    # values that are E2M1 magnitudes, quantized with o = 1 so that each keeps its own code:
    # element 2i -> low nibble, element 2i+1 -> high nibble.
    vals = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0, 6.0]
    y = torch.tensor([vals * 4], dtype=torch.bfloat16)
    packed, scales = R.nvfp4_quantize(y, torch.tensor([1.0]), False)
    # G = 1: SF = e4m3(6 * (1/6)) = 1.0 (0x38), o = 1: codes are the table positions
    assert scales[0, 0].item() == 0x38
    codes = [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 7]
    want = [codes[2 * i] | (codes[2 * i + 1] << 4) for i in range(8)]
    assert packed[0, :8].tolist() == want
    assert want[0] == 0x10 and want[1] == 0x32  # spelled out: (0 | 1<<4), (2 | 3<<4)
    # swapping the two elements of a pair swaps the nibbles
    y2 = y.clone()
    y2[0, 0], y2[0, 1] = y[0, 1], y[0, 0]
    p2, _ = R.nvfp4_quantize(y2, torch.tensor([1.0]), False)
    assert p2[0, 0].item() == 0x01


def test_dequantize_reads_the_layout():
    # dequantize must find each block's scale through the same offsets; rows on both sides of a row-tile
    # boundary (127 / 128) have different scales. With G = 6 (exact mode) SF = amax and every value here
    # is its block's amax, so it quantizes to code 7 (6.0) and dequantizes back exactly: 6 * SF / 6.
    M, D = 130, 64
    y = torch.ones(M, D)
    y[128] *= 4.0
    y[127] *= 0.25
    y = y.to(torch.bfloat16)
    G = torch.tensor([6.0])
    packed, scales = R.nvfp4_quantize(y, G, False)
    deq = R.dequantize_nvfp4(packed, scales, G, M)
    assert torch.equal(deq, y.float())


@pytest.mark.parametrize("m,k,offset,row,col", [
    (0, 0, 0, 0, 0), (1, 0, 16, 0, 16), (32, 0, 4, 0, 4), (0, 5, 513, 2, 129), (37, 6, 598, 3, 22),
    (200, 191, 48779, 254, 11)])
def test_docs_example_3_offsets(m, k, offset, row, col):
    # docs/numerics.md, worked example 3: D = 3072, M = 200
    assert sf_offset_128x4(m, k, 3072) == offset
    assert sf_offsets_by_permute(200, 3072)[m, k].item() == offset
    assert divmod(offset, 3072 // 16) == (row, col)

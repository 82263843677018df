"""The 128x4 swizzled layout of NVFP4 block scales that the FP4 GEMMs (CUTLASS / cuBLASLt / FlashInfer) read."""

from __future__ import annotations

from typing import Tuple, TypeVar

T = TypeVar("T")


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n``."""
    return (n + multiple - 1) // multiple * multiple


def packed_shape(rows: int, cols: int) -> Tuple[int, int]:
    """[rows, cols / 2]: the packed E2M1 bytes of ``rows`` rows of ``cols`` elements (two codes per byte)."""
    return rows, cols // 2


def scales_shape(rows: int, cols: int) -> Tuple[int, int]:
    """[round_up(rows, 128), cols / 16]: the block-scale bytes of ``rows`` rows of ``cols`` elements in the 128x4
    layout, its padding rows included (one E4M3 scale per 16-element block)."""
    return round_up(rows, 128), cols // 16


def scales_bytes(rows: int, cols: int) -> int:
    """The byte count of :func:`scales_shape`."""
    padded, blocks = scales_shape(rows, cols)
    return padded * blocks


def sf_offset_128x4(m: T, k: T, cols: int) -> T:
    """Byte offset of the scale of row ``m``, 16-element block ``k`` in a row of ``cols`` elements.

    Rows are tiled by 128 and blocks by 4; inside a tile, row m sits at (m % 32) * 16 + ((m % 128) // 32) * 4
    and block k at k % 4, so one 512-byte tile holds 128 rows x 4 blocks. Works on ints and integer tensors.
    """
    k4 = cols // 64  # tiles of 4 blocks along a row
    return (m // 128) * (k4 * 512) + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + (k % 4)


def sf_offsets(rows: int, cols: int, device=None):
    """int64 [rows, cols / 16]: :func:`sf_offset_128x4` of every (row, block) of ``rows`` rows of ``cols``
    elements, made on ``device`` (no host-to-device copy)."""
    import torch

    m = torch.arange(rows, device=device).unsqueeze(1)
    k = torch.arange(cols // 16, device=device).unsqueeze(0)
    return sf_offset_128x4(m, k, cols)


def swizzle_scales_128x4(scales, rows: int, cols: int):
    """uint8 :func:`scales_shape` ``(rows, cols)``: row-major E4M3 block scales [rows, cols / 16] (uint8 or
    float8_e4m3fn) moved into the 128x4 layout (:func:`sf_offsets`), padding rows zero. Only bytes move."""
    import torch

    flat = torch.zeros(scales_bytes(rows, cols), dtype=torch.uint8, device=scales.device)
    flat[sf_offsets(rows, cols, scales.device).reshape(-1)] = scales.reshape(-1).view(torch.uint8)
    return flat.reshape(scales_shape(rows, cols))

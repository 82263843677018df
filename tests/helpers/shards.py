"""Sequence shards of a resnorm_quant call, as context parallelism makes them, and the row-by-row comparison of a
shard's outputs with the same rows of the full call. Used by tests/ops/test_shard_slices.py (CPU) and
tests/ops/test_gpu_shard_slices.py (the kernels).

A full call has x, residual [B, S, D]; the shard holds tokens s0 .. s1 - 1 of every sample (diffusers'
EquipartitionSharder chunks dim 1), made contiguous as a sharded model's activations are. Its modulation is
what a sharded model hands the op: [D] and [B, D] unchanged, per-token parameters sliced along S (views: the
strides stay, stride 0 included), modulate_index sliced along S.

Modulation forms (:data:`FORMS`):
- "shared" [D]; "batch" [B, D];
- "token": per token [B, S, D], contiguous;
- "token_chunk_views": ``temb.chunk(6, dim=2)`` views of one contiguous [B, S, 6D] (Wan 2.2 TI2V's layout);
- "token_stride0": per token [B, S, D] with token stride 0, chunks of a [B, 1, 6, D] modulation expanded to
  [B, S, 6, D] (TensorRT-LLM broadcasts the projected modulation that way before sharding);
- "token_batch_stride0": per token [B, S, D] with batch stride 0, chunks of one [1, S, 6, D] expanded over
  the batch (a per-token modulation computed once for every sample);
- "indexed": [2B, D] with modulate_index [B, S] (int32), 0 before ``boundary`` and 1 from it (zero_cond_t:
  target tokens, then condition-image tokens), the boundary placed inside the shard by the callers.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from helpers.inputs import make_inputs
from qwen_resnorm_fp4.layout import round_up, sf_offset_128x4

FORMS = ("shared", "batch", "token", "token_chunk_views", "token_stride0", "token_batch_stride0", "indexed")
_MODULATION = ("gate", "scale", "shift")


def full_inputs(B: int, S: int, D: int, form: str, *, boundary: int, seed: int, device: str = "cpu",
                generate_on_device: bool = False) -> Dict[str, object]:
    """The full call's arguments (a helpers.inputs.make_inputs dict without bias or affine, the DiT blocks' plain
    call), modulation in ``form``."""
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}")
    base = {"shared": "shared", "batch": "batch", "token": "token", "token_chunk_views": "token",
            "token_stride0": "batch", "token_batch_stride0": "token", "indexed": "indexed_int32"}[form]
    inp = make_inputs(B, S, D, base, seed=seed, device=device, bias=False, generate_on_device=generate_on_device,
                      strided=form == "token_chunk_views")
    if form == "token_stride0":
        g = torch.Generator(device=device if generate_on_device else "cpu").manual_seed(seed + 1)
        rest = torch.randn(B, 1, 3, D, generator=g, device=g.device).to(torch.bfloat16).to(device)
        per_sample = torch.cat([torch.stack([inp["shift"], inp["scale"], inp["gate"]], dim=1).unsqueeze(1), rest],
                               dim=2)  # [B, 1, 6, D]
        shift, scale, gate = (c.squeeze(2) for c in per_sample.expand(B, S, 6, D).chunk(6, dim=2)[:3])
        assert gate.stride()[1] == 0 and gate.shape == (B, S, D)
        inp.update(gate=gate, scale=scale, shift=shift)
    if form == "token_batch_stride0":
        g = torch.Generator(device=device if generate_on_device else "cpu").manual_seed(seed + 2)
        rest = torch.randn(1, S, 3, D, generator=g, device=g.device).to(torch.bfloat16).to(device)
        one = torch.cat([torch.stack([inp[k][:1] for k in ("shift", "scale", "gate")], dim=2), rest], dim=2)
        shift, scale, gate = (c.squeeze(2) for c in one.expand(B, S, 6, D).chunk(6, dim=2)[:3])
        assert (B == 1 or gate.stride()[0] == 0) and gate.shape == (B, S, D)
        inp.update(gate=gate, scale=scale, shift=shift)
    if form == "indexed":
        index = torch.zeros(B, S, dtype=torch.int32, device=device)
        index[:, boundary:] = 1
        inp["modulate_index"] = index
    return inp


def shard_inputs(inp: Dict[str, object], s0: int, s1: int) -> Dict[str, object]:
    """Tokens s0 .. s1 - 1 of every sample of a :func:`full_inputs` dict (see the module docstring)."""
    out = dict(inp)
    for name in ("x", "residual"):
        out[name] = inp[name][:, s0:s1].contiguous()
    for name in _MODULATION:
        t = inp[name]
        if t.dim() == 3 and t.shape[1] != 1:
            out[name] = t[:, s0:s1]
    if inp["modulate_index"] is not None:
        out["modulate_index"] = inp["modulate_index"][:, s0:s1]
    return out


def full_rows(B: int, S: int, s0: int, s1: int, device=None) -> torch.Tensor:
    """The full call's row index of each shard row, in the shard's row order (int64 [B * (s1 - s0)])."""
    b = torch.arange(B, device=device).unsqueeze(1)
    s = torch.arange(s0, s1, device=device).unsqueeze(0)
    return (b * S + s).reshape(-1)


def scale_rows(scales: torch.Tensor, rows: torch.Tensor, cols: int) -> torch.Tensor:
    """The [len(rows), cols/16] scale bytes of the given rows, read through the 128x4 layout."""
    k = torch.arange(cols // 16, device=scales.device).unsqueeze(0)
    return scales.reshape(-1)[sf_offset_128x4(rows.to(scales.device).unsqueeze(1), k, cols)]


def shard_matches_full(full: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                       shard: Tuple[torch.Tensor, torch.Tensor, torch.Tensor], B: int, S: int, s0: int, s1: int,
                       quantized_exact: bool = True) -> Optional[str]:
    """None when the shard's (packed, scales, residual_out) equal the same rows of the full call's, bit for bit
    (packed and scale bytes only with ``quantized_exact``), and the shard's scale padding rows are zero; else
    what differs."""
    (f_packed, f_scales, f_res), (packed, scales, res) = full, shard
    D = f_res.shape[-1]
    rows = B * (s1 - s0)
    idx = full_rows(B, S, s0, s1, device=f_packed.device)
    if packed.shape != (rows, D // 2) or scales.shape != (round_up(rows, 128), D // 16) or res.shape != (B, s1 - s0, D):
        return f"shapes {tuple(packed.shape)}, {tuple(scales.shape)}, {tuple(res.shape)} for {rows} rows of {D}"
    if not torch.equal(res, f_res[:, s0:s1]):
        return f"residual_out: {int((res != f_res[:, s0:s1]).sum())} elements differ"
    local = torch.arange(rows, device=scales.device)
    padding = torch.arange(rows, round_up(rows, 128), device=scales.device)
    if padding.numel() and bool(scale_rows(scales, padding, D).any()):
        return "the scale padding rows are not zero"
    if not quantized_exact:
        return None
    if not torch.equal(packed, f_packed[idx]):
        bad = (packed != f_packed[idx]).any(1).nonzero().flatten()
        return f"packed: {bad.numel()} of {rows} rows differ (first shard row {int(bad[0])})"
    if not torch.equal(scale_rows(scales, local, D), scale_rows(f_scales, idx, D)):
        return "scales differ"
    return None

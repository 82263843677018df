"""Bad inputs, at both layers, on every device: the typed wrappers (qwen_resnorm_fp4.resnorm_quant /
resnorm / nvfp4_quantize) and the raw ops (torch.ops.qwen_fp4.*).

Each case of the table below is one way to call the ops wrongly (or awkwardly). For every case, op it
applies to, layer and device:
- "reject" cases: the wrapper raises TypeError / ValueError whose message names the argument; the raw
  op raises too, naming it (TypeError / ValueError from the CPU implementation, which applies the wrappers'
  rules; RuntimeError from the C++ checks on CUDA, or from the dispatcher for a wrongly typed scalar);
- "layout" cases (non-contiguous or misaligned views): the wrapper copies and returns the same bytes as
  for contiguous inputs; the raw CPU op accepts them too (same bytes); the raw CUDA op refuses them,
  naming the argument ("must be contiguous" / "must be 16-byte aligned");
- always: no input is modified (bitwise comparison with clones taken before the call) and nothing
  crashes (on CUDA the stream is synchronized after every call, so an asynchronous fault would surface).

Devices: "cpu" always; "cuda" when a GPU and the compiled library are present (marked gpu). Cases that mix
devices put one tensor on the other device (CUDA when testing "cpu", so they need a GPU too); the
cross-GPU cases need two GPUs. docs/reliability.md lists the cases and their expected results.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Dict, Optional, Tuple

import pytest
import numpy as np
import torch

import qwen_resnorm_fp4 as q

from helpers.reliability import CUDA_OK  # noqa: E402
TWO_GPUS = CUDA_OK and torch.cuda.device_count() >= 2
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

B, S, D = 2, 4, 128  # x: [B, S, D], 8 rows
RQ, RN, NQ = "resnorm_quant", "resnorm", "nvfp4_quantize"
RESNORM_OPS = (RQ, RN)
GS_OPS = (RQ, NQ)
ALL_OPS = (RQ, RN, NQ)


# ---------------------------------------------------------------------------------------------------
# Good arguments, and the two ways of calling each op
# ---------------------------------------------------------------------------------------------------


def good(dev: str, indexed: bool = False) -> Dict[str, object]:
    """Valid arguments of all three ops on ``dev`` (per-batch [B, D] modulation, or [2B, D] + index)."""
    g = torch.Generator().manual_seed(1234)

    def rnd(*shape, std=1.0, mean=0.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=g) * std + mean).to(dtype).to(dev)

    nb = 2 * B if indexed else B
    return dict(
        residual=rnd(B, S, D, std=2.0), x=rnd(B, S, D), bias=rnd(D, std=0.1),
        gate=rnd(nb, D, mean=0.5, std=0.3), scale=rnd(nb, D, std=0.3), shift=rnd(nb, D, std=0.3),
        global_scale=torch.tensor([50.0], device=dev), eps=1e-6, fast_math=True,
        weight=rnd(D, std=0.1, mean=1.0), norm_bias=rnd(D, std=0.1),
        modulate_index=(torch.arange(B * S).reshape(B, S) % 3 == 0).to(torch.int32).to(dev) if indexed else None,
        y=rnd(B, S, D, std=3.0),
    )


def call(op: str, level: str, kw: Dict[str, object]):
    """Call ``op`` through the typed wrapper (level "wrapper") or the raw torch.ops entry ("raw")."""
    if op == NQ:
        fn = q.nvfp4_quantize if level == "wrapper" else torch.ops.qwen_fp4.nvfp4_quantize
        return fn(kw["y"], kw["global_scale"], kw["fast_math"])
    common = (kw["residual"], kw["x"], kw["bias"], kw["gate"], kw["scale"], kw["shift"])
    tail = (kw["weight"], kw["norm_bias"], kw["modulate_index"])
    if op == RQ:
        head = common + (kw["global_scale"], kw["eps"], kw["fast_math"])
        if level == "wrapper":
            return q.resnorm_quant(*head, weight=tail[0], norm_bias=tail[1], modulate_index=tail[2])
        return torch.ops.qwen_fp4.resnorm_quant(*head, *tail)
    head = common + (kw["eps"],)
    if level == "wrapper":
        return q.resnorm(*head, weight=tail[0], norm_bias=tail[1], modulate_index=tail[2])
    return torch.ops.qwen_fp4.resnorm(*head, *tail)


def op_tensors(op: str, kw: Dict[str, object]) -> Dict[str, torch.Tensor]:
    names = ("y", "global_scale") if op == NQ else (
        "residual", "x", "bias", "gate", "scale", "shift", "weight", "norm_bias", "modulate_index") + (
        ("global_scale",) if op == RQ else ())
    return {n: kw[n] for n in names if isinstance(kw[n], torch.Tensor)}


def dispatches_to_cuda(op: str, kw: Dict[str, object]) -> bool:
    return any(t.is_cuda for t in op_tensors(op, kw).values())


def bits(t: torch.Tensor) -> torch.Tensor:
    """A bitwise view for exact comparison (NaN-safe), on CPU."""
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1).to(torch.uint8)


def same_bytes(a, b) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(bits(x), bits(y))
                                    for x, y in zip(a, b))


def sync_all():
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


# ---------------------------------------------------------------------------------------------------
# Views with the same values and other strides / offsets
# ---------------------------------------------------------------------------------------------------


def misaligned(t: torch.Tensor, elems: int = 1) -> torch.Tensor:
    """A contiguous copy of ``t`` starting ``elems`` elements into a fresh buffer: data_ptr % 16 != 0."""
    buf = torch.zeros(t.numel() + elems, dtype=t.dtype, device=t.device)
    v = buf[elems:].view(t.shape)
    v.copy_(t)
    assert v.is_contiguous() and v.data_ptr() % 16 != 0
    return v


def strided(t: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """A non-contiguous view of a copy of ``t``: a slice [offset : offset + D] of rows twice as wide."""
    big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1] + offset, dtype=t.dtype, device=t.device)
    v = big[..., offset:offset + t.shape[-1]]
    v.copy_(t)
    assert not v.is_contiguous()
    return v


def every_other(t: torch.Tensor) -> torch.Tensor:
    """A non-contiguous view (stride 2 along the last dim) of a copy of ``t``; also for 1-d tensors."""
    v = torch.stack([t, torch.zeros_like(t)], dim=-1)[..., 0]
    assert not v.is_contiguous() and torch.equal(v, t)
    return v


def one_row_slice_misaligned(t: torch.Tensor) -> torch.Tensor:
    """The brief's ``big[..., 1:D+1]`` with one row: contiguous (one row) but 2 bytes off alignment."""
    row = t.reshape(-1, t.shape[-1])[:1]
    big = torch.zeros(1, row.shape[-1] + 2, dtype=t.dtype, device=t.device)
    v = big[..., 1:row.shape[-1] + 1]
    v.copy_(row)
    assert v.is_contiguous() and v.data_ptr() % 16 != 0
    return v


def other_device(dev: str) -> str:
    return "cpu" if dev == "cuda" else "cuda"


# ---------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------

Mutation = Callable[[Dict[str, object], str], Dict[str, object]]


@dataclasses.dataclass
class Case:
    name: str
    ops: Tuple[str, ...]
    mutate: Mutation  # (good kwargs, device) -> overrides
    exc: type = ValueError  # the wrapper's exception (and the raw CPU op's)
    pat: str = ""  # regex every error message must match (it names the argument)
    raw_cuda_pat: Optional[str] = None  # the raw CUDA op's message where it differs from the wrapper's
    kind: str = "reject"  # "reject" or "layout"
    indexed: bool = False  # start from the [2B, D] + modulate_index arguments
    needs: str = ""  # "other_device": a second device kind (CUDA when dev is cpu); "two_gpus"
    schema: bool = False  # the raw op's dispatcher refuses the argument type itself (RuntimeError)


def _t(**kw):
    return lambda k, dev: kw


CASES = [
    # --- dtypes
    Case("x_fp16", RESNORM_OPS, lambda k, d: dict(x=k["x"].half()), TypeError, r"\bx must be bfloat16"),
    Case("x_fp32", RESNORM_OPS, lambda k, d: dict(x=k["x"].float()), TypeError, r"\bx must be bfloat16"),
    Case("residual_fp32", RESNORM_OPS, lambda k, d: dict(residual=k["residual"].float()), TypeError,
         r"\bresidual must be bfloat16"),
    Case("gate_int32", RESNORM_OPS, lambda k, d: dict(gate=k["gate"].int()), TypeError,
         r"\bgate must be bfloat16 or float32"),
    Case("scale_fp16", RESNORM_OPS, lambda k, d: dict(scale=k["scale"].half()), TypeError,
         r"\bscale must be bfloat16 or float32"),
    Case("shift_fp64", RESNORM_OPS, lambda k, d: dict(shift=k["shift"].double()), TypeError,
         r"\bshift must be bfloat16 or float32"),
    Case("bias_fp64", RESNORM_OPS, lambda k, d: dict(bias=k["bias"].double()), TypeError,
         r"\bbias must be bfloat16 or float32"),
    Case("weight_int64", RESNORM_OPS, lambda k, d: dict(weight=k["weight"].long()), TypeError,
         r"\bweight must be bfloat16 or float32"),
    Case("norm_bias_fp16", RESNORM_OPS, lambda k, d: dict(norm_bias=k["norm_bias"].half()), TypeError,
         r"\bnorm_bias must be bfloat16 or float32"),
    Case("global_scale_bf16", GS_OPS, lambda k, d: dict(global_scale=k["global_scale"].bfloat16()), TypeError,
         r"\bglobal_scale must be float32"),
    Case("global_scale_fp64", GS_OPS, lambda k, d: dict(global_scale=k["global_scale"].double()), TypeError,
         r"\bglobal_scale must be float32"),
    Case("modulate_index_float", RESNORM_OPS, lambda k, d: dict(modulate_index=k["modulate_index"].float()),
         TypeError, r"\bmodulate_index must be int32", indexed=True),
    Case("modulate_index_uint8", RESNORM_OPS, lambda k, d: dict(modulate_index=k["modulate_index"].to(torch.uint8)),
         TypeError, r"\bmodulate_index must be int32", indexed=True),
    Case("y_fp32", (NQ,), lambda k, d: dict(y=k["y"].float()), TypeError, r"\by must be bfloat16"),
    Case("y_fp8", (NQ,), lambda k, d: dict(y=k["y"].to(torch.float8_e4m3fn)), TypeError, r"\by must be bfloat16"),
    # --- devices (one tensor on the other kind of device; two GPUs)
    Case("residual_other_device", RESNORM_OPS, lambda k, d: dict(residual=k["residual"].to(other_device(d))),
         ValueError, r"\b(residual|x) (is on|must be a CUDA tensor)", needs="other_device"),
    Case("x_other_device", RESNORM_OPS, lambda k, d: dict(x=k["x"].to(other_device(d))),
         ValueError, r"\b(residual|x) (is on|must be a CUDA tensor)", needs="other_device"),
    Case("gate_other_device", RESNORM_OPS, lambda k, d: dict(gate=k["gate"].to(other_device(d))),
         ValueError, r"\b(gate|x) (is on|must be a CUDA tensor)", needs="other_device"),
    Case("bias_other_device", RESNORM_OPS, lambda k, d: dict(bias=k["bias"].to(other_device(d))),
         ValueError, r"\b(bias|x) (is on|must be a CUDA tensor)", needs="other_device"),
    Case("global_scale_other_device", GS_OPS, lambda k, d: dict(global_scale=k["global_scale"].to(other_device(d))),
         ValueError, r"\b(global_scale|x|y) (is on|must be a CUDA tensor)", needs="other_device"),
    Case("modulate_index_other_device", RESNORM_OPS,
         lambda k, d: dict(modulate_index=k["modulate_index"].to(other_device(d))),
         ValueError, r"\b(modulate_index|x) (is on|must be a CUDA tensor)", indexed=True, needs="other_device"),
    Case("gate_on_cuda1", RESNORM_OPS, lambda k, d: dict(gate=k["gate"].to("cuda:1")),
         ValueError, r"\bgate is on cuda:1 but x is on cuda:0", needs="two_gpus"),
    Case("x_on_cuda1", RESNORM_OPS, lambda k, d: dict(x=k["x"].to("cuda:1")),
         ValueError, r"\bresidual is on cuda:0 but x is on cuda:1", needs="two_gpus"),
    Case("global_scale_on_cuda1", GS_OPS, lambda k, d: dict(global_scale=k["global_scale"].to("cuda:1")),
         ValueError, r"\bglobal_scale is on cuda:1 but (x|y) is on cuda:0", needs="two_gpus"),
    Case("y_on_cuda1", (NQ,), lambda k, d: dict(y=k["y"].to("cuda:1")),
         ValueError, r"\bglobal_scale is on cuda:0 but (x|y) is on cuda:1", needs="two_gpus"),
    # --- shapes
    Case("residual_other_shape", RESNORM_OPS, lambda k, d: dict(residual=k["residual"][:, :3].contiguous()),
         ValueError, r"\bresidual shape \(2, 3, 128\) must equal x shape"),
    Case("residual_same_numel_other_shape", RESNORM_OPS, lambda k, d: dict(residual=k["residual"].reshape(B * S, D)),
         ValueError, r"\bresidual shape \(8, 128\) must equal x shape"),
    Case("bias_wrong_length", RESNORM_OPS, lambda k, d: dict(bias=torch.cat([k["bias"], k["bias"][:64]])),
         ValueError, r"\bbias must have shape \(128,?\)"),
    Case("bias_2d", RESNORM_OPS, lambda k, d: dict(bias=k["bias"].reshape(1, D)),
         ValueError, r"\bbias must have shape \(128,?\)"),
    Case("gate_wrong_D", RESNORM_OPS, lambda k, d: dict(gate=k["gate"][:, :64].contiguous()),
         ValueError, r"\bgate must be \[D\], \[B, D\] or \[B, S, D\] with D=128"),
    Case("scale_wrong_D", RESNORM_OPS, lambda k, d: dict(scale=torch.cat([k["scale"], k["scale"][:, :64]], 1)),
         ValueError, r"\bscale must be \[D\], \[B, D\] or \[B, S, D\] with D=128"),
    Case("shift_4d", RESNORM_OPS, lambda k, d: dict(shift=k["shift"][None, None]),
         ValueError, r"\bshift must be \[D\], \[B, D\] or \[B, S, D\] with D=128"),
    Case("gate_vs_scale_shapes", RESNORM_OPS, lambda k, d: dict(scale=k["scale"][0].contiguous()),
         ValueError, r"gate, scale and shift must have one shape"),
    Case("gate_vs_shift_batches", RESNORM_OPS, lambda k, d: dict(shift=torch.cat([k["shift"], k["shift"]])),
         ValueError, r"gate, scale and shift must have one shape"),
    Case("weight_wrong_shape", RESNORM_OPS, lambda k, d: dict(weight=k["weight"].reshape(2, D // 2)),
         ValueError, r"\bweight must have shape \(128,?\)"),
    Case("norm_bias_wrong_shape", RESNORM_OPS, lambda k, d: dict(norm_bias=k["norm_bias"][:64].contiguous()),
         ValueError, r"\bnorm_bias must have shape \(128,?\)"),
    Case("modulate_index_1d", RESNORM_OPS, lambda k, d: dict(modulate_index=k["modulate_index"].reshape(-1)),
         ValueError, r"\bmodulate_index must be \[B, S\]", indexed=True),
    Case("modulate_index_3d", RESNORM_OPS, lambda k, d: dict(modulate_index=k["modulate_index"].unsqueeze(-1)),
         ValueError, r"\bmodulate_index must be \[B, S\]", indexed=True),
    Case("modulate_index_count", RESNORM_OPS,
         lambda k, d: dict(modulate_index=torch.cat([k["modulate_index"], k["modulate_index"][:, :1]], 1)),
         ValueError, r"\bmodulate_index has .*entries but x has 8 rows", indexed=True),
    Case("modulate_index_with_B_rows", RESNORM_OPS,
         lambda k, d: dict(gate=k["gate"][:B].contiguous(), scale=k["scale"][:B].contiguous(),
                           shift=k["shift"][:B].contiguous()),
         ValueError, r"with modulate_index of shape \(2, 4\), gate/scale/shift must be \[2B, D\]", indexed=True),
    Case("gate_batches_do_not_divide_rows", RESNORM_OPS,
         lambda k, d: dict(gate=k["gate"][:1].repeat(3, 1), scale=k["scale"][:1].repeat(3, 1),
                           shift=k["shift"][:1].repeat(3, 1)),
         ValueError, r"x has 8 rows, which do(es)? not split into gate\.shape\[0\] = 3 batches"),
    Case("empty_gate_1d", RESNORM_OPS, lambda k, d: dict(gate=k["gate"][0, :0]),
         ValueError, r"\bgate must be \[D\], \[B, D\] or \[B, S, D\] with D=128, got shape \(0,?\)"),
    Case("empty_gate_scale_shift_2d", RESNORM_OPS,
         lambda k, d: dict(gate=k["gate"][:0], scale=k["scale"][:0], shift=k["shift"][:0]),
         ValueError, r"into gate\.shape\[0\] = 0 batches"),
    Case("D_not_multiple_of_64", (RQ,),
         lambda k, d: dict(x=k["x"][..., :96].contiguous(), residual=k["residual"][..., :96].contiguous(),
                           bias=None, weight=None, norm_bias=None, gate=k["gate"][:, :96].contiguous(),
                           scale=k["scale"][:, :96].contiguous(), shift=k["shift"][:, :96].contiguous()),
         ValueError, r"\bx\.shape\[-1\] \(D\) must be a positive multiple of 64, got 96"),
    # resnorm takes any multiple of 16 (as the FP8 ops do)
    Case("D_not_multiple_of_16", RESNORM_OPS,
         lambda k, d: dict(x=k["x"][..., :40].contiguous(), residual=k["residual"][..., :40].contiguous(),
                           bias=None, weight=None, norm_bias=None, gate=k["gate"][:, :40].contiguous(),
                           scale=k["scale"][:, :40].contiguous(), shift=k["shift"][:, :40].contiguous()),
         ValueError, r"\bx\.shape\[-1\] \(D\) must be a positive multiple of (64|16), got 40"),
    Case("D_zero", RESNORM_OPS,
         lambda k, d: dict(x=k["x"][..., :0], residual=k["residual"][..., :0], bias=None, weight=None,
                           norm_bias=None, gate=k["gate"][:, :0], scale=k["scale"][:, :0], shift=k["shift"][:, :0]),
         ValueError, r"\bx\.shape\[-1\] \(D\) must be a positive multiple of (64|16), got 0"),
    Case("D_above_16384", RESNORM_OPS,
         lambda k, d: dict(x=torch.zeros(2, 16448, dtype=torch.bfloat16, device=d),
                           residual=torch.zeros(2, 16448, dtype=torch.bfloat16, device=d), bias=None, weight=None,
                           norm_bias=None, gate=torch.zeros(16448, dtype=torch.bfloat16, device=d),
                           scale=torch.zeros(16448, dtype=torch.bfloat16, device=d),
                           shift=torch.zeros(16448, dtype=torch.bfloat16, device=d)),
         ValueError, r"\bx\.shape\[-1\] \(D\) must be at most 16384, got 16448"),
    Case("x_0d", RESNORM_OPS, lambda k, d: dict(x=k["x"][0, 0, 0], residual=k["residual"][0, 0, 0]),
         ValueError, r"\bx must have at least one dimension"),
    Case("y_D_not_multiple_of_64", (NQ,), lambda k, d: dict(y=k["y"][..., :80].contiguous()),
         ValueError, r"\by\.shape\[-1\] \(D\) must be a positive multiple of 64, got 80"),
    Case("y_D_above_16384", (NQ,), lambda k, d: dict(y=torch.zeros(3, 16448, dtype=torch.bfloat16, device=d)),
         ValueError, r"\by\.shape\[-1\] \(D\) must be at most 16384"),
    Case("y_0d", (NQ,), lambda k, d: dict(y=k["y"][0, 0, 0]), ValueError, r"\by must have at least one dimension"),
    Case("global_scale_2_elements", GS_OPS, lambda k, d: dict(global_scale=torch.tensor([1.0, 2.0], device=d)),
         ValueError, r"\bglobal_scale must have exactly one element"),
    Case("global_scale_empty", GS_OPS, lambda k, d: dict(global_scale=torch.empty(0, device=d)),
         ValueError, r"\bglobal_scale must have exactly one element"),
    Case("global_scale_python_float", GS_OPS, lambda k, d: dict(global_scale=50.0),
         TypeError, r"\bglobal_scale must be a torch\.Tensor|argument 'global_scale'", schema=True),
    # --- scalar values
    Case("eps_negative", RESNORM_OPS, _t(eps=-1e-6), ValueError, r"\beps must be finite and >= 0"),
    Case("eps_nan", RESNORM_OPS, _t(eps=float("nan")), ValueError, r"\beps must be finite and >= 0"),
    Case("eps_inf", RESNORM_OPS, _t(eps=float("inf")), ValueError, r"\beps must be finite and >= 0"),
    Case("eps_minus_inf", RESNORM_OPS, _t(eps=float("-inf")), ValueError, r"\beps must be finite and >= 0"),
    Case("eps_string", RESNORM_OPS, _t(eps="1e-6"), TypeError, r"\beps must be a float|argument 'eps'", schema=True),
    # --- layouts the wrapper copies, the raw CPU op reads as they are, and the raw CUDA op refuses
    Case("x_non_contiguous", RESNORM_OPS, lambda k, d: dict(x=strided(k["x"])), kind="layout",
         raw_cuda_pat=r"\bx must be contiguous"),
    Case("residual_transposed", RESNORM_OPS,
         lambda k, d: dict(residual=k["residual"].transpose(0, 1).contiguous().transpose(0, 1)), kind="layout",
         raw_cuda_pat=r"\bresidual must be contiguous"),
    Case("gate_fp32_last_stride_2", RESNORM_OPS, lambda k, d: dict(gate=every_other(k["gate"].float())), kind="layout",
         raw_cuda_pat=r"\bgate must have stride 1 in its last dimension"),
    Case("modulate_index_non_contiguous", RESNORM_OPS,
         lambda k, d: dict(modulate_index=strided(k["modulate_index"])), kind="layout", indexed=True,
         raw_cuda_pat=r"\bmodulate_index must be contiguous"),
    Case("x_misaligned", RESNORM_OPS, lambda k, d: dict(x=misaligned(k["x"])), kind="layout",
         raw_cuda_pat=r"\bx must be 16-byte aligned"),
    Case("residual_misaligned", RESNORM_OPS, lambda k, d: dict(residual=misaligned(k["residual"], 3)),
         kind="layout", raw_cuda_pat=r"\bresidual must be 16-byte aligned"),
    Case("x_slice_non_contiguous_misaligned", RESNORM_OPS, lambda k, d: dict(x=strided(k["x"], offset=1)),
         kind="layout", raw_cuda_pat=r"\bx must be (contiguous|16-byte aligned)"),
    Case("scale_fp32_misaligned", RESNORM_OPS, lambda k, d: dict(scale=misaligned(k["scale"].float())),
         kind="layout", raw_cuda_pat=r"\bscale must be 16-byte aligned"),
    Case("bias_misaligned", RESNORM_OPS, lambda k, d: dict(bias=misaligned(k["bias"])), kind="layout",
         raw_cuda_pat=r"\bbias must be 16-byte aligned"),
    Case("weight_non_contiguous", RESNORM_OPS, lambda k, d: dict(weight=every_other(k["weight"])), kind="layout",
         raw_cuda_pat=r"\bweight must be contiguous"),
    Case("y_non_contiguous", (NQ,), lambda k, d: dict(y=strided(k["y"])), kind="layout",
         raw_cuda_pat=r"\by must be contiguous"),
    Case("y_one_row_slice_misaligned", (NQ,), lambda k, d: dict(y=one_row_slice_misaligned(k["y"])), kind="layout",
         raw_cuda_pat=r"\by must be 16-byte aligned"),
    # global_scale is read with a scalar load: a 4-byte-aligned view is fine everywhere (raw CUDA included)
    Case("global_scale_view_at_offset", GS_OPS,
         lambda k, d: dict(global_scale=torch.cat([k["global_scale"], k["global_scale"]])[1:]), kind="layout"),
]
assert len(CASES) >= 25
assert len({c.name for c in CASES}) == len(CASES)

PARAMS = [pytest.param(c, op, id=f"{c.name}-{op}") for c in CASES for op in c.ops]


def _skip_unavailable(case: Case, dev: str):
    if case.needs == "other_device" and not CUDA_OK:
        pytest.skip("mixing devices needs a CUDA GPU and the compiled library")
    if case.needs == "two_gpus":
        if dev != "cuda":
            pytest.skip("cross-GPU case: runs in the cuda parametrization")
        if not TWO_GPUS:
            pytest.skip("needs two GPUs")


def _build(case: Case, op: str, dev: str):
    kw = good(dev, indexed=case.indexed)
    kw.update(case.mutate(kw, dev))
    return kw


def _clones(op, kw):
    return {n: t.clone() for n, t in op_tensors(op, kw).items()}


def _assert_unmodified(op, kw, before):
    for n, t in op_tensors(op, kw).items():
        assert torch.equal(bits(t), bits(before[n])), f"{n} was modified"


def _reference_outputs(op, kw):
    """The outputs for the same values in contiguous, aligned tensors (through the wrapper)."""
    clean = {k: (v.contiguous().clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    return call(op, "wrapper", clean)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("case,op", PARAMS)
def test_wrapper(case: Case, op: str, dev: str):
    _skip_unavailable(case, dev)
    kw = _build(case, op, dev)
    before = _clones(op, kw)
    if case.kind == "reject":
        with pytest.raises(case.exc) as info:
            call(op, "wrapper", kw)
        assert re.search(case.pat, str(info.value)), f"message does not name the argument: {info.value}"
    else:
        got = call(op, "wrapper", kw)
        sync_all()
        assert same_bytes(got, _reference_outputs(op, kw)), "non-contiguous / misaligned input changed the result"
    sync_all()
    _assert_unmodified(op, kw, before)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("case,op", PARAMS)
def test_raw_op(case: Case, op: str, dev: str):
    _skip_unavailable(case, dev)
    kw = _build(case, op, dev)
    before = _clones(op, kw)
    on_cuda = dispatches_to_cuda(op, kw)
    if case.kind == "reject":
        want = RuntimeError if (on_cuda or case.schema) else case.exc
        with pytest.raises(want) as info:
            call(op, "raw", kw)
        assert re.search(case.pat, str(info.value)), f"message does not name the argument: {info.value}"
    elif on_cuda and case.raw_cuda_pat is not None:
        with pytest.raises(RuntimeError) as info:
            call(op, "raw", kw)
        assert re.search(case.raw_cuda_pat, str(info.value)), f"unclear refusal: {info.value}"
    else:  # the CPU implementation reads any strides and offsets; CUDA: a layout the kernels accept
        got = call(op, "raw", kw)
        sync_all()
        assert same_bytes(got, _reference_outputs(op, kw))
    sync_all()
    _assert_unmodified(op, kw, before)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("op", ALL_OPS)
def test_good_arguments_pass_at_both_layers(op, dev):
    """The base arguments of the table are valid (so every case above fails for its one mutation)."""
    for indexed in (False, True):
        kw = good(dev, indexed=indexed)
        assert same_bytes(call(op, "wrapper", kw), call(op, "raw", kw))


@pytest.mark.parametrize("dev", DEVICES)
def test_errors_leave_the_device_usable(dev):
    """After a burst of refused calls, a good call still gives the same bytes as before them."""
    kw = good(dev)
    want = call(RQ, "wrapper", kw)
    for case in CASES:
        if case.kind != "reject" or case.needs or RQ not in case.ops:
            continue
        bad = _build(case, RQ, dev)
        with pytest.raises((RuntimeError, TypeError, ValueError)):
            call(RQ, "raw", bad)
    sync_all()
    assert same_bytes(call(RQ, "wrapper", kw), want)


def test_raw_cpu_ops_check_like_the_wrappers():
    """The CPU implementations raise the wrappers' own exception types (not RuntimeError)."""
    kw = good("cpu")
    with pytest.raises(TypeError, match=r"^x must be bfloat16"):
        call(RQ, "raw", dict(kw, x=kw["x"].half()))
    with pytest.raises(ValueError, match=r"^eps must be finite"):
        call(RN, "raw", dict(kw, eps=-1.0))
    with pytest.raises(ValueError, match=r"^global_scale must have exactly one element"):
        call(NQ, "raw", dict(kw, global_scale=torch.ones(2)))


def test_aligned_skips_fake_tensors():
    """api._aligned must not read data_ptr() of FakeTensors (make_fx / FakeTensorMode): no warning, no error."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    kw = good("cpu")

    def f(residual, x, gate, scale, shift, gs):
        return q.resnorm_quant(residual, x, None, gate, scale, shift, gs, 1e-6, True)

    args = (kw["residual"], misaligned(kw["x"]), kw["gate"], kw["scale"], kw["shift"], kw["global_scale"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for mode in ("fake", "symbolic"):
            gm = make_fx(f, tracing_mode=mode)(*args)
            assert "qwen_fp4.resnorm_quant" in gm.code
        with FakeTensorMode() as m:
            outs = f(*[m.from_tensor(a) for a in args])
        assert [tuple(o.shape) for o in outs] == [(B * S, D // 2), (128, D // 16), (B, S, D)]
    data_ptr_warnings = [str(w.message) for w in caught if "data_ptr" in str(w.message) or "data pointer" in
                         str(w.message)]
    assert not data_ptr_warnings, data_ptr_warnings
    # and eagerly the misaligned x is still copied (same bytes as an aligned x)
    assert same_bytes(f(*args), f(*[a.clone() for a in args]))




@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("op", ALL_OPS)
def test_wrappers_call_the_op_once_and_name_the_argument(monkeypatch, op, dev):
    """The op is called once per call and enforces the rules itself (its C++ checks on CUDA, its Python
    implementation on CPU); a refused call comes back as the rules' typed error naming the argument, and on
    CUDA, where the rules find nothing to name, as the op's own error unchanged. A good call (a strided gate
    included, copied for the layout) calls the op once."""
    from qwen_resnorm_fp4 import api

    kw = good(dev)
    want = call(op, "wrapper", kw)
    entry, arguments = api._BOUND[op]
    real, calls = arguments.op, []

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(arguments, "op", counted)
    got = call(op, "wrapper", kw if op == NQ else dict(kw, gate=strided(kw["gate"])))
    sync_all()
    assert same_bytes(got, want) and calls == [1]
    name = "y" if op == NQ else "x"
    bad = dict(kw, **{name: kw[name].half()})
    with pytest.raises(TypeError, match=rf"^{name} must be bfloat16"):
        call(op, "wrapper", bad)
    assert calls == [1, 1]
    if dev == "cuda":  # rules that find nothing: the op's own C++ check answers
        monkeypatch.setattr(entry, "rules", lambda *args, **kw: None)
        with pytest.raises(RuntimeError, match=rf"{name} must be bfloat16"):
            call(op, "wrapper", bad)
        assert calls == [1, 1, 1]
        monkeypatch.undo()
    sync_all()
    assert same_bytes(call(op, "wrapper", kw), want)


@pytest.mark.parametrize("replaced", [False, True], ids=["as_given", "copied"])
def test_out_variant_rules_run_in_python_only_for_a_replaced_input(monkeypatch, replaced):
    """An out-variant's Python rules run before the op only where the operands replaced an input with a copy
    (which could overlap an output unseen by the op); otherwise the op's own checks are the one check, and a
    refused call is still named by the rules."""
    from types import SimpleNamespace

    from qwen_resnorm_fp4 import api

    name = "fp8_quantize_out"
    entry, _ = api._BOUND[name]
    x, out = torch.zeros(4), torch.zeros(4)
    checked, called = [], []

    def problem(args, memory):
        checked.append(memory)
        return None

    def op(*args):
        called.append(args)
        return "done"

    stub = SimpleNamespace(all_on_cpu=lambda args: False, op=op,
                           prepared=lambda args: [a.clone() if replaced and a is x else a for a in args])
    monkeypatch.setitem(api._BOUND, name, (SimpleNamespace(is_out_variant=True, problem=problem), stub))
    assert api._call(name, (x, out)) == "done" and len(called) == 1
    assert checked == ([None] if replaced else [])

    def refuse(*args):
        raise RuntimeError("the op's check")

    stub.op = refuse
    named = SimpleNamespace(exception=lambda: ValueError("out overlaps the input y"))
    monkeypatch.setitem(api._BOUND, name, (SimpleNamespace(is_out_variant=True, problem=lambda a, m: named), stub))
    with pytest.raises(ValueError, match="out overlaps the input y") as info:
        api._call(name, (x, out))
    assert replaced or isinstance(info.value.__cause__, RuntimeError)  # as given: the op refused, the rules named it
    assert entry.is_out_variant


def test_modulate_index_is_never_copied_for_alignment():
    """modulate_index is read element by element: a contiguous index at an odd offset goes to the op as it is
    (no clone for alignment); a non-contiguous one is made contiguous."""
    from qwen_resnorm_fp4 import api

    arguments = api._BOUND["resnorm_quant"][1]
    at = arguments.op._schema.arguments
    index_at = [i for i, a in enumerate(at) if a.name == "modulate_index"][0]
    base = torch.zeros(1 + 2 * 8, dtype=torch.bool)
    odd = base[1:].view(2, 8)  # 1 byte past an aligned start
    kw = good("cpu")
    args = [kw.get(a.name, a.default_value if a.has_default_value() else None) for a in at]
    args[index_at] = odd
    prepared = arguments.prepared(args)
    assert prepared[index_at] is odd
    strided = torch.zeros(8, 2, dtype=torch.int32).t()
    args[index_at] = strided
    prepared = arguments.prepared(args)
    assert prepared[index_at].is_contiguous() and torch.equal(prepared[index_at], strided)


# The route a call with a CUDA tensor takes (operands prepared, the op called, a refusal named by the rules),
# exercised on CPU: an int eps is not a float, so the wrapper does not hand the call to the CPU implementation as
# it is but prepares the operands first, as it does for CUDA tensors.
ROUTED_EPS = 1


def test_a_real_number_eps_goes_as_a_float():
    kw = good("cpu")
    args = [kw[k] for k in ("residual", "x", "bias", "gate", "scale", "shift")]
    want = q.resnorm(*args, 1e-6)
    for eps in (np.float64(1e-6), 1e-6):
        assert same_bytes(q.resnorm(*args, eps), want)
    assert same_bytes(q.resnorm(*args, ROUTED_EPS), q.resnorm(*args, 1.0))
    with pytest.raises(TypeError, match=r"^eps must be a float"):
        q.resnorm(*args, True)


def test_a_zero_dim_gate_is_named_on_the_prepared_route():
    kw = good("cpu")
    with pytest.raises(ValueError, match=r"^gate must be \[D\], \[B, D\] or \[B, S, D\]"):
        q.resnorm(kw["residual"], kw["x"], None, kw["gate"][0, 1], kw["scale"], kw["shift"], ROUTED_EPS)  # misaligned


def test_an_output_overlapping_a_copied_input_is_refused_before_anything_is_written():
    """x is a strided view (rows twice as wide), so the prepared route copies it; y, contiguous, lies in x's
    span. The wrapper applies the out-variant's memory rules to the caller's tensors, before the copy: refused,
    nothing written."""
    kw = good("cpu")
    x = kw["x"]
    n = x.numel()
    buf = torch.zeros(2 * n, dtype=x.dtype)
    x_view = buf.view(*x.shape[:-1], 2 * x.shape[-1])[..., : x.shape[-1]]
    x_view.copy_(x)
    y = buf[n:].view(x.shape)
    before = buf.clone()
    with pytest.raises(ValueError, match=r"overlaps the input x"):
        q.resnorm_out(kw["residual"], x_view, None, kw["gate"], kw["scale"], kw["shift"], ROUTED_EPS, y=y,
                      residual_out=torch.empty_like(x))
    assert torch.equal(buf, before)

"""The benchmark's per-token section (``python -m qwen_resnorm_fp4 bench --peer-dit``): per-token
modulation, gate/scale/shift [1, S, D] views of ``temb.chunk(6, dim=2)`` (row stride 6*D), at D = 3072, under
CUDA-graph replay, in one run:

- FlashInfer's DiT kernel (``fused_dit_gate_residual_layernorm_scale_shift``, BF16 output, pre-allocated
  residual_out / norm_out; built at benchmark time from FlashInfer's header, skipped where that cannot be:
  :mod:`.peers.flashinfer_dit`), a speed peer (:data:`.peers.flashinfer_dit.NUMERICS_NOTE`);
- this library's ``resnorm`` (BF16 output) and fused ``resnorm_quant`` on the same views;

each also as the fraction of a copy of its own bytes (timed the same way) and of the copy ceiling. Bytes:
the op's rows (:func:`.bench.bytes_moved` for the fused op; x, residual read and residual_out, y written for
the BF16 ones) plus M*D*3 modulation elements (bf16) read. A build without per-token modulation refuses the
views: its two rows are skipped with :data:`UNSUPPORTED`.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .bench import (EPS, GRAPH_CALLS, _f, _fast_math, bytes_moved, copy_of_same_bytes, gbps, l2_bytes,
                    markdown_table, outputs_equal, replay_us_per_call)
from .linear import FP4_AMAX_SCALE

DEFAULT_ROWS = (256, 4096, 6889, 16384)
DIM = 3072
UNSUPPORTED = "per-token modulation not supported by this build"
IMPLS = ("flashinfer_dit", "resnorm", "resnorm_quant")
CSV_FIELDS = ["dim", "rows", "calls"] + [f"{n}_{k}" for n in IMPLS for k in ("bytes", "us", "gbps", "frac_copy",
                                                                               "frac_own_copy", "own_copy_us")] + \
    ["fused_equals_unfused", "flashinfer_residual_out_equal", "flashinfer_y_differs_frac"]
TITLE = ("Per-token modulation (gate/scale/shift [1, S, D] from temb.chunk(6, dim=2), row stride 6D), CUDA-graph "
         "replay, GPU time per call, each also against a copy of its own bytes:")


def modulation_bytes(rows: int, dim: int) -> int:
    """Bytes of per-token gate, scale and shift (bf16) the ops read: M*D*3 elements."""
    return 3 * rows * dim * 2


def bf16_output_bytes(rows: int, dim: int) -> int:
    """Bytes of a BF16-output op's rows: x and residual read, residual_out and y written (bf16)."""
    return 4 * rows * dim * 2


def impl_bytes(rows: int, dim: int) -> Dict[str, int]:
    """Bytes each implementation must move, modulation included."""
    mod = modulation_bytes(rows, dim)
    return {"flashinfer_dit": bf16_output_bytes(rows, dim) + mod, "resnorm": bf16_output_bytes(rows, dim) + mod,
            "resnorm_quant": bytes_moved(rows, dim) + mod}


class PerTokenInputs:
    """`calls` input sets: residual and x [1, S, D] bf16, temb [1, S, 6D] bf16 and its chunk views
    (shift, scale, gate = chunks 0, 1, 2: WAN's order), FlashInfer's pre-allocated outputs, zero fp32 biases."""

    def __init__(self, rows: int, dim: int, calls: int, seed: int = 4) -> None:
        gen = torch.Generator(device="cuda").manual_seed(seed + rows)
        opts = dict(device="cuda", generator=gen)
        bf = torch.bfloat16
        self.rows, self.dim = rows, dim
        self.residual = [(torch.randn(1, rows, dim, **opts) * 2).to(bf) for _ in range(calls)]
        self.x = [torch.randn(1, rows, dim, **opts).to(bf) for _ in range(calls)]
        self.temb = [(torch.randn(1, rows, 6 * dim, **opts) * 0.1).to(bf) for _ in range(calls)]
        chunks = [t.chunk(6, dim=2) for t in self.temb]
        self.shift = [c[0] for c in chunks]
        self.scale = [c[1] for c in chunks]
        self.gate = [c[2] for c in chunks]
        self.residual_out = [torch.empty_like(t) for t in self.x]
        self.norm_out = [torch.empty_like(t) for t in self.x]
        self.zero_bias = torch.zeros(dim, device="cuda", dtype=torch.float32)
        self.global_scale = torch.ones(1, device="cuda", dtype=torch.float32)
        self.fast_math = _fast_math()

    def resnorm(self, i: int):
        return torch.ops.qwen_fp4.resnorm(self.residual[i], self.x[i], None, self.gate[i], self.scale[i],
                                          self.shift[i], EPS)

    def resnorm_quant(self, i: int):
        return torch.ops.qwen_fp4.resnorm_quant(self.residual[i], self.x[i], None, self.gate[i], self.scale[i],
                                                self.shift[i], self.global_scale, EPS, self.fast_math)

    def flashinfer_fn(self, ext) -> Callable[[int], object]:
        b = self.zero_bias

        def call(i: int):
            ext.gate_residual_layernorm_scale_shift_bf16(self.x[i], self.residual[i], self.gate[i], self.scale[i],
                                                         self.shift[i], b, b, b, self.residual_out[i],
                                                         self.norm_out[i], EPS)
            return self.residual_out[i], self.norm_out[i]

        return call


def per_token_refusal(inp: PerTokenInputs) -> Optional[str]:
    """None when this build's ops take the per-token views, else the op's refusal (its first line)."""
    try:
        inp.resnorm(0)
        torch.cuda.synchronize()
    except (RuntimeError, ValueError, TypeError) as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def calls_for(rows: int, dim: int, l2: int, cap: int = 2048) -> int:
    """Calls (one input set each) in a graph: at least GRAPH_CALLS, and enough that the sets span more
    than twice the L2."""
    return int(min(max(GRAPH_CALLS, math.ceil(2 * l2 / max(impl_bytes(rows, dim).values()))), cap))


def measure(rows: int, copy_gbps: float, ext, ours: bool, dim: int = DIM, replays: int = 50) -> Dict[str, object]:
    """One row count: each available implementation and a copy of its bytes by graph replay. ``ext``: the
    FlashInfer peer's extension or None; ``ours``: whether this build's ops take the views
    (:func:`per_token_refusal`)."""
    calls = calls_for(rows, dim, l2_bytes())
    inp = PerTokenInputs(rows, dim, calls)
    row: Dict[str, object] = {"dim": dim, "rows": rows, "calls": calls, "ours_supported": ours}
    impls: Dict[str, Callable[[int], object]] = {}
    if ext is not None:
        impls["flashinfer_dit"] = inp.flashinfer_fn(ext)
    if ours:
        y, _ = inp.resnorm(0)
        inp.global_scale.copy_((FP4_AMAX_SCALE / y.float().abs().amax().clamp(min=1e-12)).reshape(1))
        impls["resnorm"] = inp.resnorm
        impls["resnorm_quant"] = inp.resnorm_quant
        y, r = inp.resnorm(0)
        unfused = (*torch.ops.qwen_fp4.nvfp4_quantize(y, inp.global_scale, inp.fast_math), r)
        row["fused_equals_unfused"] = outputs_equal(inp.resnorm_quant(0), unfused)
        if ext is not None:
            r_peer, y_peer = impls["flashinfer_dit"](0)
            torch.cuda.synchronize()
            row["flashinfer_residual_out_equal"] = bool(torch.equal(r_peer, r))
            row["flashinfer_y_differs_frac"] = (y_peer != y).float().mean().item()
    nbytes = impl_bytes(rows, dim)
    copy_us: Dict[int, float] = {}
    for name in IMPLS:
        row[f"{name}_bytes"] = nbytes[name]
        fn = impls.get(name)
        if fn is None:
            continue
        us = replay_us_per_call(fn, calls, replays)
        if nbytes[name] not in copy_us:
            copy_fn, copied = copy_of_same_bytes(nbytes[name], calls)
            copy_us[nbytes[name]] = replay_us_per_call(copy_fn, calls, replays) * nbytes[name] / copied
            del copy_fn
        row.update({f"{name}_us": us, f"{name}_gbps": gbps(nbytes[name], us),
                    f"{name}_frac_copy": gbps(nbytes[name], us) / copy_gbps,
                    f"{name}_own_copy_us": copy_us[nbytes[name]],
                    f"{name}_frac_own_copy": copy_us[nbytes[name]] / us})
    del impls, inp
    torch.cuda.empty_cache()
    return row


def table_lines(rows: List[Dict[str, object]]) -> List[str]:
    columns = ("D", "rows", "calls (input sets)", "implementation", "MB moved", "us", "GB/s", "% copy ceiling",
               "% of a copy of its bytes")
    nan = float("nan")

    def cells(r: Dict[str, object], name: str) -> tuple:
        us = r.get(f"{name}_us", nan)
        return (r["dim"], r["rows"], r["calls"], name if math.isfinite(us) else f"{name} (not measured)",
                f"{r[f'{name}_bytes'] / 1e6:.1f}", _f(us, ".2f"), _f(r.get(f"{name}_gbps", nan), ".0f"),
                _f(100 * r.get(f"{name}_frac_copy", nan), ".1f"), _f(100 * r.get(f"{name}_frac_own_copy", nan), ".1f"))

    return markdown_table(columns, (cells(r, name) for r in rows for name in IMPLS))


def run(rows_list: Tuple[int, ...], copy_gbps: float,
        log: Callable[[str], None] = print) -> Tuple[List[Dict[str, object]], List[str]]:
    """The section: the peer built (or the reason it is skipped), every row count measured; returns the rows
    and the notes (skips, numerics) that go with the table."""
    from .peers import flashinfer_dit

    notes: List[str] = []
    ext, where = flashinfer_dit.load()
    if ext is None:
        notes.append(f"FlashInfer's DiT kernel skipped: {where}")
    else:
        notes.append(f"FlashInfer's DiT kernel (fused_dit_gate_residual_layernorm_scale_shift, BF16 output, zero "
                     f"fp32 biases): {where}")
        notes.append(flashinfer_dit.NUMERICS_NOTE)
    for n in notes:
        log(n)
    refusal = per_token_refusal(PerTokenInputs(17, DIM, 1))
    if refusal is not None:
        notes.append(f"{UNSUPPORTED} (the op refused gate/scale/shift [1, S, D] views: {refusal})")
        log(notes[-1])
    results: List[Dict[str, object]] = []
    for m in rows_list:
        r = measure(m, copy_gbps, ext, refusal is None)
        results.append(r)
        parts = [f"{n} {r[f'{n}_us']:.2f} us ({100 * r[f'{n}_frac_own_copy']:.1f}% of a copy of its bytes)"
                 for n in IMPLS if f"{n}_us" in r]
        log(f"per-token D={r['dim']} rows={m}: " + (", ".join(parts) if parts else "nothing to measure")
            + ("" if "fused_equals_unfused" not in r else f"; fused == unfused bytes: {r['fused_equals_unfused']}"))
    return results, notes

#!/usr/bin/env python
"""Per-token modulation against FlashInfer's DiT kernel (docs/performance.md, "Per-token modulation").
GPU only.

    python benchmarks/bench_per_token.py --out DIR      # rows 256, 4096, 6889, 16384 at D = 3072

gate/scale/shift are [1, S, D] views of ``temb.chunk(6, dim=2)`` (row stride 6*D), under CUDA-graph replay
(:func:`timing.compare_by_graph`), in one run:

- FlashInfer's DiT kernel (``fused_dit_gate_residual_layernorm_scale_shift``, BF16 output, pre-allocated
  residual_out / norm_out; built at benchmark time from FlashInfer's header, skipped where that cannot be:
  :mod:`peers.flashinfer_dit`), a speed peer (:data:`peers.flashinfer_dit.NUMERICS_NOTE`);
- this library's ``resnorm`` (BF16 output) and fused ``resnorm_quant`` on the same views;

each also as the fraction of a copy of its own bytes (timed the same way) and of the copy ceiling. Bytes:
the op's rows (:func:`harness.bytes_moved` for the fused op; x, residual read and residual_out, y written
for the BF16 ones) plus M*D*3 modulation elements (bf16) read.

Byte checks, each failing the run (exit status 1) when False or not made: the fused op equals ``resnorm``
then ``nvfp4_quantize`` on the same views; FlashInfer's residual_out equals this library's (both are
bf16(fma(x, gate, residual)) with a zero gate bias). A build whose ops refuse per-token views
(:data:`UNSUPPORTED`) has its two rows skipped, and nothing of its own to check. Writes
``bench_per_token.{csv,md}``.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Callable, Dict, List, Optional, Sequence

import torch
from qwen_resnorm_fp4.env import default_fast_math

import harness
import results
import timing
from harness import EPS, bytes_moved
from peers import flashinfer_dit
from results import fmt

DEFAULT_ROWS = (256, 4096, 6889, 16384)
DIM = 3072
PROG = "bench_per_token"
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
    """``calls`` input sets: residual and x [1, S, D] bf16, temb [1, S, 6D] bf16 and its chunk views
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
        self.fast_math = default_fast_math()

    def resnorm(self, i: int):
        return torch.ops.qwen_fp4.resnorm(self.residual[i], self.x[i], None, self.gate[i], self.scale[i],
                                          self.shift[i], EPS)

    def resnorm_quant(self, i: int):
        return torch.ops.qwen_fp4.resnorm_quant(self.residual[i], self.x[i], None, self.gate[i], self.scale[i],
                                                self.shift[i], self.global_scale, EPS, self.fast_math)

    def flashinfer_fn(self, ext) -> timing.Fn:
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


def required_checks(row: Dict[str, object]) -> List[str]:
    """The byte checks a row must pass: fused == unfused where this build's ops ran, and FlashInfer's
    residual_out == ours where both ran."""
    if not row.get("ours_supported"):
        return []
    return ["fused_equals_unfused"] + (["flashinfer_residual_out_equal"] if row.get("flashinfer_measured") else [])


def byte_check_failures(rows: Sequence[Dict[str, object]]) -> List[str]:
    """Every row and required check (:func:`required_checks`) that failed or was not made."""
    return results.check_failures(rows, required_checks, lambda r: f"D={r['dim']} rows={r['rows']}")


def measure(rows: int, ceiling: float, ext, ours: bool, dim: int = DIM, replays: int = 50) -> Dict[str, object]:
    """One row count: each available implementation and a copy of its bytes by graph replay, and the byte
    checks. ``ext``: the FlashInfer peer's extension or None; ``ours``: whether this build's ops take the
    views (:func:`per_token_refusal`)."""
    calls = timing.sets_for_cold_l2(max(impl_bytes(rows, dim).values()), timing.l2_bytes(),
                                    minimum=timing.GRAPH_CALLS)
    inp = PerTokenInputs(rows, dim, calls)
    row: Dict[str, object] = {"dim": dim, "rows": rows, "calls": calls, "ours_supported": ours,
                              "flashinfer_measured": ext is not None}
    impls: Dict[str, timing.Fn] = {}
    if ext is not None:
        impls["flashinfer_dit"] = inp.flashinfer_fn(ext)
    if ours:
        y, _ = inp.resnorm(0)
        inp.global_scale.copy_(harness.global_scale_for(y))
        impls["resnorm"] = inp.resnorm
        impls["resnorm_quant"] = inp.resnorm_quant
        y, r = inp.resnorm(0)
        unfused = (*torch.ops.qwen_fp4.nvfp4_quantize(y, inp.global_scale, inp.fast_math), r)
        row["fused_equals_unfused"] = results.outputs_equal(inp.resnorm_quant(0), unfused)
        if ext is not None:
            r_peer, y_peer = impls["flashinfer_dit"](0)
            torch.cuda.synchronize()
            row["flashinfer_residual_out_equal"] = results.outputs_equal(r_peer, r)
            row["flashinfer_y_differs_frac"] = (y_peer != y).float().mean().item()
    nbytes = impl_bytes(rows, dim)
    row.update({f"{name}_bytes": nbytes[name] for name in IMPLS})
    row.update(timing.compare_by_graph(impls, nbytes, calls, ceiling, replays))
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
                f"{r[f'{name}_bytes'] / 1e6:.1f}", fmt(us, ".2f"), fmt(r.get(f"{name}_gbps", nan), ".0f"),
                fmt(100 * r.get(f"{name}_frac_copy", nan), ".1f"),
                fmt(100 * r.get(f"{name}_frac_own_copy", nan), ".1f"))

    return results.markdown_table(columns, (cells(r, name) for r in rows for name in IMPLS))


def check_lines(rows: List[Dict[str, object]]) -> List[str]:
    """One line per row: its byte checks (and how much of FlashInfer's y differs from ours: a speed peer)."""
    lines = []
    for r in rows:
        parts = [f"{k} {results.yes_no(r.get(k))}" for k in required_checks(r)]
        if "flashinfer_y_differs_frac" in r:
            parts.append(f"FlashInfer's y differs from resnorm's in {100 * r['flashinfer_y_differs_frac']:.2f}% of "
                         "elements (a measurement, not a check)")
        lines.append(f"rows={r['rows']}: " + ("; ".join(parts) if parts else "nothing of this build's to check"))
    return lines


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Per-token modulation (temb.chunk(6, dim=2) views) against "
                                "FlashInfer's DiT LayerNorm kernel, built now from FlashInfer's header where "
                                "installed, else skipped (GPU only, D=3072). Writes bench_per_token.{csv,md}.")
    p.add_argument("--rows", type=harness.positive_int_list, default=None,
                   help="comma-separated row counts (default 256,4096,6889,16384)")
    p.add_argument("--replays", type=harness.positive_int, default=50, help="graph replays per median (default 50)")
    harness.add_out_argument(p)
    return p


def main(argv: Optional[Sequence[str]] = None, log: Callable[[str], None] = print) -> int:
    args = build_parser().parse_args(argv)
    if (rc := harness.refuse_without_gpu(PROG)) is not None:
        return rc
    header = harness.run_header()
    log("\n".join(header))
    ceiling, per_pair = timing.copy_ceiling_gbps()
    notes = [timing.ceiling_note(ceiling, per_pair)]
    ext, where = flashinfer_dit.load()
    if ext is None:
        notes.append(f"FlashInfer's DiT kernel skipped: {where}")
    else:
        notes.append(f"FlashInfer's DiT kernel (fused_dit_gate_residual_layernorm_scale_shift, BF16 output, zero "
                     f"fp32 biases): {where}")
        notes.append(flashinfer_dit.NUMERICS_NOTE)
    refusal = per_token_refusal(PerTokenInputs(17, DIM, 1))
    if refusal is not None:
        notes.append(f"{UNSUPPORTED} (the op refused gate/scale/shift [1, S, D] views: {refusal})")
    log("\n".join(notes))
    rows_out: List[Dict[str, object]] = []
    for m in args.rows or DEFAULT_ROWS:
        r = measure(m, ceiling, ext, refusal is None, replays=args.replays)
        rows_out.append(r)
        parts = [f"{n} {r[f'{n}_us']:.2f} us ({100 * r[f'{n}_frac_own_copy']:.1f}% of a copy of its bytes)"
                 for n in IMPLS if f"{n}_us" in r]
        log(f"per-token D={r['dim']} rows={m}: " + (", ".join(parts) if parts else "nothing to measure"))
    lines, checks = table_lines(rows_out), check_lines(rows_out)
    log("\n" + TITLE + "\n" + "\n".join(lines) + "\n\nbyte checks:\n" + "\n".join(checks))
    md = ["# bench_per_token", ""] + [f"- {h}" for h in header] + [f"- {n}" for n in notes] + ["", TITLE, ""] + \
        lines + ["", "Byte checks:", ""] + [f"- {c}" for c in checks]
    results.write_report(args.out, "bench_per_token", rows_out, md, CSV_FIELDS)
    return results.exit_status(byte_check_failures(rows_out), "a per-token byte check")


if __name__ == "__main__":
    sys.exit(main())

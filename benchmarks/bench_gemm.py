#!/usr/bin/env python
"""The NVFP4 GEMM paths against the BF16 GEMM of the same shape (docs/performance.md, "The NVFP4 GEMM").
GPU only.

    python benchmarks/bench_gemm.py --out DIR          # FC1 and FC2 of Qwen-Image at M = 256, 4096, 13778

:func:`qwen_resnorm_fp4.apply_nvfp4_gemm_prequantized` at Qwen-Image's FC1 (K = 3072, N = 12288) and FC2
(K = 12288, N = 3072) shapes, against ``torch.mm`` on bf16 and ``F.linear`` with the bias, in the same run. The
tensor-core path is timed with the weight dequantized per call and with the layer's cached bf16 weight; the
reference path at the first shape (every shape with ``--with-reference``); FlashInfer where it serves. Timing:
:func:`timing.flushed_per_call_us` (each call after a write larger than L2; CUDA events), the median of
``--reps``. Every shape checks that the dequantized bf16 operands equal the fp32 reference dequantization bit
for bit (exit status 1 otherwise) and prints the tensor-core output's relative error against the reference
path. Writes ``bench_gemm.{csv,md}``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from qwen_resnorm_fp4 import NVFP4Linear, apply_nvfp4_gemm_prequantized, nvfp4_quantize, reference
from qwen_resnorm_fp4.api import dequantize_to_bf16
from qwen_resnorm_fp4.gemm import flashinfer_serves

import harness
import results
import timing
from results import fmt

Tensor = torch.Tensor
PROG = "bench_gemm"

FC1 = (3072, 12288)  # (K, N)
FC2 = (12288, 3072)
DEFAULT_ROWS = (256, 4096, 13778)


def time_ms(fn: Callable[[], Any], reps: int, warmup: int, flush: Tensor) -> float:
    """Median GPU time of ``fn`` in ms (:func:`timing.flushed_per_call_us`)."""
    return timing.flushed_per_call_us(fn, reps, warmup, flush) / 1e3


def bench_gemm_shape(m: int, k: int, n: int, reps: int, warmup: int, with_reference: bool,
                     flush: Tensor) -> Dict[str, Any]:
    """One M x K x N shape: the NVFP4 paths and the BF16 GEMM, times in ms, and the operand check."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(m + k)
    lin = torch.nn.Linear(k, n, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g, device=dev) * k ** -0.5)
        lin.bias.copy_(torch.randn(n, generator=g, device=dev) * 0.1)
    x = torch.randn(m, k, generator=g, device=dev).bfloat16()
    layer = NVFP4Linear.from_linear(lin, x.float().abs().amax(), gemm_backend="tensor_core")
    packed, scales = nvfp4_quantize(x, layer.input_global_scale)

    # exactness of the operands: bf16 dequantization == the fp32 reference without global scale, bit for bit
    one = torch.ones(1, device=dev)
    exact = all(
        torch.equal(dequantize_to_bf16(p, s).float().view(torch.int32),
                    reference.dequantize_nvfp4(p, s, one, p.shape[0]).view(torch.int32))
        for p, s in ((packed, scales), (layer.weight_packed, layer.weight_scales)))

    def tc() -> Tensor:
        return apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="tensor_core")

    w_bf16 = lin.weight.detach()
    row: Dict[str, Any] = {"M": m, "K": k, "N": n}
    row["tensor_core_ms"] = time_ms(tc, reps, warmup, flush)
    row["bf16_mm_ms"] = time_ms(lambda: torch.mm(x, w_bf16.t()), reps, warmup, flush)
    row["bf16_linear_ms"] = time_ms(lambda: torch.nn.functional.linear(x, w_bf16, lin.bias), reps, warmup, flush)
    layer.cache_dequantized_weight = True
    row["tensor_core_cached_ms"] = time_ms(tc, reps, warmup, flush)
    out_tc = tc()
    layer.cache_dequantized_weight = False
    row["ratio"] = row["tensor_core_ms"] / row["bf16_mm_ms"]
    row["ratio_cached"] = row["tensor_core_cached_ms"] / row["bf16_mm_ms"]
    ref = apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, backend="reference")
    row["rel_err_vs_reference"] = ((out_tc.float() - ref).norm() / ref.norm()).item()
    del ref
    row["reference_ms"] = (time_ms(lambda: apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="reference"),
                                   max(3, reps // 5), 1, flush) if with_reference else None)
    row["flashinfer_ms"] = (time_ms(lambda: apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="auto"),
                                    reps, warmup, flush) if flashinfer_serves(dev) else None)
    row["operands_exact"] = exact
    return row


def gemm_table(rows: List[Dict[str, Any]]) -> List[str]:
    """The markdown table of the shapes: times, the ratios to the BF16 GEMM, the error and the operand check."""
    columns = ("M x K x N", "tensor_core ms", "tensor_core cached ms", "bf16 mm ms", "bf16 linear ms", "ratio",
               "ratio cached", "reference ms", "FlashInfer ms", "rel err vs reference", "operands exact")
    return results.markdown_table(columns, (
        (f"{r['M']} x {r['K']} x {r['N']}", fmt(r["tensor_core_ms"], ".3f"), fmt(r["tensor_core_cached_ms"], ".3f"),
         fmt(r["bf16_mm_ms"], ".3f"), fmt(r["bf16_linear_ms"], ".3f"),
         f"{r['ratio']:.2f}x", f"{r['ratio_cached']:.2f}x",
         fmt(r["reference_ms"], ".3f"), fmt(r["flashinfer_ms"], ".3f"), f"{r['rel_err_vs_reference']:.2e}",
         results.yes_no(r.get("operands_exact")))
        for r in rows))


def byte_check_failures(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """Every shape whose dequantized operands were not bit-exact (or not checked)."""
    return results.check_failures(rows, ["operands_exact"], lambda r: f"{r['M']} x {r['K']} x {r['N']}")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="NVFP4 GEMM paths against the BF16 GEMM (GPU only). "
                                "Writes bench_gemm.{csv,md}.")
    p.add_argument("--rows", type=harness.positive_int_list, default=None,
                   help="comma-separated M values (default 256,4096,13778)")
    p.add_argument("--reps", type=harness.positive_int, default=30, help="timed calls per case (median; default 30)")
    p.add_argument("--warmup", type=harness.positive_int, default=5, help="untimed calls first (default 5)")
    p.add_argument("--with-reference", action="store_true", help="time the reference path at every shape "
                   "(default: at the first shape only)")
    harness.add_out_argument(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if (rc := harness.refuse_without_gpu(PROG)) is not None:
        return rc
    header = harness.run_header() + [
        f"cold L2 (256 MiB written before each call), CUDA events, median of {args.reps}; bias in every NVFP4 call "
        "and in bf16 linear, none in bf16 mm; ratio = tensor_core / bf16 mm"]
    print("\n".join(header))
    flush = timing.l2_flush_buffer()
    rows = []
    for i, (k, n) in enumerate((FC1, FC2)):
        for j, m in enumerate(args.rows or DEFAULT_ROWS):
            rows.append(bench_gemm_shape(m, k, n, args.reps, args.warmup, args.with_reference or (i == 0 and j == 0),
                                         flush))
            torch.cuda.empty_cache()
    table = gemm_table(rows)
    print("\n".join(table))
    results.write_report(args.out, "bench_gemm", rows, ["# bench_gemm", ""] + [f"- {h}" for h in header] + [""] + table)
    return results.exit_status(byte_check_failures(rows), "dequantized operands not bit-exact")


if __name__ == "__main__":
    sys.exit(main())

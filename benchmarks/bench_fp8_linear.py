#!/usr/bin/env python
"""FP8Linear (E4M3, torch._scaled_mm) against a BF16 nn.Linear at Qwen-Image's block shapes (docs/performance.md,
"FP8"). GPU only; needs a build with FP8Linear.

    python benchmarks/bench_fp8_linear.py --out DIR     # QKV/out, FC1, FC2 at 4096, 6889 and 10209 tokens

At hidden width 3072: QKV / out (3072 -> 3072), FC1 (3072 -> 12288), FC2 (12288 -> 3072), each at M = 4096,
6889 and 10209 tokens, with bias (as the blocks' Linears have), in one run:

- bf16: ``torch.nn.functional.linear`` of the BF16 layer;
- fp8 (bf16 in): ``FP8Linear(x)`` on the BF16 activation, its input quantization (``fp8_quantize``) inside;
- fp8 (e4m3 in): ``FP8Linear(q)`` on the already-quantized activation (what ``resnorm_quant_fp8`` feeds FC1);
- fp8_quantize alone, the difference between the two.

The layer comes from :meth:`qwen_resnorm_fp4.FP8Linear.from_linear` (ModelOpt's per-tensor recipe; per output
channel with ``--per-channel``), input_scale from the case's own activation. Timing:
:func:`timing.flushed_per_call_us` (each call after a write larger than L2; CUDA events), the median of
``--reps``. Checks, each failing the run (exit status 1): the BF16-input and E4M3-input forms give the same
bytes; the output is within :data:`REL_ERR_BOUND` of the dequantized GEMM computed in float64 (relative
Frobenius error, printed). Writes ``bench_fp8_linear.{csv,md}``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

import harness
import results
import timing
from results import fmt

Tensor = torch.Tensor
PROG = "bench_fp8_linear"
#: (layer, K, N) of a Qwen-Image block at hidden width 3072.
SHAPES = (("qkv_out", 3072, 3072), ("fc1", 3072, 12288), ("fc2", 12288, 3072))
DEFAULT_TOKENS = (4096, 6889, 10209)
#: The largest relative error against the float64 dequantized GEMM: the bf16 output's rounding (~1e-3) plus
#: the fast accumulation's.
REL_ERR_BOUND = 4e-3


def time_ms(fn: Callable[[], Any], reps: int, warmup: int, flush: Tensor) -> float:
    """Median GPU time of ``fn`` in ms (:func:`timing.flushed_per_call_us`)."""
    return timing.flushed_per_call_us(fn, reps, warmup, flush) / 1e3


def dequantized_reference(layer: Any, q: Tensor) -> Tensor:
    """The dequantized GEMM of an FP8Linear in float64: (q @ W.T) * input_scale * weight_scale + bias, the E4M3
    values of ``q`` [M, K] and of the weight read exactly."""
    out = (q.double() @ layer.weight.double().t()) * layer.input_scale.double() * layer.weight_scale.double()
    return out if layer.bias is None else out + layer.bias.double()


def rel_err(out: Tensor, ref: Tensor) -> float:
    """||out - ref|| / ||ref|| (Frobenius, in float64)."""
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm()).item()


def bench_shape(name: str, m: int, k: int, n: int, reps: int, warmup: int, per_channel: bool, use_fast_accum: bool,
                flush: Tensor) -> Dict[str, Any]:
    """One layer at M rows: the BF16 Linear, FP8Linear on BF16 and on E4M3 input, fp8_quantize alone (ms), and
    the checks."""
    from qwen_resnorm_fp4 import FP8Linear, fp8_quantize

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(m + k + n)
    lin = torch.nn.Linear(k, n, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g, device=dev) * k ** -0.5)
        lin.bias.copy_(torch.randn(n, generator=g, device=dev) * 0.1)
    x = torch.randn(m, k, generator=g, device=dev).bfloat16()
    layer = FP8Linear.from_linear(lin, x.float().abs().amax(), per_channel=per_channel, use_fast_accum=use_fast_accum)
    q = fp8_quantize(x, layer.input_scale)
    w, b = lin.weight.detach(), lin.bias.detach()

    row: Dict[str, Any] = {"layer": name, "M": m, "K": k, "N": n, "per_channel": per_channel,
                           "use_fast_accum": use_fast_accum}
    with torch.inference_mode():
        row["bf16_ms"] = time_ms(lambda: torch.nn.functional.linear(x, w, b), reps, warmup, flush)
        row["fp8_ms"] = time_ms(lambda: layer(x), reps, warmup, flush)
        row["fp8_prequantized_ms"] = time_ms(lambda: layer(q), reps, warmup, flush)
        row["quantize_ms"] = time_ms(lambda: fp8_quantize(x, layer.input_scale), reps, warmup, flush)
        out_bf16_in, out_fp8_in = layer(x), layer(q)
        bf16_out = torch.nn.functional.linear(x, w, b)
    row["ratio"] = row["fp8_ms"] / row["bf16_ms"]
    row["ratio_prequantized"] = row["fp8_prequantized_ms"] / row["bf16_ms"]
    row["forms_equal"] = results.outputs_equal(out_bf16_in, out_fp8_in)
    ref = dequantized_reference(layer, q)
    row["rel_err_vs_reference"] = rel_err(out_fp8_in, ref)
    row["close_to_reference"] = row["rel_err_vs_reference"] <= REL_ERR_BOUND
    row["rel_err_vs_bf16"] = rel_err(out_fp8_in, bf16_out)
    return row


def table_lines(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """The markdown table, one line per layer and M."""
    columns = ("layer", "M x K x N", "bf16 ms", "fp8 (bf16 in) ms", "x bf16", "fp8 (e4m3 in) ms", "x bf16",
               "fp8_quantize ms", "rel err vs dequantized", "rel err vs bf16", "forms equal")
    return results.markdown_table(columns, (
        (r["layer"], f"{r['M']} x {r['K']} x {r['N']}", fmt(r["bf16_ms"], ".3f"), fmt(r["fp8_ms"], ".3f"),
         f"{r['ratio']:.2f}x", fmt(r["fp8_prequantized_ms"], ".3f"), f"{r['ratio_prequantized']:.2f}x",
         fmt(r["quantize_ms"], ".3f"), f"{r['rel_err_vs_reference']:.2e}", f"{r['rel_err_vs_bf16']:.2e}",
         results.yes_no(r.get("forms_equal")))
        for r in rows))


def byte_check_failures(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """Every case whose two input forms differed, or whose output was not within :data:`REL_ERR_BOUND` of the
    dequantized reference (or either check not made)."""
    return results.check_failures(rows, ["forms_equal", "close_to_reference"],
                                  lambda r: f"{r['layer']} {r['M']} x {r['K']} x {r['N']}")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="FP8Linear (torch._scaled_mm) against a BF16 nn.Linear at "
                                "Qwen-Image's block shapes (GPU only). Writes bench_fp8_linear.{csv,md}.")
    p.add_argument("--tokens", type=harness.positive_int_list, default=None,
                   help="comma-separated M values (default 4096,6889,10209)")
    p.add_argument("--reps", type=harness.positive_int, default=30, help="timed calls per case (median; default 30)")
    p.add_argument("--warmup", type=harness.positive_int, default=5, help="untimed calls first (default 5)")
    p.add_argument("--per-channel", action="store_true", help="per-output-channel weight scales (row-wise "
                   "torch._scaled_mm) instead of ModelOpt's per-tensor scale")
    p.add_argument("--no-fast-accum", action="store_true", help="torch._scaled_mm with use_fast_accum=False")
    harness.add_out_argument(p)
    return p


def fp8_linear_missing() -> Optional[str]:
    """Why this build cannot run the benchmark (no FP8Linear), or None."""
    import qwen_resnorm_fp4

    return None if hasattr(qwen_resnorm_fp4, "FP8Linear") else "this build of qwen_resnorm_fp4 has no FP8Linear"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if (rc := harness.refuse_without_gpu(PROG)) is not None:
        return rc
    if (reason := fp8_linear_missing()) is not None:
        print(f"{PROG}: {reason}; nothing to measure.", file=sys.stderr)
        return 2
    fast_accum = not args.no_fast_accum
    header = harness.run_header() + [
        f"cold L2 (256 MiB written before each call), CUDA events, median of {args.reps}; bias in every call; "
        f"weight scale {'per output channel' if args.per_channel else 'per tensor'}, use_fast_accum={fast_accum}; "
        "x bf16 = fp8 time / bf16 F.linear time; rel err of the e4m3-input output"]
    print("\n".join(header))
    flush = timing.l2_flush_buffer()
    rows = []
    for name, k, n in SHAPES:
        for m in args.tokens or DEFAULT_TOKENS:
            r = bench_shape(name, m, k, n, args.reps, args.warmup, args.per_channel, fast_accum, flush)
            rows.append(r)
            print(f"{name} {m} x {k} x {n}: bf16 {r['bf16_ms']:.3f} ms, fp8 {r['fp8_ms']:.3f} ms ({r['ratio']:.2f}x), "
                  f"e4m3 in {r['fp8_prequantized_ms']:.3f} ms ({r['ratio_prequantized']:.2f}x), rel err vs "
                  f"dequantized {r['rel_err_vs_reference']:.2e}, forms equal {r['forms_equal']}", flush=True)
            torch.cuda.empty_cache()
    table = table_lines(rows)
    print("\n".join(table))
    results.write_report(args.out, PROG, rows, [f"# {PROG}", ""] + [f"- {h}" for h in header] + [""] + table)
    return results.exit_status(byte_check_failures(rows), "FP8Linear: input forms differ or output not close to "
                               "the dequantized reference")


if __name__ == "__main__":
    sys.exit(main())

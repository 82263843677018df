#!/usr/bin/env python
"""A GEMM then the fused op, with programmatic dependent launch (PDL) on and off (docs/performance.md,
"Programmatic dependent launch"). GPU only.

    python benchmarks/bench_pdl.py --out DIR            # rows 256, 4096, 6889 at D = 3072

The sequence of a DiT block: the attention output projection writes x, the fused op reads it. Each pair is
``torch.mm(a, W^T, out=x)`` (bf16 [M, D] x [D, D]) then ``torch.ops.qwen_fp4.resnorm_quant`` on that x; a
graph holds one pair per input set (enough sets to exceed twice the L2), captured once with PDL on
and once off (qwen_resnorm_fp4.set_launch_options; a capture keeps the options in force), replayed in turns
(:func:`timing.replay_in_turns_us`). Reported: time per pair for each, the difference, and the GEMM alone
and the fused op alone (back to back, PDL on and off) the same way. The pair's bytes must be equal with PDL
on and off (exit status 1 otherwise). Writes ``bench_pdl.{csv,md}``.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import torch
from qwen_resnorm_fp4 import set_launch_options
from qwen_resnorm_fp4.env import default_fast_math

import harness
import results
import timing
from harness import EPS, bytes_moved
from results import fmt

DEFAULT_ROWS = (256, 4096, 6889)
DIM = 3072
PROG = "bench_pdl"
CSV_FIELDS = ["dim", "rows", "calls", "pair_pdl_us", "pair_no_pdl_us", "pdl_saves_us", "pdl_saves_frac",
              "gemm_us", "op_pdl_us", "op_no_pdl_us", "byte_exact"]
TITLE = ("GEMM -> fused op under CUDA-graph replay, programmatic dependent launch on and off (GPU time per pair; "
         "the GEMM: torch.mm of bf16 [M, D] x [D, D]^T into x, the fused op's input):")


@contextmanager
def pdl_setting(on: bool) -> Iterator[None]:
    """PDL on or off for the block (qwen_resnorm_fp4.set_launch_options; a graph captured inside keeps the
    setting), then the previous launch options back."""
    before = set_launch_options(pdl=on)
    try:
        yield
    finally:
        set_launch_options(*before)


class SequenceInputs:
    """``calls`` input sets of the pair: GEMM input a [M, D], its output x [M, D] (the fused op's x), residual
    [1, M, D]; one weight [D, D], gate/scale/shift [1, D] and global scale for all."""

    def __init__(self, rows: int, dim: int, calls: int, seed: int = 3) -> None:
        gen = torch.Generator(device="cuda").manual_seed(seed + rows)
        opts = dict(device="cuda", generator=gen)
        bf = torch.bfloat16
        self.rows, self.dim = rows, dim
        self.weight = (torch.randn(dim, dim, **opts) * dim ** -0.5).to(bf)
        self.a = [torch.randn(rows, dim, **opts).to(bf) for _ in range(calls)]
        self.x = [torch.empty(rows, dim, device="cuda", dtype=bf) for _ in range(calls)]
        self.residual = [(torch.randn(1, rows, dim, **opts) * 2).to(bf) for _ in range(calls)]
        self.gate = (torch.randn(1, dim, **opts) * 0.5).to(bf)
        self.scale = (torch.randn(1, dim, **opts) * 0.1).to(bf)
        self.shift = (torch.randn(1, dim, **opts) * 0.1).to(bf)
        self.gemm(0)
        y, _ = torch.ops.qwen_fp4.resnorm(self.residual[0], self.x[0].view(1, rows, dim), None, self.gate,
                                          self.scale, self.shift, EPS)
        self.global_scale = harness.global_scale_for(y)
        self.fast_math = default_fast_math()

    def gemm(self, i: int) -> torch.Tensor:
        return torch.mm(self.a[i], self.weight.t(), out=self.x[i])

    def op(self, i: int):
        return torch.ops.qwen_fp4.resnorm_quant(self.residual[i], self.x[i].view(1, self.rows, self.dim), None,
                                                self.gate, self.scale, self.shift, self.global_scale, EPS,
                                                self.fast_math)

    def pair(self, i: int):
        self.gemm(i)
        return self.op(i)


def pair_bytes(rows: int, dim: int) -> int:
    """Bytes of one pair's input set: the GEMM's a and x, then the fused op's traffic."""
    return bytes_moved(rows, dim) + 2 * rows * dim * 2


def measure(rows: int, dim: int = DIM, replays: int = 50) -> Dict[str, object]:
    """One row count: the pair and its parts by graph replay, PDL on and off (see the module docstring)."""
    calls = timing.sets_for_cold_l2(pair_bytes(rows, dim), timing.l2_bytes(), minimum=timing.GRAPH_CALLS)
    inp = SequenceInputs(rows, dim, calls)
    outputs = {}
    for on in (True, False):
        with pdl_setting(on):
            outputs[on] = inp.pair(0)
            torch.cuda.synchronize()
    exact = results.outputs_equal(outputs[True], outputs[False])
    del outputs
    graphs: Dict[str, torch.cuda.CUDAGraph] = {}
    for on in (True, False):
        with pdl_setting(on):
            graphs[f"pair_{on}"] = timing.capture_calls(inp.pair, calls)
            graphs[f"op_{on}"] = timing.capture_calls(inp.op, calls)
    graphs["gemm"] = timing.capture_calls(inp.gemm, calls)
    us = timing.replay_in_turns_us(graphs, calls, replays)
    del graphs
    on, off = us["pair_True"], us["pair_False"]
    row = {"dim": dim, "rows": rows, "calls": calls, "pair_pdl_us": on, "pair_no_pdl_us": off,
           "pdl_saves_us": off - on, "pdl_saves_frac": (off - on) / off, "gemm_us": us["gemm"],
           "op_pdl_us": us["op_True"], "op_no_pdl_us": us["op_False"], "byte_exact": exact}
    del inp
    torch.cuda.empty_cache()
    return row


def table_lines(rows: List[Dict[str, object]]) -> List[str]:
    columns = ("D", "rows", "pairs (input sets)", "GEMM -> fused, PDL on, us", "PDL off, us", "PDL saves, us",
               "saves, %", "GEMM alone us", "fused alone, PDL on, us", "fused alone, PDL off, us", "same bytes on/off")
    return results.markdown_table(columns, (
        (r["dim"], r["rows"], r["calls"], fmt(r["pair_pdl_us"], ".2f"), fmt(r["pair_no_pdl_us"], ".2f"),
         fmt(r["pdl_saves_us"], ".2f"), fmt(100 * r["pdl_saves_frac"], ".1f"), fmt(r["gemm_us"], ".2f"),
         fmt(r["op_pdl_us"], ".2f"), fmt(r["op_no_pdl_us"], ".2f"), results.yes_no(r.get("byte_exact")))
        for r in rows))


def byte_check_failures(rows: Sequence[Dict[str, object]]) -> List[str]:
    """Every row count whose PDL-on and PDL-off bytes differed or were not compared."""
    return results.check_failures(rows, ["byte_exact"], lambda r: f"D={r['dim']} rows={r['rows']}")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="A GEMM -> fused op pair under CUDA-graph replay with "
                                "programmatic dependent launch on and off (GPU only). Writes bench_pdl.{csv,md}.")
    p.add_argument("--rows", type=harness.positive_int_list, default=None,
                   help="comma-separated row counts (default 256,4096,6889)")
    p.add_argument("--replays", type=harness.positive_int, default=50, help="graph replays per median (default 50)")
    harness.add_out_argument(p)
    return p


def main(argv: Optional[Sequence[str]] = None, log: Callable[[str], None] = print) -> int:
    args = build_parser().parse_args(argv)
    if (rc := harness.refuse_without_gpu(PROG)) is not None:
        return rc
    header = harness.run_header()
    log("\n".join(header))
    rows_out = []
    for m in args.rows or DEFAULT_ROWS:
        r = measure(m, replays=args.replays)
        rows_out.append(r)
        log(f"GEMM -> fused op, D={r['dim']} rows={m}: PDL on {r['pair_pdl_us']:.2f} us, off "
            f"{r['pair_no_pdl_us']:.2f} us per pair (PDL saves {r['pdl_saves_us']:.2f} us, "
            f"{100 * r['pdl_saves_frac']:.1f}%); GEMM alone {r['gemm_us']:.2f} us, fused alone {r['op_pdl_us']:.2f} "
            f"/ {r['op_no_pdl_us']:.2f} us (PDL on / off); same bytes on and off: {r['byte_exact']}")
    lines = table_lines(rows_out)
    log("\n" + TITLE + "\n" + "\n".join(lines))
    results.write_report(args.out, "bench_pdl", rows_out,
                         ["# bench_pdl", ""] + [f"- {h}" for h in header] + ["", TITLE, ""] + lines, CSV_FIELDS)
    return results.exit_status(byte_check_failures(rows_out), "the pair's bytes differ with PDL on and off")


if __name__ == "__main__":
    sys.exit(main())

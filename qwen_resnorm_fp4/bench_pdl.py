"""The benchmark's PDL section (``python -m qwen_resnorm_fp4 bench --pdl-sequence``): a GEMM and then the
fused op, the sequence of a DiT block (the attention output projection writes x, the fused op reads it), at
a few row counts (D = 3072), under CUDA-graph replay, with programmatic dependent launch on and off.

Each pair is ``torch.mm(a, W^T, out=x)`` (bf16 [M, D] x [D, D], the projection's GEMM) then
``torch.ops.qwen_fp4.resnorm_quant`` on that x; a graph holds one pair per input set (enough sets to exceed
twice the L2), captured once with PDL on and once off (set_launch_options; the graph keeps what was in force at
capture), replayed in turns. Reported: time per pair for each, the difference, and the GEMM alone and the
fused op alone (back to back, PDL on and off) in the same way. The pair's bytes are checked equal with PDL
on and off.
"""

from __future__ import annotations

import math
import statistics
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Tuple

import torch

from .bench import (EPS, GRAPH_CALLS, _f, _fast_math, bytes_moved, capture_calls, l2_bytes, markdown_table,
                    outputs_equal, replay_once_us)
from .launch import set_launch_options
from .linear import FP4_AMAX_SCALE

DEFAULT_ROWS = (256, 4096, 6889)
DIM = 3072
CSV_FIELDS = ["dim", "rows", "calls", "pair_pdl_us", "pair_no_pdl_us", "pdl_saves_us", "pdl_saves_frac",
              "gemm_us", "op_pdl_us", "op_no_pdl_us", "byte_exact"]
TITLE = ("GEMM -> fused op under CUDA-graph replay, programmatic dependent launch on and off (GPU time per pair; "
         "the GEMM: torch.mm of bf16 [M, D] x [D, D]^T into x, the fused op's input):")


@contextmanager
def pdl_setting(on: bool) -> Iterator[None]:
    """PDL on or off for the block (qwen_resnorm_fp4.set_launch_options; a capture keeps what was in force),
    then the previous launch options back."""
    before = set_launch_options(pdl=on)
    try:
        yield
    finally:
        set_launch_options(*before)


class SequenceInputs:
    """`calls` input sets of the pair: GEMM input a [M, D], its output x [M, D] (the fused op's x), residual
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
        self.global_scale = (FP4_AMAX_SCALE / y.float().abs().amax().clamp(min=1e-12)).reshape(1).float()
        self.fast_math = _fast_math()

    def gemm(self, i: int) -> torch.Tensor:
        return torch.mm(self.a[i], self.weight.t(), out=self.x[i])

    def op(self, i: int):
        return torch.ops.qwen_fp4.resnorm_quant(self.residual[i], self.x[i].view(1, self.rows, self.dim), None,
                                                self.gate, self.scale, self.shift, self.global_scale, EPS,
                                                self.fast_math)

    def pair(self, i: int):
        self.gemm(i)
        return self.op(i)


def calls_for(rows: int, dim: int, l2: int, cap: int = 2048) -> int:
    """Pairs (one input set each) in a graph: at least GRAPH_CALLS, and enough that the sets (the GEMM's a
    and x, then the fused op's traffic) span more than twice the L2."""
    per_pair = bytes_moved(rows, dim) + 2 * rows * dim * 2
    return int(min(max(GRAPH_CALLS, math.ceil(2 * l2 / per_pair)), cap))


def replay_in_turns(graphs: Dict[str, "torch.cuda.CUDAGraph"], replays: int) -> Dict[str, float]:
    """Median GPU time (us) of one replay of each graph, the graphs replayed in turns so that a drift of the
    GPU's clocks moves them alike."""
    samples: Dict[str, List[float]] = {name: [] for name in graphs}
    for _ in range(replays):
        for name, graph in graphs.items():
            samples[name].append(replay_once_us(graph))
    return {name: statistics.median(v) for name, v in samples.items()}


def measure(rows: int, dim: int = DIM, replays: int = 50) -> Dict[str, object]:
    """One row count: the pair and its parts by graph replay, PDL on and off (see the module docstring)."""
    calls = calls_for(rows, dim, l2_bytes())
    inp = SequenceInputs(rows, dim, calls)
    outputs = {}
    for on in (True, False):
        with pdl_setting(on):
            outputs[on] = inp.pair(0)
            torch.cuda.synchronize()
    exact = outputs_equal(outputs[True], outputs[False])
    del outputs
    graphs: Dict[str, torch.cuda.CUDAGraph] = {}
    for on in (True, False):
        with pdl_setting(on):
            graphs[f"pair_{on}"] = capture_calls(inp.pair, calls)
            graphs[f"op_{on}"] = capture_calls(inp.op, calls)
    graphs["gemm"] = capture_calls(inp.gemm, calls)
    us = {name: t / calls for name, t in replay_in_turns(graphs, replays).items()}
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
    return markdown_table(columns, (
        (r["dim"], r["rows"], r["calls"], _f(r["pair_pdl_us"], ".2f"), _f(r["pair_no_pdl_us"], ".2f"),
         _f(r["pdl_saves_us"], ".2f"), _f(100 * r["pdl_saves_frac"], ".1f"), _f(r["gemm_us"], ".2f"),
         _f(r["op_pdl_us"], ".2f"), _f(r["op_no_pdl_us"], ".2f"), "yes" if r["byte_exact"] else "NO")
        for r in rows))


def run(rows_list: Tuple[int, ...] = DEFAULT_ROWS, log: Callable[[str], None] = print) -> List[Dict[str, object]]:
    """Every row count of the section, logged as it goes."""
    results = []
    for m in rows_list:
        r = measure(m)
        results.append(r)
        log(f"GEMM -> fused op, D={r['dim']} rows={m}: PDL on {r['pair_pdl_us']:.2f} us, off "
            f"{r['pair_no_pdl_us']:.2f} us per pair (PDL saves {r['pdl_saves_us']:.2f} us, "
            f"{100 * r['pdl_saves_frac']:.1f}%); GEMM alone {r['gemm_us']:.2f} us, fused alone {r['op_pdl_us']:.2f} "
            f"/ {r['op_no_pdl_us']:.2f} us (PDL on / off); same bytes on and off: {r['byte_exact']}")
    return results

#!/usr/bin/env python
"""The fused op against its peers and the copy ceiling (docs/performance.md, "The fused op"). GPU only.

    python benchmarks/bench_fused.py --out DIR      # D = 3072 and 5120, 9 row counts
    python benchmarks/bench_fused.py --quick        # 4 row counts at D = 3072

For every (D, rows) case, in one run on one GPU:

- fused: ``torch.ops.qwen_fp4.resnorm_quant`` (gate/scale/shift [1, D] bf16, no bias);
- unfused: ``torch.ops.qwen_fp4.resnorm`` then ``torch.ops.qwen_fp4.nvfp4_quantize`` (the same numerics in
  two kernels with a BF16 intermediate), and each of the two alone;
- eager: a plain PyTorch chain (gated residual, fp32 LayerNorm, modulation, NVFP4 quantization in torch ops,
  the 128x4 swizzle by index_put): a *speed peer*, close to but not byte-exact with the contract;
- compiled: ``torch.compile`` of that chain (compile time excluded);
- a device-to-device copy of the case's bytes, timed the same way; the copy ceiling (1 GiB copies).

Per call (:class:`timing.EventTimer`: events, queue pre-filled, cold L2 by rotating input sets), and by
CUDA-graph replay (:func:`timing.graph_per_call_us`, every case and 17 rows always). Host overhead per call of
the wrapper, the raw op and the fused path (:func:`timing.host_us_per_call`). Prints the measurements (times,
GB/s, share of the copy ceiling, ratios to the peers of the same run); the goals they are read against are
stated in docs/performance.md. Fused == unfused byte for byte is checked on every case, per-call and graph
inputs both; any difference fails the run (exit status 1). Writes ``bench_fused.{csv,md,png}``.
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from qwen_resnorm_fp4.constants import E2M1_MAX, E2M1_VALUES, E4M3_MAX
from qwen_resnorm_fp4.env import default_fast_math
from qwen_resnorm_fp4.layout import scales_bytes, scales_shape, sf_offsets
from qwen_resnorm_fp4.validation import WIDTH_RULE, is_supported_width

import harness
import results
import timing
from harness import EPS, bytes_moved
from results import fmt

DEFAULT_ROWS = (17, 256, 1024, 4096, 4608, 6889, 8192, 16384, 32768)
DEFAULT_DIMS = (3072, 5120)
QUICK_ROWS = (17, 256, 4096, 16384)
QUICK_DIMS = (3072,)
#: Rows always measured by graph replay, whatever --rows says.
GRAPH_ROWS = (17,)
#: D of the host-overhead cases.
HOST_DIM = 3072
PROG = "bench_fused"

EAGER_NOTE = ("eager / compiled = a plain PyTorch chain (gated residual, fp32 LayerNorm, modulation, NVFP4 "
              "quantization in torch ops, 128x4 swizzle by index_put): a speed peer, close to but not "
              "byte-exact with the contract. Byte-exactness is checked for fused vs unfused in every case.")


# ----------------------------------------------------------------------------------------------------
# The eager PyTorch chain (speed peer)
# ----------------------------------------------------------------------------------------------------


def e2m1_bounds() -> Tuple[float, ...]:
    """The E2M1 rounding thresholds (midpoints of consecutive magnitudes; ties aside)."""
    return tuple((a + b) / 2 for a, b in zip(E2M1_VALUES, E2M1_VALUES[1:]))


def sf_index(rows: int, dim: int, device) -> torch.Tensor:
    """Flat byte offsets (int64, row-major [rows, D/16]) of the block scales in the 128x4 layout."""
    return sf_offsets(rows, dim, device).reshape(-1)


def eager_chain(residual: torch.Tensor, x: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor,
                shift: torch.Tensor, global_scale: torch.Tensor, index: torch.Tensor, bounds: torch.Tensor,
                eps: float = EPS):
    """Plain PyTorch: x, residual [B, S, D] bf16; gate/scale/shift [B, D]; returns (packed, scales, r)."""
    b, s, d = x.shape
    rows = b * s
    g = global_scale.reshape(())
    r = (x.float() * gate.float().unsqueeze(1) + residual.float()).to(torch.bfloat16)
    n = torch.nn.functional.layer_norm(r.float(), (d,), eps=eps)
    y = (n * (1 + scale.float().unsqueeze(1)) + shift.float().unsqueeze(1)).to(torch.bfloat16)
    blocks = y.float().reshape(rows, d // 16, 16)
    amax = blocks.abs().amax(-1)
    sf = (amax * (g * (1.0 / E2M1_MAX))).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    sf_f = sf.float()
    out_scale = torch.where(sf_f != 0, torch.reciprocal(sf_f * torch.reciprocal(g)), torch.zeros_like(sf_f))
    v = blocks * out_scale.unsqueeze(-1)
    code = torch.bucketize(v.abs(), bounds).to(torch.uint8) | (torch.signbit(v).to(torch.uint8) << 3)
    code = code.reshape(rows, d)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    scales = torch.zeros(scales_bytes(rows, d), dtype=torch.uint8, device=x.device)
    scales.index_put_((index,), sf.view(torch.uint8).reshape(-1))
    return packed, scales.reshape(scales_shape(rows, d)), r


# ----------------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------------


class Inputs:
    """n_sets rotating (residual, x) sets [1, rows, D] bf16, shared gate/scale/shift [1, D], global scale."""

    def __init__(self, rows: int, dim: int, n_sets: int, seed: int = 0) -> None:
        gen = torch.Generator(device="cuda").manual_seed(seed + rows * 7 + dim)
        opts = dict(device="cuda", generator=gen)
        self.rows, self.dim, self.n_sets = rows, dim, n_sets
        self.residual = [torch.randn(1, rows, dim, **opts).to(torch.bfloat16) for _ in range(n_sets)]
        self.x = [torch.randn(1, rows, dim, **opts).to(torch.bfloat16) for _ in range(n_sets)]
        self.gate = (torch.randn(1, dim, **opts) * 0.5).to(torch.bfloat16)
        self.scale = (torch.randn(1, dim, **opts) * 0.1).to(torch.bfloat16)
        self.shift = (torch.randn(1, dim, **opts) * 0.1).to(torch.bfloat16)
        y, _ = torch.ops.qwen_fp4.resnorm(self.residual[0], self.x[0], None, self.gate, self.scale, self.shift, EPS)
        self.global_scale = harness.global_scale_for(y)
        self.index = sf_index(rows, dim, "cuda")
        self.bounds = torch.tensor(e2m1_bounds(), dtype=torch.float32, device="cuda")


def make_impls(inp: Inputs, fm: bool, compiled_fn: Optional[Callable]) -> Dict[str, timing.Fn]:
    """The implementations of one case as ``fn(i)`` over its input sets. "quantize" needs each set's y made
    first (:func:`prepare_quantize_inputs`)."""
    ops = torch.ops.qwen_fp4
    gate, scale, shift, gs = inp.gate, inp.scale, inp.shift, inp.global_scale

    def fused(i):
        return ops.resnorm_quant(inp.residual[i], inp.x[i], None, gate, scale, shift, gs, EPS, fm)

    def resnorm(i):
        return ops.resnorm(inp.residual[i], inp.x[i], None, gate, scale, shift, EPS)

    def unfused(i):
        y, r = resnorm(i)
        packed, scales = ops.nvfp4_quantize(y, gs, fm)
        return packed, scales, r

    def eager(i):
        return eager_chain(inp.residual[i], inp.x[i], gate, scale, shift, gs, inp.index, inp.bounds)

    ys: Dict[int, torch.Tensor] = {}

    def quantize(i):  # the second kernel of the pair alone, on y of set i (made untimed)
        if i not in ys:
            ys[i] = resnorm(i)[0]
        return ops.nvfp4_quantize(ys[i], gs, fm)

    impls = {"fused": fused, "unfused": unfused, "eager": eager, "resnorm": resnorm, "quantize": quantize}
    if compiled_fn is not None:
        impls["compiled"] = lambda i: compiled_fn(inp.residual[i], inp.x[i], gate, scale, shift, gs, inp.index,
                                                  inp.bounds)
    return impls


def prepare_quantize_inputs(impls: Dict[str, timing.Fn], n_sets: int) -> None:
    """Make every y of the quantize-only timing before anything is timed or captured."""
    for i in range(n_sets):
        impls["quantize"](i)
    torch.cuda.synchronize()


def fused_equals_unfused(impls: Dict[str, timing.Fn], i: int = 0) -> bool:
    """Whether the fused op and the unfused pair write the same bytes on input set ``i``."""
    exact = results.outputs_equal(impls["fused"](i), impls["unfused"](i))
    torch.cuda.synchronize()
    return exact


def run_case(rows: int, dim: int, timer: timing.EventTimer, l2: int, ceiling: float,
             compiled_fn: Optional[Callable], max_reps: int, budget_s: float, log=print) -> Dict[str, object]:
    """One (D, rows) case per call: every implementation, a copy of the same bytes, the byte check."""
    fm = default_fast_math()
    nbytes = bytes_moved(rows, dim)
    n_sets = timing.sets_for_cold_l2(nbytes, l2)
    inp = Inputs(rows, dim, n_sets)
    row: Dict[str, object] = {"dim": dim, "rows": rows, "bytes": nbytes, "n_sets": n_sets}
    impls = make_impls(inp, fm, compiled_fn)
    row["byte_exact"] = fused_equals_unfused(impls)

    if "compiled" in impls:  # compile time (first call for this shape), excluded from the timing
        from torch._dynamo.exc import TorchDynamoException

        t0 = time.perf_counter()
        try:
            impls["compiled"](0)
            torch.cuda.synchronize()
            row["compile_s"] = time.perf_counter() - t0
        except TorchDynamoException as exc:  # a peer that fails to compile is reported, not fatal
            log(f"  torch.compile failed at rows={rows} D={dim} (the compiled peer is skipped for this D): "
                f"{type(exc).__name__}: {str(exc)[:300]}")
            del impls["compiled"]
            row["compile_s"] = float("nan")
            row["compile_failed"] = True

    prepare_quantize_inputs(impls, n_sets)
    for name in ("fused", "unfused", "resnorm", "quantize", "eager", "compiled"):
        fn = impls.get(name)
        if fn is None:
            row[f"{name}_us"] = row[f"{name}_gbps"] = float("nan")
            continue
        us, reps = timer.adaptive_per_call_us(fn, n_sets, max_reps, budget_s)
        row.update({f"{name}_us": us, f"{name}_gbps": timing.gbps(nbytes, us), f"{name}_reps": reps})
    row["fused_frac_copy"] = row["fused_gbps"] / ceiling
    copy_fn, copied = timing.same_bytes_copy(nbytes, n_sets)
    us, _ = timer.adaptive_per_call_us(copy_fn, n_sets, max_reps, budget_s)
    row["copy_same_bytes_us"] = us
    row["copy_same_bytes_frac"] = timing.gbps(copied, us) / ceiling
    del copy_fn
    for peer in ("unfused", "eager", "compiled"):
        row[f"speedup_vs_{peer}"] = row[f"{peer}_us"] / row["fused_us"]
    del impls, inp
    torch.cuda.empty_cache()
    return row


def graph_case(rows: int, dim: int, l2: int, replays: int = 50) -> Dict[str, object]:
    """One (D, rows) case by CUDA-graph replay, one call per input set (enough sets for a cold L2, at least
    :data:`timing.GRAPH_CALLS`): GPU time per call of the fused op, the pair, its two kernels alone and a copy
    of the same bytes; and the byte check on these inputs."""
    fm = default_fast_math()
    nbytes = bytes_moved(rows, dim)
    calls = timing.sets_for_cold_l2(nbytes, l2, minimum=timing.GRAPH_CALLS)
    inp = Inputs(rows, dim, calls, seed=1)
    impls = make_impls(inp, fm, None)
    out: Dict[str, object] = {"dim": dim, "rows": rows, "calls": calls, "byte_exact": fused_equals_unfused(impls)}
    prepare_quantize_inputs(impls, calls)
    impls["copy"], copied = timing.same_bytes_copy(nbytes, calls)
    for name in ("fused", "unfused", "resnorm", "quantize", "copy"):
        out[name] = timing.graph_per_call_us(impls[name], calls, replays)
    out["copy_bytes"] = copied
    del impls, inp
    torch.cuda.empty_cache()
    return out


def host_overhead_cases() -> Dict[str, Callable[[], object]]:
    """The host-overhead cases on a tiny shape (1 x 3072), as calls without arguments: the Python wrapper,
    the raw op, the fused path the model integrations call (try_fused_resnorm_quant), and as a peer one
    PyTorch op with one kernel launch on the same x (torch.nn.functional.layer_norm)."""
    import qwen_resnorm_fp4 as q

    fm = default_fast_math()
    inp = Inputs(1, HOST_DIM, 1, seed=2)
    args = (inp.residual[0], inp.x[0], None, inp.gate, inp.scale, inp.shift, inp.global_scale)
    fc1 = types.SimpleNamespace(in_features=HOST_DIM, input_global_scale=inp.global_scale)
    return {
        "wrapper": lambda: q.resnorm_quant(*args),
        "raw_op": lambda: torch.ops.qwen_fp4.resnorm_quant(*args, EPS, fm),
        "fused_path": lambda: q.try_fused_resnorm_quant(inp.residual[0], inp.x[0], inp.gate, inp.scale, inp.shift,
                                                        fc1, eps=EPS),
        "layer_norm": lambda: torch.nn.functional.layer_norm(inp.x[0], (HOST_DIM,), eps=EPS),
    }


# ----------------------------------------------------------------------------------------------------
# Reporting and the byte check
# ----------------------------------------------------------------------------------------------------

CSV_FIELDS = ["dim", "rows", "bytes", "n_sets", "fused_us", "fused_gbps", "fused_frac_copy", "unfused_us",
              "unfused_gbps", "eager_us", "eager_gbps", "compiled_us", "compiled_gbps", "speedup_vs_unfused",
              "speedup_vs_eager", "speedup_vs_compiled", "byte_exact", "compile_s", "fused_reps", "unfused_reps",
              "eager_reps", "compiled_reps", "copy_same_bytes_us", "copy_same_bytes_frac", "resnorm_us",
              "quantize_us", "graph_fused_us", "graph_unfused_us", "graph_speedup_vs_unfused", "graph_calls",
              "graph_fused_frac_copy", "graph_copy_same_bytes_us", "graph_copy_same_bytes_frac", "graph_resnorm_us",
              "graph_quantize_us", "graph_byte_exact"]

GRAPH_TABLE_TITLE = "CUDA-graph replay, GPU time per call (one call per input set, no event records between calls):"


def merge_graph(row: Dict[str, object], g: Dict[str, object], ceiling: float) -> None:
    """Add a case's graph-replay figures (:func:`graph_case`) to its per-call row."""
    row.update(graph_fused_us=g["fused"], graph_unfused_us=g["unfused"],
               graph_speedup_vs_unfused=g["unfused"] / g["fused"], graph_calls=g["calls"],
               graph_fused_frac_copy=timing.gbps(row["bytes"], g["fused"]) / ceiling,
               graph_copy_same_bytes_us=g["copy"],
               graph_copy_same_bytes_frac=timing.gbps(g["copy_bytes"], g["copy"]) / ceiling,
               graph_resnorm_us=g["resnorm"], graph_quantize_us=g["quantize"], graph_byte_exact=g["byte_exact"])


def table_lines(rows: List[Dict[str, object]]) -> List[str]:
    """The per-call table."""
    columns = ("D", "rows", "fused us", "fused GB/s", "% copy", "copy of same bytes, % copy", "unfused us",
               "eager us", "compiled us", "x unfused", "x eager", "x compiled", "byte-exact")
    return results.markdown_table(columns, (
        (r["dim"], r["rows"], fmt(r["fused_us"], ".2f"), fmt(r["fused_gbps"], ".0f"),
         fmt(100 * r["fused_frac_copy"], ".1f"), fmt(100 * r.get("copy_same_bytes_frac", float("nan")), ".1f"),
         fmt(r["unfused_us"], ".2f"), fmt(r["eager_us"], ".1f"), fmt(r["compiled_us"], ".1f"),
         fmt(r["speedup_vs_unfused"], ".2f"), fmt(r["speedup_vs_eager"], ".1f"), fmt(r["speedup_vs_compiled"], ".1f"),
         results.yes_no(r.get("byte_exact")))
        for r in rows))


def graph_table_lines(rows: List[Dict[str, object]]) -> List[str]:
    """The CUDA-graph replay figures of every case that has them (GPU time per call)."""
    columns = ("D", "rows", "calls (input sets)", "fused us", "% copy", "copy of same bytes us", "its % copy",
               "unfused pair us", "x unfused", "resnorm alone us", "nvfp4_quantize alone us", "byte-exact")
    return results.markdown_table(columns, (
        (r["dim"], r["rows"], r["graph_calls"], f"{r['graph_fused_us']:.2f}", f"{100 * r['graph_fused_frac_copy']:.1f}",
         f"{r['graph_copy_same_bytes_us']:.2f}", f"{100 * r['graph_copy_same_bytes_frac']:.1f}",
         f"{r['graph_unfused_us']:.2f}", f"{r['graph_speedup_vs_unfused']:.2f}", f"{r['graph_resnorm_us']:.2f}",
         f"{r['graph_quantize_us']:.2f}", results.yes_no(r.get("graph_byte_exact")))
        for r in rows if "graph_fused_us" in r))


def plot_spec(ceiling: float, title: str) -> results.Plot:
    """The plot: effective GB/s of each implementation against rows, one panel per D."""
    series = {n: f"{n}_gbps" for n in ("fused", "unfused", "eager", "compiled")}
    return results.Plot(x="rows", panel="dim", series=series,
                        xlabel="rows (M)", ylabel="effective GB/s (op's necessary bytes / time)", title=title,
                        hline=(ceiling, f"copy ceiling {ceiling:.0f} GB/s"), panel_label="D")


def byte_check_failures(rows: Sequence[Dict[str, object]], graph: Dict[Tuple[int, int], Dict[str, object]]
                        ) -> List[str]:
    """Every case whose fused == unfused check failed or was not made: each per-call row ("byte_exact"),
    each graph-replay case (its own inputs)."""
    def case(r):
        return f"D={r['dim']} rows={r['rows']}"

    return (results.check_failures(rows, ["byte_exact"], case)
            + results.check_failures(graph.values(), ["byte_exact"], lambda g: case(g) + " (graph replay)"))


# ----------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The benchmark's options."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Benchmark fused resnorm_quant vs the unfused pair, an eager PyTorch chain and torch.compile "
                    "of it, against the copy-bandwidth ceiling (GPU only). Writes bench_fused.{csv,md,png}.")
    p.add_argument("--dims", type=harness.positive_int_list, default=None,
                   help="comma-separated D values (default 3072,5120)")
    p.add_argument("--rows", type=harness.positive_int_list, default=None,
                   help="comma-separated row counts (default 17,256,1024,4096,4608,6889,8192,16384,32768)")
    p.add_argument("--reps", type=harness.positive_int, default=100,
                   help="max timed calls per implementation and case (default 100; fewer for big shapes, adaptively)")
    harness.add_out_argument(p)
    p.add_argument("--quick", action="store_true",
                   help=f"a subset: rows {','.join(map(str, QUICK_ROWS))} at D={QUICK_DIMS[0]}, fewer reps")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--compile-mode", default="default", choices=["default", "max-autotune-no-cudagraphs"],
                   help="torch.compile mode (default: default)")
    p.add_argument("--compile-static", action="store_true",
                   help="compile a static graph for every shape (default: torch's automatic dynamic shapes)")
    return p


def width_error(dims: Sequence[int]) -> Optional[str]:
    """The error for a D the kernels do not take, or None."""
    bad = [d for d in dims if not is_supported_width(d)]
    return f"--dims: D must be {WIDTH_RULE}, got {bad[0]}" if bad else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    dims = args.dims or list(QUICK_DIMS if args.quick else DEFAULT_DIMS)
    rows_list = args.rows or list(QUICK_ROWS if args.quick else DEFAULT_ROWS)
    error = width_error(dims)  # arguments first: a wrong one is reported on any machine
    if error is not None:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    if (rc := harness.refuse_without_gpu(PROG)) is not None:
        return rc

    max_reps = min(args.reps, 30) if args.quick else args.reps
    budget_s = 0.1 if args.quick else 0.25
    t_start = time.perf_counter()
    torch.cuda.init()
    header = harness.run_header() + [f"eps={EPS}, bf16 x/residual [1, rows, D], gate/scale/shift [1, D] bf16, no bias"]
    print("\n".join(header))
    print(EAGER_NOTE)
    l2 = timing.l2_bytes()
    ceiling, per_pair = timing.copy_ceiling_gbps()
    ceiling_note = timing.ceiling_note(ceiling, per_pair)
    print(ceiling_note)
    timer = timing.EventTimer()
    print(timer.clock_note())

    compile_kw: Dict[str, object] = {} if args.compile_mode == "default" else {"mode": args.compile_mode}
    if args.compile_static:
        compile_kw["dynamic"] = False
    if not args.no_compile:
        dynamo = harness.compile_for_many_shapes()

    rows_out: List[Dict[str, object]] = []
    for d in dims:
        compiled = None
        if not args.no_compile:
            # A fresh compile per D (D stays static); rows follow torch's automatic dynamic shapes unless
            # --compile-static.
            dynamo.reset()
            compiled = torch.compile(eager_chain, **compile_kw)
        for m in rows_list:
            t0 = time.perf_counter()
            r = run_case(m, d, timer, l2, ceiling, compiled, max_reps, budget_s)
            if r.pop("compile_failed", False):
                compiled = None
            rows_out.append(r)
            print(f"D={d} rows={m}: fused {r['fused_us']:.2f} us ({r['fused_gbps']:.0f} GB/s, "
                  f"{100 * r['fused_frac_copy']:.1f}% of copy; a copy of the same bytes "
                  f"{100 * r['copy_same_bytes_frac']:.1f}%), unfused {r['unfused_us']:.2f} us "
                  f"(resnorm alone {r['resnorm_us']:.2f}, nvfp4_quantize alone {r['quantize_us']:.2f}), "
                  f"eager {r['eager_us']:.1f} us, compiled {fmt(r['compiled_us'], '.1f')} us, "
                  f"byte-exact {r['byte_exact']}  [{time.perf_counter() - t0:.1f} s]", flush=True)

    graph: Dict[Tuple[int, int], Dict[str, object]] = {}
    for d in dims:
        for m in sorted(set(GRAPH_ROWS) | set(rows_list)):
            graph[(d, m)] = graph_case(m, d, l2)
    for r in rows_out:
        if (r["dim"], r["rows"]) in graph:
            merge_graph(r, graph[(r["dim"], r["rows"])], ceiling)
    host = {name: med for name, (med, _, _) in timing.host_us_per_call(host_overhead_cases()).items()}

    extra = []
    for (d, m), g in graph.items():
        if not any(r["dim"] == d and r["rows"] == m for r in rows_out):  # 17 rows when not in --rows
            extra.append(f"{m} rows, D={d}, CUDA-graph replay of {g['calls']} calls on {g['calls']} input sets "
                         f"(GPU time per call): fused {g['fused']:.2f} us, unfused pair {g['unfused']:.2f} us "
                         f"({g['unfused'] / g['fused']:.2f}x); the pair's kernels alone: resnorm "
                         f"{g['resnorm']:.2f} us, nvfp4_quantize {g['quantize']:.2f} us; copy of the same bytes "
                         f"{g['copy']:.2f} us; byte-exact {results.yes_no(g['byte_exact'])}")
    extra.append(f"eager host overhead per call (1 x {HOST_DIM}, wall time, GPU not the bottleneck): "
                 f"Python wrapper qwen_resnorm_fp4.resnorm_quant {host['wrapper']:.1f} us, "
                 f"raw torch.ops.qwen_fp4.resnorm_quant {host['raw_op']:.1f} us, the integrations' fused path "
                 f"try_fused_resnorm_quant {host['fused_path']:.1f} us; peer in the same run: "
                 f"torch.nn.functional.layer_norm of the same x {host['layer_norm']:.1f} us")
    notes = [
        ceiling_note, timer.clock_note(),
        "bytes per case: 2*D*2*M read + D*2*M residual_out + D/2*M packed + D/16*round_up(M,128) scales; "
        "GB/s of every implementation uses these bytes",
        "timing: CUDA events per call, queue pre-filled, cold L2 (input sets rotated over > 2x L2), medians; "
        "compile time excluded" + ("" if args.no_compile else f" (torch.compile mode={args.compile_mode}, "
                                   f"{'static' if args.compile_static else 'automatic dynamic'} shapes)"),
        EAGER_NOTE,
    ]
    lines, glines = table_lines(rows_out), graph_table_lines(rows_out)
    print("\n" + "\n".join(lines) + "\n\n" + GRAPH_TABLE_TITLE + "\n" + "\n".join(glines) + "\n\n" + "\n".join(extra))

    md = ["# bench_fused: resnorm_quant against its peers", ""] + [f"- {h}" for h in header] + \
        [f"- {n}" for n in notes] + [""] + lines + ["", GRAPH_TABLE_TITLE, ""] + glines + [""] + \
        [f"- {e}" for e in extra]
    results.write_report(args.out, "bench_fused", rows_out, md, CSV_FIELDS,
                         plot_spec(ceiling, f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"))
    print(f"total {time.perf_counter() - t_start:.0f} s")
    return results.exit_status(byte_check_failures(rows_out, graph), "fused and unfused outputs differ")


if __name__ == "__main__":
    sys.exit(main())

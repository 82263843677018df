#!/usr/bin/env python
"""The FP8 (E4M3) ops against a copy of the same bytes and their unfused chains (docs/performance.md, "FP8").
GPU only; needs a build with the FP8 ops.

    python benchmarks/bench_fp8.py --out DIR    # D = 3072 and 5120, rows 1 .. 16384
    python benchmarks/bench_fp8.py --quick      # 3 row counts at D = 3072

Every case by CUDA-graph replay (:func:`timing.compare_by_graph`: N calls on N input sets in one graph, cold
L2, each implementation and a copy of the case's bytes timed the same way), in one run:

- ``resnorm_quant_fp8``: ``torch.ops.qwen_fp4.resnorm_quant_fp8`` (gate/scale/shift [1, D], or [1, rows, D]
  with ``--modulation token``) against *unfused*, ours: ``resnorm`` then ``fp8_quantize`` (the same bytes in
  two kernels); *torch*: the eager PyTorch chain of a diffusers block (``residual + gate * x``, ``layer_norm``,
  ``* (1 + scale) + shift`` in bf16, then ``(y.float() * inv).clamp(-448, 448).to(float8_e4m3fn)``); and
  *compiled*: ``torch.compile`` of that chain (compile time excluded). Bytes: residual and x read, residual_out
  and y written (:func:`fused_bytes`).
- ``norm_modulate_quant_fp8`` (no residual: a block's first norm) against ``resnorm`` of (x, zeros, gate 0)
  then ``fp8_quantize`` (how the reference defines it), the torch chain without the residual, and compiled.
- ``fp8_quantize`` alone against torch's quantization and its compiled form.
- ``gelu_fp8``: the Linear input FC2 reads, at Qwen-Image's FC1 output [rows, 12288]:
  ``gelu_tanh_fp8_quantize`` against ``F.gelu`` (tanh) then ``fp8_quantize`` (ours unfused, the same bytes),
  the torch chain and its compiled form (Inductor fuses it into one kernel).

Byte checks: the fused op equals its unfused chain (ours) on the first and last input set of every case, for
``resnorm_quant_fp8``, ``norm_modulate_quant_fp8`` and ``gelu_fp8``; any difference fails the run (exit status 1).
The torch chains are speed peers: the share of their E4M3 bytes equal to ours is reported, not checked. Prints the
measurements (GPU time, share of a same-bytes copy and of the ceiling, ratios to the peers of the same run); the
goals they are read against are stated in docs/performance.md. Writes ``bench_fp8.{csv,md}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from qwen_resnorm_fp4.constants import E4M3_MAX

import harness
import results
import timing
from harness import EPS
from results import fmt

PROG = "bench_fp8"
DEFAULT_DIMS = (3072, 5120)
DEFAULT_ROWS = (1, 17, 256, 1024, 4096, 6889, 8192, 16384)
QUICK_DIMS = (3072,)
QUICK_ROWS = (17, 4096, 16384)
#: Qwen-Image's FFN hidden width: FC1's output, GELU's input and FC2's FP8 input.
FC1_OUT = 12288
OPS = ("resnorm_quant_fp8", "norm_modulate_quant_fp8", "fp8_quantize", "gelu_fp8")
MODULATIONS = ("batch", "token")
#: The FP8 ops' width rule (the op refuses anything else).
FP8_COLS_MULTIPLE, FP8_MAX_COLS = 16, 16384

#: Per op: the implementation measured, then its peers, in table order; the peer named "unfused" is ours.
IMPLS: Dict[str, Tuple[str, ...]] = {
    "resnorm_quant_fp8": ("fused", "unfused", "torch", "compiled"),
    "norm_modulate_quant_fp8": ("fused", "unfused", "torch", "compiled"),
    "fp8_quantize": ("fused", "torch", "compiled"),
    "gelu_fp8": ("fused", "unfused", "torch", "compiled"),
}
#: What "fused" is for each op, in the report.
SUBJECT = {"resnorm_quant_fp8": "resnorm_quant_fp8", "norm_modulate_quant_fp8": "norm_modulate_quant_fp8",
           "fp8_quantize": "fp8_quantize", "gelu_fp8": "gelu_tanh_fp8_quantize"}
#: The byte checks each op's rows must pass.
REQUIRED_CHECKS = {"resnorm_quant_fp8": ("byte_exact",), "norm_modulate_quant_fp8": ("byte_exact",),
                   "fp8_quantize": (), "gelu_fp8": ("byte_exact",)}
PEER_NOTE = ("unfused = ours in two kernels (resnorm, then fp8_quantize; for norm_modulate_quant_fp8, resnorm of "
             "(x, zeros, gate 0), which also reads the zero residual and writes a residual_out): the same output "
             "bytes; torch = the eager chain "
             "of a diffusers block in bf16 ops, then (y.float() * inv).clamp(-448, 448).to(float8_e4m3fn) with "
             "inv = 1 / input_scale: a speed peer, not byte-exact with the rule; compiled = torch.compile of it.")


# ----------------------------------------------------------------------------------------------------
# Bytes each op must move (bf16 in, E4M3 out)
# ----------------------------------------------------------------------------------------------------


def modulation_bytes(rows: int, dim: int, tensors: int, per_token: bool) -> int:
    """Bytes of ``tensors`` bf16 modulation tensors read per call: [rows, D] each when per token; [1, D]
    (not counted: negligible, as in :func:`harness.bytes_moved`) otherwise."""
    return tensors * rows * dim * 2 if per_token else 0


def fused_bytes(rows: int, dim: int, per_token: bool = False) -> int:
    """resnorm_quant_fp8: residual and x read (bf16), residual_out written (bf16), y written (E4M3), and
    gate/scale/shift read when per token: 2*D*2 + D*2 + D (+ 3*D*2) bytes per row."""
    return (2 * dim * 2 + dim * 2 + dim) * rows + modulation_bytes(rows, dim, 3, per_token)


def norm_modulate_bytes(rows: int, dim: int, per_token: bool = False) -> int:
    """norm_modulate_quant_fp8: x read (bf16), y written (E4M3), scale/shift read when per token."""
    return (dim * 2 + dim) * rows + modulation_bytes(rows, dim, 2, per_token)


def quantize_bytes(rows: int, dim: int) -> int:
    """fp8_quantize (and a fused GELU + quantize): bf16 read, E4M3 written."""
    return (dim * 2 + dim) * rows


def op_bytes(op: str, rows: int, dim: int, per_token: bool) -> int:
    """The bytes of one call of ``op`` (``dim``: FC1_OUT for gelu_fp8)."""
    if op == "resnorm_quant_fp8":
        return fused_bytes(rows, dim, per_token)
    if op == "norm_modulate_quant_fp8":
        return norm_modulate_bytes(rows, dim, per_token)
    if op in ("fp8_quantize", "gelu_fp8"):
        return quantize_bytes(rows, dim)
    raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")


def input_scale_for(y: torch.Tensor) -> torch.Tensor:
    """ModelOpt's static FP8 input scale of ``y``, amax / 448: fp32 [1] on y's device."""
    return (y.float().abs().amax().clamp(min=1e-12) / E4M3_MAX).reshape(1).float()


def equal_frac(a: torch.Tensor, b: torch.Tensor) -> float:
    """The share of equal bytes of two same-shape tensors (a speed peer's closeness, not a check)."""
    return (a.contiguous().view(torch.uint8) == b.contiguous().view(torch.uint8)).float().mean().item()


# ----------------------------------------------------------------------------------------------------
# The torch chains (speed peers)
# ----------------------------------------------------------------------------------------------------


def torch_quantize(y: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """Static E4M3 quantization in torch ops: (y * inv) clamped to +-448, rounded to nearest even."""
    return (y.float() * inv).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def torch_resnorm_fp8(residual, x, gate, scale, shift, inv, eps: float = EPS):
    """A diffusers block's gated residual + LayerNorm + modulation in bf16 ops, then E4M3: (q, residual_out)."""
    r = residual + gate * x
    n = torch.nn.functional.layer_norm(r, (r.shape[-1],), eps=eps)
    return torch_quantize(n * (1 + scale) + shift, inv), r


def torch_norm_modulate_fp8(x, scale, shift, inv, eps: float = EPS):
    """LayerNorm + modulation of x in bf16 ops, then E4M3."""
    n = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=eps)
    return torch_quantize(n * (1 + scale) + shift, inv)


def torch_gelu_fp8(h, inv):
    """GELU (tanh, Qwen-Image's FFN activation) of FC1's output, then E4M3."""
    return torch_quantize(torch.nn.functional.gelu(h, approximate="tanh"), inv)


TORCH_CHAINS: Dict[str, Callable] = {"resnorm_quant_fp8": torch_resnorm_fp8, "norm_modulate_quant_fp8":
                                     torch_norm_modulate_fp8, "fp8_quantize": torch_quantize,
                                     "gelu_fp8": torch_gelu_fp8}


# ----------------------------------------------------------------------------------------------------
# Input sets and implementations
# ----------------------------------------------------------------------------------------------------


class Inputs:
    """``n_sets`` rotating input sets of one case (on the GPU unless ``device`` says otherwise): residual and x
    [1, rows, D] bf16 (``h`` [rows, D] for gelu_fp8: FC1's output), modulation [1, D] shared or [1, rows, D]
    per set (``per_token``), zeros for the unfused no-residual chain, the input scale (amax of the case's y /
    448) and torch's 1 / input_scale."""

    def __init__(self, op: str, rows: int, dim: int, n_sets: int, per_token: bool, seed: int = 0,
                 device: str = "cuda") -> None:
        gen = torch.Generator(device=device).manual_seed(seed + rows * 7 + dim)
        opts = dict(device=device, generator=gen)
        bf = torch.bfloat16
        self.op, self.rows, self.dim, self.n_sets = op, rows, dim, n_sets
        shape = (rows, dim) if op == "gelu_fp8" else (1, rows, dim)
        self.x = [torch.randn(*shape, **opts).to(bf) for _ in range(n_sets)]
        self.residual = ([(torch.randn(*shape, **opts) * 2).to(bf) for _ in range(n_sets)]
                         if op == "resnorm_quant_fp8" else [])
        self.zeros = [torch.zeros_like(t) for t in self.x] if op == "norm_modulate_quant_fp8" else []
        mod_shape = (1, rows, dim) if per_token else (1, dim)
        sets = n_sets if per_token else 1

        def mod(scale: float) -> List[torch.Tensor]:
            return [(torch.randn(*mod_shape, **opts) * scale).to(bf) for _ in range(sets)]

        self._gate, self._scale, self._shift = mod(0.5), mod(0.1), mod(0.1)
        self.zero_gate = torch.zeros(mod_shape, dtype=bf, device=device)
        self.input_scale = input_scale_for(self.bf16_y(0))
        self.inv = torch.reciprocal(self.input_scale)

    def gate(self, i: int) -> torch.Tensor:
        return self._gate[i % len(self._gate)]

    def scale(self, i: int) -> torch.Tensor:
        return self._scale[i % len(self._scale)]

    def shift(self, i: int) -> torch.Tensor:
        return self._shift[i % len(self._shift)]

    def bf16_y(self, i: int) -> torch.Tensor:
        """The bf16 tensor the case's quantization reads on set ``i`` (what input_scale is calibrated on)."""
        ops = torch.ops.qwen_fp4
        if self.op == "resnorm_quant_fp8":
            return ops.resnorm(self.residual[i], self.x[i], None, self.gate(i), self.scale(i), self.shift(i), EPS)[0]
        if self.op == "norm_modulate_quant_fp8":
            return ops.resnorm(self.x[i], self.zeros[i], None, self.zero_gate, self.scale(i), self.shift(i), EPS)[0]
        if self.op == "gelu_fp8":
            return torch.nn.functional.gelu(self.x[i], approximate="tanh")
        return self.x[i]


def make_impls(inp: Inputs, compiled_fn: Optional[Callable]) -> Dict[str, timing.Fn]:
    """The implementations of one case as ``fn(i)`` over its input sets (names as in :data:`IMPLS`)."""
    ops = torch.ops.qwen_fp4
    s, inv = inp.input_scale, inp.inv
    impls: Dict[str, timing.Fn] = {}
    if inp.op == "resnorm_quant_fp8":
        def fused(i):
            return ops.resnorm_quant_fp8(inp.residual[i], inp.x[i], None, inp.gate(i), inp.scale(i), inp.shift(i), s,
                                         EPS)

        def unfused(i):
            y, r = ops.resnorm(inp.residual[i], inp.x[i], None, inp.gate(i), inp.scale(i), inp.shift(i), EPS)
            return ops.fp8_quantize(y, s), r

        impls = {"fused": fused, "unfused": unfused,
                 "torch": lambda i: torch_resnorm_fp8(inp.residual[i], inp.x[i], inp.gate(i), inp.scale(i),
                                                      inp.shift(i), inv)}
        if compiled_fn is not None:
            impls["compiled"] = lambda i: compiled_fn(inp.residual[i], inp.x[i], inp.gate(i), inp.scale(i),
                                                      inp.shift(i), inv)
    elif inp.op == "norm_modulate_quant_fp8":
        impls = {"fused": lambda i: ops.norm_modulate_quant_fp8(inp.x[i], inp.scale(i), inp.shift(i), s, EPS),
                 "unfused": lambda i: ops.fp8_quantize(inp.bf16_y(i), s),
                 "torch": lambda i: torch_norm_modulate_fp8(inp.x[i], inp.scale(i), inp.shift(i), inv)}
        if compiled_fn is not None:
            impls["compiled"] = lambda i: compiled_fn(inp.x[i], inp.scale(i), inp.shift(i), inv)
    elif inp.op == "fp8_quantize":
        impls = {"fused": lambda i: ops.fp8_quantize(inp.x[i], s), "torch": lambda i: torch_quantize(inp.x[i], inv)}
        if compiled_fn is not None:
            impls["compiled"] = lambda i: compiled_fn(inp.x[i], inv)
    elif inp.op == "gelu_fp8":
        impls = {"fused": lambda i: ops.gelu_tanh_fp8_quantize(inp.x[i], s),
                 "unfused": lambda i: ops.fp8_quantize(torch.nn.functional.gelu(inp.x[i], approximate="tanh"), s),
                 "torch": lambda i: torch_gelu_fp8(inp.x[i], inv)}
        if compiled_fn is not None:
            impls["compiled"] = lambda i: compiled_fn(inp.x[i], inv)
    else:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {inp.op!r}")
    return impls


def first(out) -> torch.Tensor:
    """The E4M3 tensor of an implementation's output (the first of a tuple)."""
    return out[0] if isinstance(out, tuple) else out


def measure_case(op: str, rows: int, dim: int, modulation: str, l2: int, ceiling: float,
                 compiled_fn: Optional[Callable], replays: int = 50, log=print) -> Dict[str, object]:
    """One case: every implementation and a copy of the case's bytes by graph replay
    (:func:`timing.compare_by_graph`), the byte check (fused == unfused on the first and last set), the torch
    peers' share of equal E4M3 bytes. ``dim``: the width (FC1_OUT for gelu_fp8)."""
    per_token = modulation == "token"
    nbytes = op_bytes(op, rows, dim, per_token)
    calls = timing.sets_for_cold_l2(nbytes, l2, minimum=timing.GRAPH_CALLS)
    inp = Inputs(op, rows, dim, calls, per_token)
    impls = make_impls(inp, compiled_fn)
    row: Dict[str, object] = {"op": op, "dim": dim, "rows": rows, "modulation": modulation, "calls": calls,
                              "bytes": nbytes}
    if "compiled" in impls:  # compile (first call for this shape) outside the timing
        t0 = time.perf_counter()
        try:
            impls["compiled"](0)
            torch.cuda.synchronize()
            row["compile_s"] = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - a peer that fails to compile is reported, not fatal
            log(f"  torch.compile failed for {op} rows={rows} D={dim}: {type(exc).__name__}: {str(exc)[:300]}")
            del impls["compiled"]
            row["compile_failed"] = True
    if "unfused" in impls:
        row["byte_exact"] = all(results.outputs_equal(impls["fused"](i), impls["unfused"](i))
                                for i in sorted({0, calls - 1}))
    ours = first(impls["fused"](0))
    for peer in ("torch", "compiled"):
        if peer in impls:
            row[f"{peer}_equal_frac"] = equal_frac(ours, first(impls[peer](0)))
    torch.cuda.synchronize()
    row.update(timing.compare_by_graph(impls, nbytes, calls, ceiling, replays))
    for peer in IMPLS[op][1:]:
        row[f"x_{peer}"] = (row[f"{peer}_us"] / row["fused_us"]) if f"{peer}_us" in row else float("nan")
    del impls, inp
    torch.cuda.empty_cache()
    return row


# ----------------------------------------------------------------------------------------------------
# Reporting and the byte check
# ----------------------------------------------------------------------------------------------------

CSV_FIELDS = ["op", "dim", "rows", "modulation", "calls", "bytes"] + [
    f"{n}_{k}" for n in ("fused", "unfused", "torch", "compiled")
    for k in ("us", "gbps", "frac_copy", "own_copy_us", "frac_own_copy")] + [
    "x_unfused", "x_torch", "x_compiled", "byte_exact", "torch_equal_frac", "compiled_equal_frac", "compile_s"]


def case_name(r: Dict[str, object]) -> str:
    """A row's case, as the lines printed and the check failures name it."""
    mod = f", {r['modulation']} modulation" if r["op"] in ("resnorm_quant_fp8", "norm_modulate_quant_fp8") else ""
    return f"{r['op']} D={r['dim']} rows={r['rows']}{mod}"


def table_lines(rows: Sequence[Dict[str, object]], op: str) -> List[str]:
    """The table of one op's cases (GPU time per call by graph replay)."""
    peers = IMPLS[op][1:]
    modulated = op in ("resnorm_quant_fp8", "norm_modulate_quant_fp8")
    columns = ["D", "rows"] + (["modulation"] if modulated else []) + [
        "us", "% of a same-bytes copy", "% of ceiling"]
    for p in peers:
        columns += [f"{p} us", f"x {p}"]
    if REQUIRED_CHECKS[op]:
        columns.append("fused == unfused")
    cells = []
    for r in rows:
        if r["op"] != op:
            continue
        c = [r["dim"], r["rows"]] + ([r["modulation"]] if modulated else []) + [
            fmt(r.get("fused_us"), ".2f"), fmt(100 * r.get("fused_frac_own_copy", float("nan")), ".1f"),
            fmt(100 * r.get("fused_frac_copy", float("nan")), ".1f")]
        for p in peers:
            c += [fmt(r.get(f"{p}_us"), ".2f"), fmt(r.get(f"x_{p}"), ".2f")]
        if REQUIRED_CHECKS[op]:
            c.append(results.yes_no(r.get("byte_exact")))
        cells.append(c)
    return results.markdown_table(columns, cells)


def byte_check_failures(rows: Sequence[Dict[str, object]]) -> List[str]:
    """Every case whose required byte check (:data:`REQUIRED_CHECKS`) failed or was not made."""
    return results.check_failures(rows, lambda r: REQUIRED_CHECKS[r["op"]], case_name)


# ----------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The benchmark's options."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Benchmark the FP8 (E4M3) ops against a copy of the same bytes, their unfused chains (ours and "
                    "torch's) and torch.compile, by CUDA-graph replay (GPU only). Writes bench_fp8.{csv,md}.")
    p.add_argument("--dims", type=harness.positive_int_list, default=None,
                   help="comma-separated D values (default 3072,5120; gelu_fp8 is always at 12288)")
    p.add_argument("--rows", type=harness.positive_int_list, default=None,
                   help="comma-separated row counts (default 1,17,256,1024,4096,6889,8192,16384)")
    p.add_argument("--ops", type=harness.choice_list(OPS, "ops"), default=list(OPS),
                   help=f"comma-separated subset of {','.join(OPS)} (default all)")
    p.add_argument("--modulation", type=harness.choice_list(MODULATIONS, "modulations"), default=["batch"],
                   help="gate/scale/shift per batch ([1, D]) and/or per token ([1, rows, D]): batch, token or "
                        "batch,token (default batch)")
    p.add_argument("--replays", type=harness.positive_int, default=50, help="graph replays per case (median; 50)")
    harness.add_out_argument(p)
    p.add_argument("--quick", action="store_true",
                   help=f"rows {','.join(map(str, QUICK_ROWS))} at D={QUICK_DIMS[0]}, 20 replays")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    return p


def width_error(dims: Sequence[int]) -> Optional[str]:
    """The error for a D the FP8 ops do not take, or None."""
    bad = [d for d in dims if not (0 < d <= FP8_MAX_COLS and d % FP8_COLS_MULTIPLE == 0)]
    return (f"--dims: D must be a positive multiple of {FP8_COLS_MULTIPLE}, at most {FP8_MAX_COLS}, got {bad[0]}"
            if bad else None)


def fp8_ops_missing() -> Optional[str]:
    """Why this build cannot run the benchmark (an FP8 op it lacks), or None."""
    missing = [n for n in ("resnorm_quant_fp8", "fp8_quantize", "norm_modulate_quant_fp8")
               if not hasattr(torch.ops.qwen_fp4, n)]
    return (f"this build of qwen_resnorm_fp4 has no torch.ops.qwen_fp4.{missing[0]} (the FP8 ops)"
            if missing else None)


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
    if (reason := fp8_ops_missing()) is not None:
        print(f"{PROG}: {reason}; nothing to measure.", file=sys.stderr)
        return 2
    replays = min(args.replays, 20) if args.quick else args.replays
    t_start = time.perf_counter()
    torch.cuda.init()
    header = harness.run_header() + [
        f"eps={EPS}, bf16 inputs, input_scale = amax(y) / 448 of each case, no bias; CUDA-graph replay, {replays} "
        "replays, cold L2 (one call per input set)"]
    print("\n".join(header))
    l2 = timing.l2_bytes()
    ceiling, per_pair = timing.copy_ceiling_gbps()
    ceiling_note = timing.ceiling_note(ceiling, per_pair)
    print(ceiling_note)
    if not args.no_compile:
        dynamo = harness.compile_for_many_shapes()

    out: List[Dict[str, object]] = []
    for op in args.ops:
        for d in ([FC1_OUT] if op == "gelu_fp8" else dims):
            compiled = None
            if not args.no_compile:  # a fresh compile per op and D; rows follow torch's automatic dynamic shapes
                dynamo.reset()
                compiled = torch.compile(TORCH_CHAINS[op])
            mods = args.modulation if op in ("resnorm_quant_fp8", "norm_modulate_quant_fp8") else ["batch"]
            for m in rows_list:
                for mod in mods:
                    t0 = time.perf_counter()
                    r = measure_case(op, m, d, mod, l2, ceiling, compiled, replays)
                    if r.pop("compile_failed", False):
                        compiled = None
                    out.append(r)
                    print(f"{case_name(r)}: {r['fused_us']:.2f} us ({100 * r['fused_frac_own_copy']:.1f}% of a "
                          "same-bytes copy), " + ", ".join(f"x {p} {fmt(r.get(f'x_{p}'), '.2f')}"
                                                           for p in IMPLS[op][1:])
                          + (f", byte-exact {r['byte_exact']}" if "byte_exact" in r else "")
                          + f"  [{time.perf_counter() - t0:.1f} s]", flush=True)

    notes = [ceiling_note,
             "bytes per row: resnorm_quant_fp8 2*D*2 read + D*2 residual_out + D y (+ 3*D*2 per-token modulation); "
             "norm_modulate_quant_fp8 D*2 + D (+ 2*D*2); fp8_quantize and gelu_fp8 D*2 + D. Every implementation's "
             "GB/s uses these bytes; '% of a same-bytes copy' = a copy of them timed the same way / the time",
             PEER_NOTE,
             "gelu_fp8: FC1's output [rows, 12288] -> GELU (tanh) -> E4M3 (FC2's input); fused is "
             "gelu_tanh_fp8_quantize, unfused F.gelu then fp8_quantize, compiled is Inductor's one fused kernel"]
    md = ["# bench_fp8: the FP8 (E4M3) ops against a same-bytes copy and their unfused chains", ""] + \
        [f"- {h}" for h in header] + [f"- {n}" for n in notes]
    for op in args.ops:
        lines = table_lines(out, op)
        md += ["", f"## {SUBJECT[op]}", ""] + lines
        print(f"\n{SUBJECT[op]}:\n" + "\n".join(lines))
    results.write_report(args.out, PROG, out, md, CSV_FIELDS)
    print(f"total {time.perf_counter() - t_start:.0f} s")
    return results.exit_status(byte_check_failures(out), "fused and unfused FP8 outputs differ")


if __name__ == "__main__":
    sys.exit(main())

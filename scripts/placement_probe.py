"""Diagnostic (docs/perf/tuning_history.md, item 16): does the fused op's per-call time at many rows depend on
where its inputs lie in memory, or on what the process ran before? x and residual are carved out of one pool
at chosen byte offsets (the op allocates its outputs through the caching allocator as usual) and each
placement is timed like the benchmark's per-call figure (bench.GpuTimer: CUDA events per call, the queue pre-
filled; one input set, which at 8192 x 3072 is 2.6x the L2). GPU only.

    python scripts/placement_probe.py [--rows 8192] [--dim 3072] [--reps 60] [--rounds 2] [--first-only]
        [--before compile|alloc|alloc-together|alloc-one|bench-chain]
            what the process does first: torch.compile of a small function and a call; allocate and free large
            tensors one after the other / four 2x-sized ones held together / one of 256 MiB; or the benchmark's
            eager chain compiled and run once at the probe's shape (as the benchmark does before timing)
        [--gemm-between]   also each call right after a bf16 4096^3 matmul (a large-shared-memory kernel)
        [--hold K]   keep each call's outputs alive for K more calls (default 0: freed at once, so the caching
            allocator hands the next call the same output blocks, as in the benchmark's timing loop)
"""
import argparse
import collections
import sys

import torch

from qwen_resnorm_fp4 import bench  # (importing the package registers torch.ops.qwen_fp4)

MiB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description="The fused op's per-call time by input placement and process history "
                                             "(diagnostic; GPU only).")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=3072)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--first-only", action="store_true", help="only x and residual adjacent")
    ap.add_argument("--before", choices=["compile", "alloc", "alloc-together", "alloc-one", "bench-chain"])
    ap.add_argument("--gemm-between", action="store_true",
                    help="also time each call right after a 4096^3 bf16 matmul (cuBLAS: a large-shared-memory kernel)")
    ap.add_argument("--hold", type=int, default=0, metavar="K",
                    help="keep each call's outputs alive for K more calls (0: the next call reuses their blocks)")
    a = ap.parse_args()
    if a.hold < 0:
        ap.error(f"--hold must be 0 or more calls, got {a.hold}")
    if not torch.cuda.is_available():
        sys.exit("placement_probe.py times the op on a CUDA GPU; none is available here")
    if a.before == "compile":
        f = torch.compile(lambda t: (t * 2 + 1).relu())
        f(torch.randn(1024, device="cuda"))
    elif a.before == "alloc":
        for mib in (48, 96, 96, 48, 12, 192):
            torch.empty(mib * MiB, dtype=torch.uint8, device="cuda").fill_(0)
    elif a.before == "alloc-together":
        held = [torch.empty(2 * a.rows * a.dim * 2, dtype=torch.uint8, device="cuda") for _ in range(4)]
        held.clear()  # all four freed together: their segments stay cached
    elif a.before == "alloc-one":
        torch.empty(256 * MiB, dtype=torch.uint8, device="cuda").fill_(0)
    elif a.before == "bench-chain":
        inp = bench.Inputs(a.rows, a.dim, 1)
        chain = torch.compile(bench.eager_chain, dynamic=None)
        for _ in range(3):
            chain(inp.residual[0], inp.x[0], inp.gate, inp.scale, inp.shift, inp.global_scale, inp.index, inp.bounds)
        del inp
    torch.cuda.synchronize()
    n = a.rows * a.dim * 2  # bytes of one bf16 [rows, dim] tensor
    # (x offset, residual offset) in bytes from the pool's start
    placements = [(0, n), (0, n + 512), (0, n + 4096), (0, n + 64 * 1024), (0, n + MiB), (0, n + 2 * MiB),
                  (0, 64 * MiB), (0, 96 * MiB), (0, 128 * MiB), (MiB, n + 3 * MiB), (0, 256 * MiB + 6144)]
    if a.first_only:
        placements = placements[:1]
    pool = torch.empty(512 * MiB + 2 * n, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    src_x = torch.randn(a.rows, a.dim, device="cuda", generator=gen).to(torch.bfloat16)
    src_r = torch.randn(a.rows, a.dim, device="cuda", generator=gen).to(torch.bfloat16)
    gate = (torch.randn(1, a.dim, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
    scale = (torch.randn(1, a.dim, device="cuda", generator=gen) * 0.1).to(torch.bfloat16)
    shift = (torch.randn(1, a.dim, device="cuda", generator=gen) * 0.1).to(torch.bfloat16)
    gs = torch.ones(1, device="cuda")
    timer = bench.GpuTimer()
    ops = torch.ops.qwen_fp4
    print(f"{a.rows} x {a.dim}, per-call us (median of {a.reps}); offsets in bytes from a 256-byte aligned pool; "
          f"outputs held for {a.hold} more calls")
    for rnd in range(a.rounds):
        for ox, orr in placements:
            x = pool[ox:ox + n].view(torch.bfloat16).view(1, a.rows, a.dim)
            r = pool[orr:orr + n].view(torch.bfloat16).view(1, a.rows, a.dim)
            x.copy_(src_x.view_as(x))
            r.copy_(src_r.view_as(r))

            held = collections.deque(maxlen=a.hold)  # maxlen 0 keeps nothing: outputs freed at once

            def fused(_):
                out = ops.resnorm_quant(r, x, None, gate, scale, shift, gs, bench.EPS, True)
                held.append(out)
                return out

            us = timer.per_call_us(fused, 1, a.reps)
            print(f"round {rnd + 1}: x at {ox:>11}, residual at {orr:>11} (x + {orr - ox:>11}): {us:7.2f} us")
            if a.gemm_between:  # the op right after a GEMM, as in a model (FC2 / attention output, then the op)
                ma = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
                mb = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
                times = []
                for _ in range(a.reps):
                    torch.mm(ma, mb)
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    fused(0)
                    e1.record()
                    times.append((e0, e1))
                torch.cuda.synchronize()
                us = sorted(e0.elapsed_time(e1) * 1e3 for e0, e1 in times)[len(times) // 2]
                print(f"round {rnd + 1}: the same, each call right after a bf16 4096^3 matmul: {us:7.2f} us")


if __name__ == "__main__":
    main()

"""Quick timing probe for kernel tuning (the full benchmark is `python -m qwen_resnorm_fp4 bench`)."""
import sys

import torch

import qwen_resnorm_fp4 as q


def bench(fn, sets, reps=50):
    for s in sets[:2]:
        fn(*s)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        s = sets[i % len(sets)]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(*s); b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(big)
copy_us = bench(lambda: dst.copy_(big), [()], 20)
copy_bw = 2 * big.numel() / copy_us / 1e3
print(f"copy: {copy_bw:.0f} GB/s")
for cols in [int(c) for c in (sys.argv[1:] or ["3072", "5120"])]:
    for rows in [int(r) for r in __import__("os").environ.get("ROWS", "17,256,1024,4096,8192,16384,32768").split(",")]:
        nsets = max(2, int(240e6 // (rows * cols * 6)) + 1)
        G = torch.tensor([100.0], device="cuda")
        sets = []
        for _ in range(nsets):
            x = torch.randn(1, rows, cols, device="cuda").bfloat16()
            r = torch.randn(1, rows, cols, device="cuda").bfloat16()
            p = [torch.randn(1, cols, device="cuda").bfloat16() * 0.1 for _ in range(3)]
            sets.append((r, x, None, *p, G))
        fused = bench(lambda r, x, b, g, s, h, G: torch.ops.qwen_fp4.resnorm_quant(r, x, b, g, s, h, G, 1e-6, True), sets)
        def unf(r, x, b, g, s, h, G):
            y, _ = torch.ops.qwen_fp4.resnorm(r, x, b, g, s, h, 1e-6)
            torch.ops.qwen_fp4.nvfp4_quantize(y, G, True)
        unfused = bench(unf, sets)
        rn = bench(lambda r, x, b, g, s, h, G: torch.ops.qwen_fp4.resnorm(r, x, b, g, s, h, 1e-6), sets)
        ys = [torch.ops.qwen_fp4.resnorm(*st[:6], 1e-6)[0] for st in sets]
        qz = bench(lambda y, G: torch.ops.qwen_fp4.nvfp4_quantize(y, G, True), [(y, G) for y in ys])
        # graph replay: 10 fused calls captured, GPU time only
        st = sets[0]
        torch.ops.qwen_fp4.resnorm_quant(*st, 1e-6, True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(10):
                torch.ops.qwen_fp4.resnorm_quant(*st, 1e-6, True)
        graph_us = bench(lambda: g.replay(), [()], 20) / 10
        print(f"   resnorm {rn:8.2f} us, quantize {qz:8.2f} us, fused via graph {graph_us:8.2f} us")
        nbytes = rows * cols * 6 + rows * cols // 2 + (rows + 127) // 128 * 128 * cols // 16
        bw = nbytes / fused / 1e3
        print(f"D={cols} rows={rows:6d} fused {fused:8.2f} us {bw:6.0f} GB/s {bw / copy_bw:5.1%} | unfused {unfused:8.2f} us x{unfused / fused:.2f}")

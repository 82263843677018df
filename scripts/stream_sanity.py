"""A quick check that the fused many-rows launch (the streaming kernel at D = 3072 / 5120) finishes and
equals the unfused pair, before longer GPU runs: exit 0 and "ok", or a non-zero exit.

    timeout 60 python scripts/stream_sanity.py
"""
import torch

import qwen_resnorm_fp4 as q

for rows, cols in ((4096, 3072), (6889, 3072), (4999, 5120)):
    g = torch.Generator(device="cuda").manual_seed(rows)
    x, res = (torch.randn(1, rows, cols, device="cuda", generator=g).bfloat16() for _ in range(2))
    gate, scale, shift = (torch.randn(1, cols, device="cuda", generator=g).bfloat16() * 0.3 for _ in range(3))
    G = torch.tensor([100.0], device="cuda")
    fused = q.resnorm_quant(res, x, None, gate, scale, shift, G, 1e-6, True)
    y, res_out = q.resnorm(res, x, None, gate, scale, shift, 1e-6)
    pair = (*q.nvfp4_quantize(y, G, True), res_out)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(fused, pair)), f"rows={rows} D={cols}: fused != pair"
print("ok")

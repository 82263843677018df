"""What Nsight Compute profiles: the fused op at 4096 rows x 3072 (Qwen-Image image stream; --rows N for
another row count), a few calls; with --pair, each call followed by the unfused pair (resnorm, then
nvfp4_quantize) on the same inputs."""
import sys

import torch

import qwen_resnorm_fp4 as q

rows = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 4096
cols = 3072
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(1, rows, cols, device="cuda", generator=g).bfloat16()
res = torch.randn(1, rows, cols, device="cuda", generator=g).bfloat16()
p = [torch.randn(1, cols, device="cuda", generator=g).bfloat16() * 0.1 for _ in range(3)]
G = torch.tensor([100.0], device="cuda")
for _ in range(5):
    q.resnorm_quant(res, x, None, p[0], p[1], p[2], G)
    if "--pair" in sys.argv:
        q.nvfp4_quantize(q.resnorm(res, x, None, p[0], p[1], p[2])[0], G)
torch.cuda.synchronize()

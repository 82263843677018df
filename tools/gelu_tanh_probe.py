#!/usr/bin/env python
"""torch.nn.functional.gelu(approximate="tanh") on the GPU for every bf16 bit pattern: the table the CPU
reference of the fused GELU + E4M3 quantize reads (qwen_resnorm_fp4/data/gelu_tanh_bf16.xz), and how it
compares with tools/gelu_tanh_probe.cu's kernel formulas.

    python tools/gelu_tanh_probe.py OUT.bin [A.bin B.bin]   # 65536 little-endian uint16: gelu(bits i)
"""

import sys

import numpy as np
import torch

bits = torch.arange(65536, dtype=torch.int32).to(torch.uint16)
x = bits.view(torch.bfloat16).cuda()
y = torch.nn.functional.gelu(x, approximate="tanh").cpu().view(torch.uint16).numpy().astype("<u2")
y.tofile(sys.argv[1])
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), "->", sys.argv[1])
cpu = torch.nn.functional.gelu(bits.view(torch.bfloat16), approximate="tanh").view(torch.uint16).numpy()
nan = np.isnan(x.cpu().float().numpy())
print("torch CPU differs from torch CUDA at", int(((cpu != y) & ~nan).sum()), "non-NaN inputs")
for path in sys.argv[2:]:
    v = np.fromfile(path, dtype="<u2")
    print(path, "differs from torch CUDA at", int(((v != y) & ~nan).sum()), "non-NaN inputs,",
          int((v != y).sum()), "in all")

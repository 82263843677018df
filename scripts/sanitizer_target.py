"""What compute-sanitizer runs (scripts/gpu_check.sh, stage "sanitizer"): valid but awkward inputs only
(bad inputs are refused by the argument checks before any launch; tests/reliability/test_bad_inputs.py covers them).

- every kernel and block shape: D in {64, 2048, 2112, 3072, 5120, 8192, 8256, 16384} (the generic
  paths of csrc/dispatch.cuh switch at D = 2048 and 8192; D = 3072 and 5120 have fixed-width kernels
  with a second shape from 2048 rows on, so 2049 x 3072 and 2048 x 5120 are here too, also with the
  plain-parameter configuration, the production path at those sizes; and the staggered one-CTA kernels,
  taken when the rows exceed one wave, at 1024 x 3072, 512 x 5120, 2048 x 2048 and 1024 x 4096;
  csrc/launch_rows.cuh);
- the edge row counts 0, 1, 127, 128, 129 (the scale tensor's padding rows: 127 and 1 pad, 128 none);
- every modulation form ([D], [B, D], [2B, D] with int32 / int64 / bool modulate_index), bf16 and fp32
  parameters, with and without bias and affine LayerNorm, both quantizer modes, all three ops;
- NaN / Inf rows, extreme and invalid global scales (inf, 0, NaN, a denormal), and inputs the wrappers
  copy first (non-contiguous, misaligned).
Inputs are made on the CPU and copied over, so that almost all the sanitized launches are ours. A few
seconds of GPU work under memcheck.
"""
import math

import torch

import qwen_resnorm_fp4 as q

g = torch.Generator().manual_seed(0)


def rnd(*shape, dtype=torch.bfloat16, s=1.0, m=0.0):
    return (torch.randn(*shape, generator=g) * s + m).to(dtype).cuda()


# (form, index dtype, parameter dtype, bias, affine)
CONFIGS = [
    ("shared", None, torch.bfloat16, False, False),
    ("batch", None, torch.float32, True, False),
    ("indexed", torch.int32, torch.bfloat16, True, True),
    ("indexed", torch.int64, torch.float32, False, True),
    ("indexed", torch.bool, torch.bfloat16, True, False),
    ("batch", None, torch.bfloat16, False, True),
    ("shared", None, torch.float32, True, True),
]
G = torch.tensor([10.0], device="cuda")
launches = 0


def inputs(rows, cols, cfg):
    form, index_dtype, pdt, bias, affine = cfg
    batches = 2 if form != "shared" and rows % 2 == 0 and rows > 0 else 1
    per = rows // batches
    prow = {"shared": (), "batch": (batches,), "indexed": (2 * batches,)}[form]
    kw = dict(residual=rnd(batches, per, cols, s=4.0), x=rnd(batches, per, cols),
              bias=rnd(cols, dtype=pdt, s=0.1) if bias else None,
              gate=rnd(*prow, cols, dtype=pdt, s=0.5, m=0.5), scale=rnd(*prow, cols, dtype=pdt, s=0.3),
              shift=rnd(*prow, cols, dtype=pdt, s=0.3),
              weight=rnd(cols, dtype=pdt, s=0.1, m=1.0) if affine else None,
              norm_bias=rnd(cols, dtype=pdt, s=0.1) if affine else None, modulate_index=None)
    if form == "indexed":
        idx = torch.randint(0, 3, (batches, per), generator=g)
        kw["modulate_index"] = (idx != 0 if index_dtype == torch.bool else idx.to(index_dtype)).cuda()
    return kw


def run(kw, gs=G):
    global launches
    common = (kw["residual"], kw["x"], kw["bias"], kw["gate"], kw["scale"], kw["shift"])
    extra = dict(weight=kw["weight"], norm_bias=kw["norm_bias"], modulate_index=kw["modulate_index"])
    for fast in (True, False):
        q.resnorm_quant(*common, gs, 1e-6, fast, **extra)
    y, _ = q.resnorm(*common, 1e-6, **extra)
    for fast in (True, False):
        q.nvfp4_quantize(y, gs, fast)
    launches += 5


COLS = (64, 2048, 2112, 3072, 5120, 8192, 8256, 16384)
ROWS = (0, 1, 127, 128, 129)
shapes = [(rows, cols) for cols in COLS for rows in ROWS] + [(2049, 3072), (2048, 5120), (256, 16384)]
for i, (rows, cols) in enumerate(shapes):
    run(inputs(rows, cols, CONFIGS[i % len(CONFIGS)]))
for cfg in CONFIGS:  # every configuration on one shape with two batches
    run(inputs(130, 3072, cfg))
# the plain kernels (shared bf16 parameters, no bias, no affine: CONFIGS[0]) of the many-rows shapes, which
# the rotation above gives other configurations
run(inputs(2049, 3072, CONFIGS[0]))
run(inputs(2048, 5120, CONFIGS[0]))
# the one-CTA shapes' staggered kernels (rows above one wave on an H200: 792 at D = 3072, 396 at 5120, 1056
# at 2048, 924 at 4096), plain and not
for cfg in CONFIGS[:2]:
    run(inputs(1024, 3072, cfg))
    run(inputs(512, 5120, cfg))
    run(inputs(2048, 2048, cfg))
    run(inputs(1024, 4096, cfg))

# special values: a NaN row, an Inf row, an all-zero row; extreme and invalid global scales
kw = inputs(129, 1024, CONFIGS[2])
kw["x"].view(-1, 1024)[5, 17] = math.nan
kw["residual"].view(-1, 1024)[64, 1000] = math.inf
kw["x"].view(-1, 1024)[100] = 0
kw["residual"].view(-1, 1024)[100] = 0
for gs in (math.inf, 0.0, math.nan, 1e-39, -1.0, 1e30):
    run(kw, torch.tensor([gs], device="cuda"))

# layouts the wrappers copy before launching
kw = inputs(128, 3072, CONFIGS[1])
big = torch.zeros(kw["x"].numel() + 1, dtype=torch.bfloat16, device="cuda")
misaligned = big[1:].view(kw["x"].shape)
misaligned.copy_(kw["x"])
kw["x"] = misaligned
kw["residual"] = kw["residual"].transpose(0, 1).contiguous().transpose(0, 1)
run(kw)

torch.cuda.synchronize()
print(f"sanitizer target done: {launches} op calls")

"""What compute-sanitizer runs: every kernel and block shape once, small rows, odd row counts, all options."""
import torch

import qwen_resnorm_fp4 as q

g = torch.Generator(device="cuda").manual_seed(0)
rnd = lambda *s: torch.randn(*s, device="cuda", generator=g).bfloat16()  # noqa: E731
for cols in (64, 1024, 3072, 5120, 8256, 16384):
    for rows, batches in ((1, 1), (129, 1), (2 * 65, 2)):
        x, res = rnd(batches, rows // batches, cols), rnd(batches, rows // batches, cols)
        gate, scale, shift = rnd(2 * batches, cols), rnd(2 * batches, cols), rnd(2 * batches, cols)
        idx = torch.randint(0, 2, (batches, rows // batches), device="cuda", generator=g).int()
        w, nb, b = rnd(cols), rnd(cols), rnd(cols).float()
        G = torch.tensor([10.0], device="cuda")
        for fast in (True, False):
            q.resnorm_quant(res, x, b, gate, scale, shift, G, 1e-6, fast, weight=w, norm_bias=nb, modulate_index=idx)
            y, _ = q.resnorm(res, x, None, gate[:batches], scale[:batches], shift[:batches])
            q.nvfp4_quantize(y, G, fast)
torch.cuda.synchronize()
print("sanitizer target done")

"""Diagnostic only: where a row CTA's time goes, phase by phase, in the fused op's one-CTA-per-row kernel and in
resnorm's (the pair's first kernel), at the same rows. Needs a wheel built from a tree patched by
``scripts/cta_phases_patch.py`` (outputs wrong by design). Times calls as the benchmark does (per-call CUDA
events, queue pre-filled, cold L2) and reads every call's readings back:

    python scripts/cta_phases.py --rows 256,1024 --dim 3072

Phases of one CTA, in SM clock cycles of thread 0: start -> the first reduction's barrier (the row's loads,
the first pass, the mean's warp sums), -> the second's (the second pass), -> the end (modulation, the
quantization for the fused op, every store, a barrier).
"""
import argparse
import statistics

import torch

from qwen_resnorm_fp4 import bench

from cta_timeline import timed_calls  # scripts/ is on sys.path when this script runs


def _q(t: torch.Tensor, q: float) -> float:
    return float(torch.quantile(t.double(), q))


def phases(rows: int, dim: int, op: str, calls: int = 30) -> None:
    outs, event_us = timed_calls(rows, dim, op, -1, calls)  # residual_out: the last output of both ops
    t = torch.stack([o.reshape(rows, dim)[:, :24].contiguous().view(torch.int64) for o in outs]).cpu()  # calls x rows x 6
    start, end = t[..., 1].double(), t[..., 2].double()
    life_us = (end - start) / 1e3
    span_us = (end.max(dim=1).values - start.min(dim=1).values) / 1e3
    start_spread_us = (start.max(dim=1).values - start.min(dim=1).values) / 1e3
    c_mu, c_var, c_end = t[..., 3].double(), t[..., 4].double(), t[..., 5].double()
    med = statistics.median
    print(f"{op:8s} rows={rows} D={dim}: event {med(event_us):.2f} us/call; CTAs' span {float(span_us.median()):.2f} us "
          f"(starts spread over {float(start_spread_us.median()):.2f} us); CTA lifetime median {_q(life_us, .5):.2f} "
          f"p90 {_q(life_us, .9):.2f} max {float(life_us.max()):.2f} us")
    for name, c in (("to mean", c_mu), ("mean->var", c_var - c_mu), ("var->end", c_end - c_var), ("total", c_end)):
        print(f"    {name:10s} cycles: median {_q(c, .5):7.0f}  p10 {_q(c, .1):7.0f}  p90 {_q(c, .9):7.0f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=bench._int_list, default=[256, 1024])
    p.add_argument("--dim", type=int, default=3072)
    p.add_argument("--ops", default="fused,resnorm")
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}, SM clock readings of thread 0 per CTA")
    for m in args.rows:
        for op in args.ops.split(","):
            phases(m, args.dim, op)


if __name__ == "__main__":
    main()

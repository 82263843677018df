#!/usr/bin/env python
"""Where a converted Qwen-Image forward spends its GPU time: torch.profiler's kernel table of one forward of
the BF16 model and of the same model converted (benchmarks/bench_model.py's model and inputs).

    PYTHONPATH=.:benchmarks python tools/profile_model.py --layers 4 --tokens 6889 --format fp8 --linears all
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_model  # noqa: E402


def table(model, inp, rows: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        model(**inp)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(**inp)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=90)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=6889)
    p.add_argument("--zero-cond-t", action="store_true")
    p.add_argument("--format", default="fp8")
    p.add_argument("--linears", default="all")
    p.add_argument("--rows", type=int, default=45)
    args = p.parse_args()
    from qwen_resnorm_fp4.integrations import diffusers as qd

    model = bench_model.build_model(args.layers, args.zero_cond_t)
    inp = bench_model.model_inputs(1, bench_model.image_shapes(args.tokens, args.zero_cond_t), 128, seed=0)
    with torch.inference_mode():
        print(f"== bf16, {args.layers} blocks, {args.tokens} tokens, zero_cond_t {args.zero_cond_t}")
        print(table(model, inp, args.rows))
        qd.convert_transformer(model, mode="fused", format=args.format, linears=args.linears,
                               calibration_inputs=[inp])
        print(f"== {args.format} linears={args.linears} fused")
        print(table(model, inp, args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the eager host time of one small call goes (1 x 3072, wall time per call, GPU not the bottleneck):
the typed wrapper, the raw op (packet and overload), the op with no rows (no launch), the integrations'
fused path, the wrapper's parts (the argument rules, the environment switches) and PyTorch peers in the same
process.

    python scripts/host_overhead.py [--calls 300] [--rounds 15]
"""
import argparse
import types

import torch

from qwen_resnorm_fp4 import api, bench, env, fused_path, validation


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    d = bench.TARGET_DIM
    base = bench.host_overhead_cases()  # the benchmark's own four cases, on its 1 x 3072 inputs
    inp = bench.Inputs(1, d, 1, seed=2)
    r, x = inp.residual[0], inp.x[0]
    pos = (r, x, None, inp.gate, inp.scale, inp.shift, inp.global_scale)
    r0, x0 = r[:, :0], x[:, :0]  # [1, 0, D]: no rows, so no launch
    fc1 = types.SimpleNamespace(in_features=d, input_global_scale=inp.global_scale)
    y = torch.randn(1, d, device="cuda").bfloat16()
    cases = {
        "wrapper qwen_resnorm_fp4.resnorm_quant": base["wrapper"],
        "raw op, packet torch.ops.qwen_fp4.resnorm_quant": base["raw_op"],
        "raw op, overload .default": lambda: torch.ops.qwen_fp4.resnorm_quant.default(*pos, 1e-6, True),
        "raw op, 0 rows (no launch)": lambda: torch.ops.qwen_fp4.resnorm_quant.default(
            r0, x0, None, inp.gate, inp.scale, inp.shift, inp.global_scale, 1e-6, True),
        "fused path try_fused_resnorm_quant": base["fused_path"],
        "fused path declining at its last rule (fc1 None)": lambda: fused_path.try_fused_resnorm_quant(
            r, x, inp.gate, inp.scale, inp.shift, None, eps=1e-6),
        "argument rules alone (resnorm_quant_problem)": lambda: validation.resnorm_quant_problem(
            *pos, 1e-6, None, None, None),
        "environment: fast-math default (2 variables)": env.default_fast_math,
        "environment: the fused path's on/off switches (2 variables)": lambda: (
            env.flag_enabled(env.DISABLE_VAR), env.flag_enabled(env.FOUR_OVER_SIX_VAR)),
        "wrapper nvfp4_quantize": lambda: api.nvfp4_quantize(y, inp.global_scale),
        "raw op nvfp4_quantize": lambda: torch.ops.qwen_fp4.nvfp4_quantize(y, inp.global_scale, True),
        "peer torch.nn.functional.layer_norm (same x)": base["layer_norm"],
        "peer torch.add (same x)": lambda: torch.add(x, r),
        "peer torch.cuda._sleep(1) (one bare launch)": lambda: torch.cuda._sleep(1),
        "peer torch.empty x3 (the op's outputs)": lambda: (torch.empty(1, d // 2, dtype=torch.uint8, device="cuda"),
                                                           torch.empty(128, d // 16, dtype=torch.uint8, device="cuda"),
                                                           torch.empty_like(x)),
    }
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {args.calls} calls x {args.rounds} rounds "
          f"(cases interleaved), us per call: median [min, max] over the rounds")
    for name, (med, lo, hi) in bench.host_us_per_call(cases, args.calls, args.rounds).items():
        print(f"{name:48s} {med:7.2f}  [{lo:.2f}, {hi:.2f}]", flush=True)


if __name__ == "__main__":
    main()

"""Where the eager host time of one small call goes (1 x 3072, wall time per call, GPU not the bottleneck):
the typed wrapper, the raw op (packet and overload), the op with no rows (no launch), the integrations'
gate, the wrapper's parts, and PyTorch peers in the same process. `previous wrapper` replays the wrapper's
code path before the fast path (all Python checks, then `_aligned` per tensor, then the op's packet, the
environment read through os.environ.get), and `gate, checked path only` is the gate with its common-call
fast path switched off, so both changes are measured against what they replace in the same run.

    python scripts/host_overhead.py [--calls 300] [--rounds 15]
"""
import argparse
import os
import types

import torch

from qwen_resnorm_fp4 import api, bench, gate
from qwen_resnorm_fp4.env import FAST_MATH_DISABLE_VARS


def previous_wrapper(residual, x, bias, gate_, scale, shift, global_scale, eps=1e-6):
    get = os.environ.get
    fm = get(FAST_MATH_DISABLE_VARS[0]) != "1" and get(FAST_MATH_DISABLE_VARS[1]) != "1"
    api._check_resnorm_quant_args(residual, x, bias, gate_, scale, shift, global_scale, eps, None, None, None)
    opt = lambda t: None if t is None else api._aligned(t)  # noqa: E731
    return torch.ops.qwen_fp4.resnorm_quant(
        api._aligned(residual), api._aligned(x), opt(bias), api._aligned(gate_), api._aligned(scale),
        api._aligned(shift), global_scale, float(eps), fm, None, None, None)


def checked_gate(*args, **kwargs):
    """The gate with its common-call fast path switched off: every decline check, then the op."""
    fast = gate._serve_common_call
    gate._serve_common_call = lambda *a: None
    try:
        return gate.try_fused_resnorm_quant(*args, **kwargs)
    finally:
        gate._serve_common_call = fast


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
        "previous wrapper (checks, _aligned, packet)": lambda: previous_wrapper(*pos),
        "raw op, packet torch.ops.qwen_fp4.resnorm_quant": base["raw_op"],
        "raw op, overload .default": lambda: torch.ops.qwen_fp4.resnorm_quant.default(*pos, 1e-6, True),
        "raw op, 0 rows (no launch)": lambda: torch.ops.qwen_fp4.resnorm_quant.default(
            r0, x0, None, inp.gate, inp.scale, inp.shift, inp.global_scale, 1e-6, True),
        "gate try_fused_resnorm_quant": base["gate"],
        "gate, checked path only (no fast path)": lambda: checked_gate(r, x, inp.gate, inp.scale, inp.shift, fc1,
                                                                      eps=1e-6),
        "python checks alone": lambda: api._check_resnorm_quant_args(*pos, 1e-6, None, None, None),
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

"""Where inductor's fused and unfused compilations of a converted model part (GPU): a real-width one-block
Qwen-Image in FP8 ("all" Linears, the model of ``test_gpu_inductor_deterministic_fused_equals_unfused``),
compiled whole and by regions, in inductor's deterministic mode, with and without ``emulate_precision_casts``
(bf16 intermediates rounded where eager rounds them), fused, unfused and fused again (whether one mode repeats
its bytes across compilations). Writes each case's generated code and the process's GPU numerics settings
(``OUT/<case>/<mode>_<n>.py``, ``OUT/<case>/settings.txt``: ``helpers.inductor_code.write_compilations``) and a
summary (``OUT/summary.json``): per case, whether the outputs are equal and, where not, how many elements
differ and the first, the largest difference and how many tokens differ; and each compilation's Triton kernels
counted by whether inductor generated them in its deterministic mode.

    python scripts/inductor_fused_unfused.py --out gpu_logs/inductor_diff
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from helpers.diffusers_models import build_small, make_inputs, real_width_qwen_image  # noqa: E402
from helpers.inductor_code import deterministic_compilation, deterministic_flags, write_compilations  # noqa: E402
from helpers.reliability import first_difference  # noqa: E402

CASES = {  # name: (regional, inductor options)
    "whole": (False, {}),
    "whole_eager_casts": (False, {"emulate_precision_casts": True}),
    "regional": (True, {}),
}


def build(zero_cond_t: bool, device: str):
    """The test's model (``helpers.diffusers_models.real_width_qwen_image``, FP8) and its first input; on the
    CPU, the CPU tests' small model (a check of this script)."""
    import qwen_resnorm_fp4.integrations.diffusers as qd

    if device == "cpu":
        model, inputs = build_small(zero_cond_t), [make_inputs(1, 7, zero_cond_t, small=True, seed=5)]
        qd.convert_transformer(model, format="fp8", linears="all", calibration_inputs=inputs, allow_cpu=True)
        return model, inputs[0]
    model, inputs = real_width_qwen_image("fp8", zero_cond_t)
    return model, inputs[0]


def compiled_output(model, inp: Dict[str, Any], regional: bool, options: Dict[str, Any]):
    """One forward of a fresh compilation (whole model, or its repeated blocks) and inductor's code for it."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with deterministic_compilation(**options), torch.no_grad():
        if regional:
            model.compile_repeated_blocks(fullgraph=True)
            fn = lambda: model(**inp)[0].clone()  # noqa: E731
        else:
            compiled = torch.compile(model, fullgraph=True)
            fn = lambda: compiled(**inp)[0].clone()  # noqa: E731
        out, codes = run_and_get_code(fn)
    if regional:  # undo compile_repeated_blocks: the next case compiles afresh
        for block in model.transformer_blocks:
            block._compiled_call_impl = None
    return out, codes


def difference(a: torch.Tensor, b: torch.Tensor) -> Dict[str, Any]:
    """Equality, and where unequal: how many elements differ and the first
    (:func:`helpers.reliability.first_difference`), the largest |a - b| and how many tokens differ."""
    if torch.equal(a, b):
        return {"equal": True}
    return {"equal": False, "where": first_difference(a, b), "max_abs": float((a.float() - b.float()).abs().max()),
            "tokens_differing": int((a != b).reshape(-1, a.shape[-1]).any(-1).sum())}


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_logs/inductor_diff", help="directory for the code and summary")
    parser.add_argument("--zero-cond-t", action="store_true", help="the zero_cond_t model")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a small model")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    args = parser.parse_args(argv)
    import qwen_resnorm_fp4.integrations.diffusers as qd

    os.makedirs(args.out, exist_ok=True)
    model, inp = build(args.zero_cond_t, args.device)
    summary: Dict[str, Any] = {"torch": torch.__version__, "device": torch.cuda.get_device_name()
                               if args.device == "cuda" else "cpu"}
    eager = {}
    for mode in ("fused", "unfused"):
        qd.set_mode(model, mode)
        with torch.no_grad():
            eager[mode] = model(**inp)[0].clone()
    summary["eager fused vs unfused"] = difference(eager["fused"], eager["unfused"])
    for case in args.cases.split(","):
        regional, options = CASES[case]
        outs, codes = {}, {}
        for mode in ("fused", "unfused", "fused_again"):  # fused_again: does one mode repeat across compilations?
            qd.set_mode(model, mode.split("_")[0])
            outs[mode], codes[mode] = compiled_output(model, inp, regional, options)
        write_compilations(codes, os.path.join(args.out, case))
        summary[case] = {"fused vs unfused": difference(outs["fused"], outs["unfused"]),
                         "fused vs fused compiled again": difference(outs["fused"], outs["fused_again"]),
                         "fused vs eager": difference(outs["fused"], eager["fused"]),
                         # per compilation, its kernels by inductor's deterministic mode (GPU: all True)
                         "kernels deterministic (True / False)": {
                             mode: list(deterministic_flags(code).values()) for mode, code in codes.items()}}
        print(case, json.dumps(summary[case]), flush=True)
    qd.set_mode(model, "fused")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

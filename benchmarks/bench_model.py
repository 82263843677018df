#!/usr/bin/env python
"""A converted diffusers Qwen-Image transformer against BF16 (docs/performance.md, "A converted Qwen-Image
transformer"). GPU only; needs diffusers.

    python benchmarks/bench_model.py --out DIR          # 4 blocks, 1328x1328 and 1024x1024, batch 1 and 2

A real-width ``QwenImageTransformer2DModel`` (random weights, ``--layers`` blocks, width 3072) at 1328x1328
(6889 image tokens) and 1024x1024 (4096), batch 1 and 2: forward time of the BF16 model and of the converted
model fused and unfused (:func:`qwen_resnorm_fp4.integrations.diffusers.set_mode`), for ``linears="fc1"`` and
``linears="all"``. Timing: :func:`timing.flushed_per_call_us`. The fused and unfused outputs must be
byte-identical in every case (exit status 1 otherwise). Writes ``bench_model.{csv,md}``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional, Sequence

import torch

import harness
import results
import timing

PROG = "bench_model"
#: (name, latent tokens per side after the 2x2 patchify): 1328 / 8 / 2 = 83, 1024 / 8 / 2 = 64.
RESOLUTIONS = (("1328x1328", 83), ("1024x1024", 64))
LINEARS = ("fc1", "all")


def model_inputs(batch: int, side: int, text_len: int, seed: int) -> Dict[str, Any]:
    """``model.forward`` keyword arguments of one case (random latents and text, a shorter second prompt)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, text_len, dtype=torch.bool)
    if batch > 1:
        mask[1, text_len // 2:] = False  # a shorter negative prompt
    return dict(
        hidden_states=torch.randn(batch, side * side, 64, generator=g).bfloat16().cuda(),
        encoder_hidden_states=torch.randn(batch, text_len, 3584, generator=g).bfloat16().cuda(),
        encoder_hidden_states_mask=mask.cuda(),
        timestep=torch.rand(batch, generator=g).cuda(),
        img_shapes=[[(1, side, side)]] * batch,
        return_dict=False,
    )


def table_lines(rows: List[Dict[str, Any]]) -> List[str]:
    columns = ("resolution", "batch", "linears", "bf16 ms", "fused ms", "unfused ms", "fused / bf16", "fused == unfused",
               "rel err vs bf16")
    return results.markdown_table(columns, (
        (f"{r['resolution']} ({r['image_tokens']} tokens)", r["batch"], r["linears"], f"{r['bf16_ms']:.2f}",
         f"{r['fused_ms']:.2f}", f"{r['unfused_ms']:.2f}", f"{r['fused_over_bf16']:.2f}x",
         results.yes_no(r.get("fused_equals_unfused")), f"{r['rel_err_vs_bf16']:.3f}")
        for r in rows))


def byte_check_failures(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """Every case whose fused and unfused outputs differed (or were not compared)."""
    return results.check_failures(rows, ["fused_equals_unfused"],
                                  lambda r: f"{r['resolution']} batch {r['batch']} linears={r['linears']}")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="diffusers Qwen-Image transformer: BF16 vs converted (GPU "
                                "only). Writes bench_model.{csv,md}.")
    p.add_argument("--layers", type=harness.positive_int, default=4,
                   help="transformer blocks (default 4; Qwen-Image has 60)")
    p.add_argument("--text-len", type=harness.positive_int, default=128, help="text tokens (default 128)")
    p.add_argument("--reps", type=harness.positive_int, default=10, help="timed forwards per case (default 10)")
    p.add_argument("--warmup", type=harness.positive_int, default=3, help="untimed forwards first (default 3)")
    p.add_argument("--quick", action="store_true", help="1024x1024, batch 1 only, 3 timed forwards")
    harness.add_out_argument(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if (rc := harness.refuse_without_gpu(PROG)) is not None:
        return rc
    from qwen_resnorm_fp4.integrations import diffusers as qd

    qd.hide_unimportable_flashinfer()  # diffusers' models import next to a headers-only flashinfer
    from diffusers import QwenImageTransformer2DModel

    reps = 3 if args.quick else args.reps
    resolutions = RESOLUTIONS[1:] if args.quick else RESOLUTIONS
    batches = (1,) if args.quick else (1, 2)
    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(num_layers=args.layers, attention_head_dim=128, num_attention_heads=24,
                                        joint_attention_dim=3584).to(device="cuda", dtype=torch.bfloat16).eval()
    header = harness.run_header() + [
        f"QwenImageTransformer2DModel, {args.layers} blocks, width 3072, random weights, {args.text_len} text "
        f"tokens; forward time, CUDA events, median of {reps} (cold L2); calibration on each case's own inputs"]
    print("\n".join(header))
    flush = timing.l2_flush_buffer()

    def forward_ms(inp: Dict[str, Any]) -> float:
        return timing.flushed_per_call_us(lambda: model(**inp), reps, args.warmup, flush) / 1e3

    rows: List[Dict[str, Any]] = []
    with torch.inference_mode():
        for res_name, side in resolutions:
            for batch in batches:
                inp = model_inputs(batch, side, args.text_len, seed=batch)
                bf16_ms = forward_ms(inp)
                bf16_out = model(**inp)[0]
                for linears in LINEARS:
                    qd.convert_transformer(model, mode="fused", calibration_inputs=inp, linears=linears)
                    fused_ms = forward_ms(inp)
                    fused = model(**inp)[0]
                    qd.set_mode(model, "unfused")
                    unfused_ms = forward_ms(inp)
                    unfused = model(**inp)[0]
                    qd.restore_transformer(model)
                    err = ((fused.float() - bf16_out.float()).norm() / bf16_out.float().norm()).item()
                    rows.append({"resolution": res_name, "image_tokens": side * side, "batch": batch,
                                 "linears": linears, "bf16_ms": bf16_ms, "fused_ms": fused_ms,
                                 "unfused_ms": unfused_ms, "fused_over_bf16": fused_ms / bf16_ms,
                                 "fused_equals_unfused": results.outputs_equal(fused, unfused),
                                 "rel_err_vs_bf16": err})
                    del fused, unfused
                del bf16_out, inp
                torch.cuda.empty_cache()
    lines = table_lines(rows)
    print("\n".join(lines))
    results.write_report(args.out, "bench_model", rows, ["# bench_model", ""] + [f"- {h}" for h in header] + [""] + lines)
    return results.exit_status(byte_check_failures(rows), "fused and unfused model outputs differ")


if __name__ == "__main__":
    sys.exit(main())

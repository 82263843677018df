#!/usr/bin/env python
"""A converted Qwen-Image under diffusers' context parallelism on several GPUs, against one GPU.

    torchrun --nproc-per-node 2 scripts/context_parallel_check.py --out cp_results

What it does, on every rank (NCCL, one GPU a rank):

1. builds a real-width ``QwenImageTransformer2DModel`` (24 heads x 128 = 3072, ``--layers`` blocks, random
   weights from ``--seed``, the same on every rank; zero_cond_t with a condition image whose modulate_index
   boundary falls inside the last rank's shard), calibrates its input scales (``--format``) on the whole sequence and
   converts it (``--format``, ``--linears``; ``mode="fused"``);
2. rank 0 runs that model on its own GPU: the single-GPU reference, broadcast to every rank;
3. for each of ``--configs`` (``ulysses``: ``ContextParallelConfig(ulysses_degree=N)``; ``ring``:
   ``ring_degree=N``), a fresh converted model (same weights, same scales) under ``enable_parallelism``:
   the output against the reference (relative error within ``--tolerance``), fused == unfused bytes,
   ``fused_path_stats`` without fallbacks, every processor holding the model's ``_parallel_config``, and the
   control (processors stripped of ``_parallel_config``: each rank attends to its own shard) outside the
   tolerance;
4. the forward time per step (CUDA events, median of ``--iters`` after ``--warmup``) of the single-GPU model
   on rank 0 alone and of each parallel configuration on all ranks;
5. rank 0 writes ``context_parallel.json`` and ``context_parallel.md`` to ``--out``; the exit status is 0 when
   every check passed.

Inputs: batch 1 and batch 2 (classifier-free guidance; the second sample's text padded at its end). The ring
configuration runs without a text mask: diffusers 0.42.1's ring attention applies the local mask to every
rotated key/value chunk, so a padded mask is not served there (Ulysses gathers the mask and is checked with
it). Ring attention needs an attention backend that returns the log-sum-exp (``--ring-backend``, default
``_native_cudnn``; ``_native_flash`` also does); Ulysses runs on ``--ulysses-backend`` (default ``native``).

``--device cpu`` (gloo, the CPU reference, ``--heads 2 --head-dim 32``) runs the same script on a machine
without GPUs, for the Ulysses configuration (no CPU backend returns the log-sum-exp that ring needs).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
if (ROOT / "qwen_resnorm_fp4" / "__init__.py").is_file() and (
        any((ROOT / "qwen_resnorm_fp4").glob("_C*.so")) or importlib.util.find_spec("qwen_resnorm_fp4") is None):
    sys.path.insert(0, str(ROOT))  # this checkout's build, not another installed copy

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

#: The CPU test's tolerance (tests/integrations/test_context_parallel.py TOLERANCE, calibrated there).
DEFAULT_TOLERANCE = 2e-3
QK_NORMS = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")
PATCH, OUT_CHANNELS = 2, 16


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="directory for context_parallel.{json,md}")
    p.add_argument("--configs", default="ulysses,ring", help="comma-separated: ulysses, ring")
    p.add_argument("--format", default="nvfp4", choices=("nvfp4", "fp8"), help="convert_transformer's format")
    p.add_argument("--linears", default="fc1", choices=("fc1", "all"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=24)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--target", default="64x64", help="target latent tokens HxW (after patching)")
    p.add_argument("--condition", default="32x64", help="condition image tokens HxW (zero_cond_t); 0 for none")
    p.add_argument("--text", type=int, default=78, help="text tokens (a multiple of the world size)")
    p.add_argument("--qk-norm-scale", type=float, default=4.0,
                   help="multiplies the QK-norm weights (as the CPU test): the control's error stands out")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    p.add_argument("--timing-batch", type=int, default=1)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--ulysses-backend", default="native")
    p.add_argument("--ring-backend", default="_native_cudnn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    return p


# ------------------------------------------------------------------------------------------------------------
# Model, inputs, conversion
# ------------------------------------------------------------------------------------------------------------


def _hw(s: str) -> Tuple[int, int]:
    h, w = (int(v) for v in s.lower().split("x"))
    return h, w


def image_shapes(args) -> List[Tuple[int, int, int]]:
    shapes = [(1, *_hw(args.target))]
    if args.condition not in ("0", ""):
        shapes.append((1, *_hw(args.condition)))
    return shapes


def build_model(args, device: torch.device):
    """The same weights on every rank: made on the CPU from the seed, then moved."""
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(args.seed)
    small = args.head_dim < 64
    model = QwenImageTransformer2DModel(
        patch_size=PATCH, in_channels=64, out_channels=OUT_CHANNELS, num_layers=args.layers,
        attention_head_dim=args.head_dim,
        num_attention_heads=args.heads, joint_attention_dim=32 if small else 3584,
        axes_dims_rope=(8, 12, 12) if small else (16, 56, 56), zero_cond_t=len(image_shapes(args)) > 1)
    with torch.no_grad():
        for m in model.modules():
            for name in QK_NORMS:
                norm = getattr(m, name, None)
                if isinstance(getattr(norm, "weight", None), torch.Tensor):
                    norm.weight.mul_(args.qk_norm_scale)
    return model.to(device=device, dtype=torch.bfloat16).eval()


def make_inputs(args, batch: int, masked: bool, device: torch.device, seed: int) -> Dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    shapes = image_shapes(args)
    tokens = sum(f * h * w for f, h, w in shapes)
    mask = torch.ones(batch, args.text, dtype=torch.bool)
    if batch > 1 and masked:
        mask[1, args.text - args.text // 4:] = False  # the negative prompt is shorter: padding tokens
    txt_dim = 32 if args.head_dim < 64 else 3584
    return dict(hidden_states=torch.randn(batch, tokens, 64, generator=g).to(torch.bfloat16).to(device),
                encoder_hidden_states=torch.randn(batch, args.text, txt_dim, generator=g).to(torch.bfloat16).to(device),
                encoder_hidden_states_mask=mask.to(device) if masked else None,
                timestep=torch.rand(batch, generator=g).to(device), img_shapes=[shapes] * batch, return_dict=False)


def convert(model, args, input_amax: Dict[str, float], allow_cpu: bool):
    import qwen_resnorm_fp4.integrations.diffusers as qd

    return qd.convert_transformer(model, mode="fused", linears=args.linears, input_amax=input_amax,
                                  allow_cpu=allow_cpu, keep_original=False, format=args.format)


def processors(model) -> List[Any]:
    return [m.processor for m in model.modules()
            if getattr(m, "processor", None) is not None and hasattr(m.processor, "_parallel_config")]


def enable(model, kind: str, world: int, args, device: torch.device) -> None:
    from diffusers import ContextParallelConfig

    model.set_attention_backend(args.ulysses_backend if kind == "ulysses" else args.ring_backend)
    degree = dict(ulysses_degree=world) if kind == "ulysses" else dict(ring_degree=world)
    if device.type == "cpu":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world, 1) if kind == "ring" else (1, world),
                                mesh_dim_names=("ring", "ulysses"))
        # diffusers 0.42.1 computes rank % torch.accelerator.device_count(), 0 without an accelerator
        with mock.patch.object(torch.accelerator, "device_count", lambda: 1):
            model.enable_parallelism(config=ContextParallelConfig(**degree, mesh=mesh))
    else:
        model.enable_parallelism(config=ContextParallelConfig(**degree))


# ------------------------------------------------------------------------------------------------------------
# Running and timing
# ------------------------------------------------------------------------------------------------------------


def forward(model, inp) -> torch.Tensor:
    with torch.no_grad():
        return model(**inp)[0]


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref.float()).norm() / ref.float().norm()).item()


def median_ms(fn: Callable[[], Any], iters: int, warmup: int, device: torch.device) -> float:
    """Median time of fn() in milliseconds: CUDA events around each call on a GPU, perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def broadcast_from_rank0(t: Optional[torch.Tensor], shape: torch.Size, device: torch.device) -> torch.Tensor:
    if t is None:
        t = torch.empty(shape, dtype=torch.bfloat16, device=device)
    dist.broadcast(t, src=0)
    return t


def all_ranks(obj: Any) -> List[Any]:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# ------------------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------------------


def environment(device: torch.device) -> Dict[str, Any]:
    import diffusers
    import qwen_resnorm_fp4
    from qwen_resnorm_fp4 import _library

    env = dict(torch=torch.__version__, diffusers=diffusers.__version__, python=platform.python_version(),
               qwen_resnorm_fp4=os.path.dirname(qwen_resnorm_fp4.__file__), library=_library.status(),
               world_size=dist.get_world_size(), backend=str(dist.get_backend()))
    if device.type == "cuda":
        env["gpus"] = all_ranks(torch.cuda.get_device_name(device))
    return env


def check_config(kind: str, args, device: torch.device, amax: Dict[str, float],
                 references: Dict[Tuple[int, bool], torch.Tensor], inputs: Dict[Tuple[int, bool], Dict[str, Any]],
                 segments: int) -> Dict[str, Any]:
    import qwen_resnorm_fp4.integrations.diffusers as qd

    world = dist.get_world_size()
    model = convert(build_model(args, device), args, amax, allow_cpu=device.type == "cpu")
    enable(model, kind, world, args, device)
    masked = kind == "ulysses"
    out: Dict[str, Any] = dict(config=f"{kind}_degree={world}",
                               parallel_config_kept=all(p._parallel_config is model._parallel_config
                                                        for p in processors(model)))
    cases = []
    for batch in (1, 2):
        inp = inputs[(batch, masked)]
        ref = references[(batch, masked)]
        qd.set_mode(model, "fused")
        qd.fused_path_stats(model, reset=True)
        fused = forward(model, inp)
        stats = qd.fused_path_stats(model, reset=True)
        qd.set_mode(model, "unfused")
        unfused = forward(model, inp)
        qd.set_mode(model, "fused")
        saved = [(p, p._parallel_config) for p in processors(model)]
        for p, _ in saved:
            p._parallel_config = None
        control = forward(model, inp)
        for p, config in saved:
            p._parallel_config = config
        cases.append(dict(batch=batch, masked=masked, rel_err=rel_err(fused, ref),
                          control_rel_err=rel_err(control, ref),
                          fused_equals_unfused=bool(torch.equal(fused, unfused)),
                          fused=stats["fused"], fallback=stats["fallback"], decline_reasons=stats["decline_reasons"],
                          segments=segments))
    out["cases"] = cases
    tinp = inputs[(args.timing_batch, False)]
    dist.barrier()
    out["ms_per_step"] = median_ms(lambda m=model: forward(m, tinp), args.iters, args.warmup, device)
    del model
    return out


def passed(rank_results: List[Dict[str, Any]], tolerance: float) -> Tuple[bool, List[str]]:
    problems = []
    for rank, r in enumerate(rank_results):
        if not r["parallel_config_kept"]:
            problems.append(f"{r['config']} rank {rank}: a processor lost _parallel_config")
        for c in r["cases"]:
            where = f"{r['config']} rank {rank} batch {c['batch']}"
            if not c["rel_err"] < tolerance:
                problems.append(f"{where}: rel. error {c['rel_err']:.3e} >= {tolerance}")
            if not c["control_rel_err"] > tolerance:
                problems.append(f"{where}: control rel. error {c['control_rel_err']:.3e} <= {tolerance}")
            if not c["fused_equals_unfused"]:
                problems.append(f"{where}: fused and unfused bytes differ")
            if c["fallback"] or c["fused"] != c["segments"]:
                problems.append(f"{where}: fused {c['fused']} of {c['segments']}, fallbacks {c['decline_reasons']}")
    return not problems, problems


def markdown(report: Dict[str, Any]) -> str:
    env = report["environment"]
    lines = [f"Context parallelism: converted Qwen-Image ({report['model']}), {report['format']}, "
             f"linears={report['linears']}, world size {env['world_size']} ({env['backend']}); torch {env['torch']}, "
             f"diffusers {env['diffusers']}; GPUs: {', '.join(env.get('gpus', ['cpu']))}.", "",
             f"Tolerance {report['tolerance']:.1e} (relative error against the single-GPU converted model).", "",
             "| configuration | batch | rel. error (max over ranks) | control rel. error (min) | fused == unfused "
             "(every rank) | fused / segments, fallbacks |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, ranks in report["configs"].items():
        for i, c0 in enumerate(ranks[0]["cases"]):
            cs = [r["cases"][i] for r in ranks]
            lines.append(f"| {name} | {c0['batch']}{' (masked text)' if c0['masked'] and c0['batch'] > 1 else ''} | "
                         f"{max(c['rel_err'] for c in cs):.3e} | {min(c['control_rel_err'] for c in cs):.3e} | "
                         f"{all(c['fused_equals_unfused'] for c in cs)} | "
                         f"{'/'.join(str(c['fused']) for c in cs)} of {c0['segments']}, "
                         f"{sum(c['fallback'] for c in cs)} |")
    single = report["single_gpu_ms_per_step"]
    clock = "CUDA events" if "gpus" in env else "perf_counter, CPU"
    lines += ["", f"Forward time per step, batch {report['timing_batch']} (median of {report['iters']}; {clock}):",
              "", "| run | ms per step (slowest rank) | vs one device |", "| --- | --- | --- |",
              f"| one device (rank 0 alone) | {single:.2f} | 1.00x |"]
    for name, ranks in report["configs"].items():
        ms = max(r["ms_per_step"] for r in ranks)
        lines.append(f"| {name} | {ms:.2f} | {single / ms:.2f}x |")
    lines += ["", "PASS" if report["passed"] else "FAIL: " + "; ".join(report["problems"]), ""]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    if any(c not in ("ulysses", "ring") for c in configs):
        raise SystemExit(f"--configs: ulysses and/or ring, got {args.configs!r}")
    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(minutes=10))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        import diffusers.utils.logging as dlog
        import qwen_resnorm_fp4.integrations.diffusers as qd

        dlog.set_verbosity_error()
        tokens = sum(f * h * w for f, h, w in image_shapes(args))
        if tokens % world:
            raise SystemExit(f"--target/--condition: {tokens} image tokens do not split into {world} shards")
        if args.text % world:
            raise SystemExit(f"--text {args.text} does not split into {world} shards")
        inputs = {(b, m): make_inputs(args, b, m, device, seed=10 + b) for b in (1, 2) for m in (True, False)}
        inputs.setdefault((args.timing_batch, False), make_inputs(args, args.timing_batch, False, device, seed=20))

        base = build_model(args, device)
        amax = qd.calibrate_input_amax(base, [inputs[(2, True)]], args.linears, args.format)  # the whole sequence
        single = convert(base, args, amax, allow_cpu=device.type == "cpu")
        segments = qd.conversion_info(single).segments_per_forward
        references, single_ms = {}, 0.0
        for key, inp in inputs.items():
            ref = forward(single, inp) if rank == 0 else None
            shape = torch.Size([*inp["hidden_states"].shape[:2], PATCH * PATCH * OUT_CHANNELS])
            references[key] = broadcast_from_rank0(ref, shape, device)
        if rank == 0:
            single_ms = median_ms(lambda m=single: forward(m, inputs[(args.timing_batch, False)]), args.iters,
                                  args.warmup, device)
        single_stats = qd.fused_path_stats(single)
        del single, base
        dist.barrier()

        results = {}
        for kind in configs:
            r = check_config(kind, args, device, amax, references, inputs, segments)
            results[r["config"]] = all_ranks(r)
        env = environment(device)
        if rank == 0:
            ok, problems = passed([r for ranks in results.values() for r in ranks], args.tolerance)
            if single_stats["fallback"]:
                ok, problems = False, problems + [f"single GPU: fallbacks {single_stats['decline_reasons']}"]
            report = dict(model=f"{args.heads} heads x {args.head_dim}, {args.layers} blocks, image "
                                f"{'+'.join(f'{h}x{w}' for _, h, w in image_shapes(args))} tokens, text {args.text}",
                          format=args.format, linears=args.linears, tolerance=args.tolerance,
                          timing_batch=args.timing_batch, iters=args.iters, environment=env,
                          single_gpu_ms_per_step=single_ms, configs=results, passed=ok, problems=problems)
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "context_parallel.json").write_text(json.dumps(report, indent=2) + "\n")
            md = markdown(report)
            (args.out / "context_parallel.md").write_text(md)
            print(md)
            status = 0 if ok else 1
        else:
            status = 0
        status = max(all_ranks(status))
    finally:
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())

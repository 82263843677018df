"""Converted transformers under diffusers' context parallelism: two CPU processes over gloo, Ulysses degree 2.

One spawn runs every case (process start-up is most of the cost): in each of two processes, a small model is
built from a seed (the same weights in both), converted (NVFP4 FC1, ``mode="fused"``, the CPU reference via
``allow_cpu``), run once unsharded (the one-process result), then put under
``enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))`` and run again. Cases:

- Qwen-Image, zero_cond_t off and on, batch 1 and 2, text of 8 tokens with padding in sample 1 (batch 2):
  24 image tokens, 12 a rank; with zero_cond_t the condition image starts at token 16, so the modulate_index
  boundary falls inside rank 1's shard, and rank 1 also holds the padded text tokens;
- Wan with a timestep per token (random, batch 2), and TI2V-style: one [1, S] timestep (the first frame 0)
  expanded to [B, S] (stride 0 in the batch), as the Wan 2.2 TI2V pipeline passes it.

Asserted on every rank: the sharded output equals the one-process output within :data:`TOLERANCE`; fused ==
unfused bytes under sharding; ``fused_path_stats`` counts every segment fused, no fallback; the attention
processors keep the model's ``_parallel_config``; and the control, the same sharded model with its processors
stripped of ``_parallel_config`` (each rank attends to its own shard only), fails the tolerance. The QK-norm
weights are scaled by :data:`QK_NORM_SCALE` so that the control's error stands out. Converting a model after
``enable_parallelism`` is refused with an error naming the order.

How the tolerance was set: the errors and the controls were measured first (the values at TOLERANCE), then
the tolerance put well above every error and well below every control.

Skips only when diffusers is missing or lacks context parallelism (``ContextParallelConfig``). diffusers 0.42.1
derives the device from ``rank % torch.accelerator.device_count()``, which is 0 on a machine without an
accelerator: the workers make it 1 during ``enable_parallelism`` there, and pass a CPU device mesh explicitly
so that a machine with a GPU also runs this test on CPU tensors over gloo.
"""

from __future__ import annotations

import datetime
import inspect
import os
import socket
import traceback
from typing import Any, Callable, Dict, List, Tuple
from unittest import mock

import pytest
import torch

from helpers.session import HANG_GUARD_S
from helpers.diffusers_models import SKIP_REASON

#: rel_err(sharded, one process) must stay below this. Measured (diffusers 0.42.1, torch 2.14.1, CPU, gloo):
#: 0.0 in every case here (at this size the shards reproduce the one-process bytes); 4.3e-6 on a width-3072
#: Qwen-Image (24 heads x 128, 1 block, 96 image and 16 text tokens, zero_cond_t, batch 2); 1.0e-3 reported in
#: issue 41 for a width-3072 run. The tolerance is 2x the largest of these; the controls measured 4.9e-2 to
#: 8.8e-2 here (1.9e-2 at width 3072), at least 24x above it.
TOLERANCE = 2e-3
#: The QK-norm weights are multiplied by this: sharper attention, so that attending to one shard only shows.
QK_NORM_SCALE = 4.0
WORLD_SIZE = 2
#: Seconds the two processes get in all before they are killed (they take about 10 s on two idle cores): a hang
#: guard, not a time limit, so a loaded machine passes too.
DEADLINE_S = HANG_GUARD_S
#: Seconds a gloo collective waits for the other rank before it fails (a rank that died): far above the time one
#: rank may run ahead of the other on a loaded machine.
COLLECTIVE_TIMEOUT_S = 600


def _context_parallel_skip_reason():
    if SKIP_REASON is not None:
        return SKIP_REASON
    try:
        from diffusers import ContextParallelConfig  # noqa: F401
        from diffusers.models.modeling_utils import ModelMixin
    except ImportError as e:
        return f"diffusers has no context parallelism ({e})"
    if not hasattr(ModelMixin, "enable_parallelism"):
        return "diffusers has no ModelMixin.enable_parallelism"
    if not torch.distributed.is_available():
        return "torch.distributed is not available"
    return None


CP_SKIP_REASON = _context_parallel_skip_reason()
pytestmark = pytest.mark.skipif(CP_SKIP_REASON is not None, reason=CP_SKIP_REASON or "")


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref.float()).norm() / ref.float().norm()).item()


# ------------------------------------------------------------------------------------------------------------
# Models and inputs (the same in both processes: seeded)
# ------------------------------------------------------------------------------------------------------------


def _scale_qk_norms(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for m in model.modules():
            for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
                norm = getattr(m, name, None)
                if isinstance(getattr(norm, "weight", None), torch.Tensor):
                    norm.weight.mul_(QK_NORM_SCALE)


def _qwen_case(zero_cond_t: bool, batch: int) -> Tuple[torch.nn.Module, Dict[str, Any], List[Dict[str, Any]], int]:
    from helpers.diffusers_models import SMALL_LAYERS, build_small, calibration, make_inputs

    model = build_small(zero_cond_t)
    _scale_qk_norms(model)
    inp = make_inputs(batch, 8, zero_cond_t, small=True, seed=31 + batch)  # batch 2: sample 1 padded from token 5
    return model, inp, calibration(zero_cond_t), 2 * SMALL_LAYERS


def _wan_case(expanded: bool) -> Tuple[torch.nn.Module, Dict[str, Any], List[Dict[str, Any]], int]:
    from helpers.diffusers_models import wan

    layers = 2
    model, (inp,), segments = wan(2, 32, 128, layers, True)  # batch 2, 2 frames of 4x4 tokens: 32 tokens
    _scale_qk_norms(model)
    if expanded:  # TI2V: the first frame's tokens at timestep 0, one [1, S] row expanded over the batch
        b, s = inp["timestep"].shape
        row = torch.full((1, s), 700.0)
        row[:, : s // 2] = 0.0
        inp = dict(inp, timestep=row.expand(b, s))
    calib = [dict(inp)]
    return model, inp, calib, segments


CASES: Dict[str, Callable[[], Tuple[torch.nn.Module, Dict[str, Any], List[Dict[str, Any]], int]]] = {
    "qwen_image-b1": lambda: _qwen_case(False, 1),
    "qwen_image-b2-masked": lambda: _qwen_case(False, 2),
    "qwen_image-zero_cond_t-b1": lambda: _qwen_case(True, 1),
    "qwen_image-zero_cond_t-b2-masked": lambda: _qwen_case(True, 2),
    "wan-per_token": lambda: _wan_case(False),
    "wan-ti2v_expanded": lambda: _wan_case(True),
}


# ------------------------------------------------------------------------------------------------------------
# The worker (one per rank)
# ------------------------------------------------------------------------------------------------------------


def _processors(model: torch.nn.Module) -> List[Any]:
    return [m.processor for m in model.modules()
            if getattr(m, "processor", None) is not None and hasattr(m.processor, "_parallel_config")]


def _enable_ulysses(model: torch.nn.Module) -> None:
    from diffusers import ContextParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1, WORLD_SIZE), mesh_dim_names=("ring", "ulysses"))
    config = ContextParallelConfig(ulysses_degree=WORLD_SIZE, mesh=mesh)
    # diffusers 0.42.1 computes rank % torch.accelerator.device_count(), 0 without an accelerator
    count = max(torch.accelerator.device_count(), 1)
    with mock.patch.object(torch.accelerator, "device_count", lambda: count):
        model.enable_parallelism(config=config)


def _run(model: torch.nn.Module, inp: Dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inp)[0]


def _run_case(name: str) -> Dict[str, Any]:
    import qwen_resnorm_fp4.integrations.diffusers as qd

    model, inp, calib, segments = CASES[name]()
    block_class = type(next(m for m in model.modules() if type(m).__name__.endswith(("TransformerBlock",))))
    qd.convert_transformer(model, mode="fused", calibration_inputs=calib, allow_cpu=True)
    converted = next(m for m in model.modules() if isinstance(m, block_class))
    signature_kept = (list(inspect.signature(converted.forward).parameters)
                      == list(inspect.signature(block_class.forward).parameters)[1:])
    reference = _run(model, inp)
    qd.fused_path_stats(model, reset=True)

    _enable_ulysses(model)
    kept = [p._parallel_config is model._parallel_config for p in _processors(model)]
    fused = _run(model, inp)
    stats = qd.fused_path_stats(model, reset=True)
    qd.set_mode(model, "unfused")
    unfused = _run(model, inp)
    unfused_stats = qd.fused_path_stats(model, reset=True)
    qd.set_mode(model, "fused")
    for p in _processors(model):
        p._parallel_config = None
    control = _run(model, inp)
    return dict(err=rel_err(fused, reference), control_err=rel_err(control, reference),
                fused_equals_unfused=torch.equal(fused, unfused), stats=stats, unfused_stats=unfused_stats,
                segments=segments, processors=len(kept), parallel_config_kept=all(kept),
                signature_kept=signature_kept, shape=tuple(fused.shape), reference_shape=tuple(reference.shape))


def _conversion_after_parallelism() -> str:
    """The error of converting a model that already runs under enable_parallelism ('' when none)."""
    import qwen_resnorm_fp4.integrations.diffusers as qd
    from helpers.diffusers_models import build_small, calibration

    model = build_small(False)
    _enable_ulysses(model)
    try:
        qd.convert_transformer(model, calibration_inputs=calibration(False), allow_cpu=True)
    except ValueError as e:
        return str(e)
    return ""


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    results: Dict[str, Any] = {}
    try:
        torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE,
                                             timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    except Exception:  # noqa: BLE001 - e.g. the port taken meanwhile: reported by the fixture
        torch.save({"setup": traceback.format_exc()}, os.path.join(out_dir, f"rank{rank}.pt"))
        raise
    try:
        import diffusers.utils.logging as dlog

        dlog.set_verbosity_error()  # enable_parallelism's "experimental" warning, once per case
        for name in CASES:
            try:
                results[name] = _run_case(name)
            except Exception:  # noqa: BLE001 - reported by the test of that case
                results[name] = {"error": traceback.format_exc()}
        try:
            results["refusal"] = _conversion_after_parallelism()
        except Exception:  # noqa: BLE001
            results["refusal"] = {"error": traceback.format_exc()}
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> List[Dict[str, Any]]:
    """Both ranks' results: {case: {...}, "refusal": message}."""
    import torch.multiprocessing as mp

    out_dir = str(tmp_path_factory.mktemp("context_parallel"))
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(rank, port, out_dir), daemon=True) for rank in range(WORLD_SIZE)]
    for p in procs:
        p.start()
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=DEADLINE_S)
    for p in procs:
        p.join(max((deadline - datetime.datetime.now()).total_seconds(), 0.1))
    hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    assert not hung, f"ranks {hung} still running after {DEADLINE_S} s: killed"
    paths = [os.path.join(out_dir, f"rank{rank}.pt") for rank in range(WORLD_SIZE)]
    results = [torch.load(path, weights_only=False) if os.path.exists(path) else {} for path in paths]
    for rank, r in enumerate(results):
        assert "setup" not in r, f"rank {rank} could not join the process group:\n{r['setup']}"
    codes = [p.exitcode for p in procs]
    assert codes == [0] * WORLD_SIZE, f"worker exit codes {codes}"
    return results


def _case(ranks: List[Dict[str, Any]], name: str) -> List[Dict[str, Any]]:
    for rank, r in enumerate(ranks):
        assert "error" not in r[name], f"rank {rank}, {name}:\n{r[name]['error']}"
    return [r[name] for r in ranks]


# ------------------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_matches_one_process(ranks, name):
    for rank, r in enumerate(_case(ranks, name)):
        assert r["shape"] == r["reference_shape"], (rank, r["shape"], r["reference_shape"])
        assert r["err"] < TOLERANCE, f"rank {rank}: rel. error {r['err']:.3e} >= {TOLERANCE}"


@pytest.mark.parametrize("name", list(CASES))
def test_control_without_parallel_config_fails_tolerance(ranks, name):
    for rank, r in enumerate(_case(ranks, name)):
        assert r["control_err"] > TOLERANCE, f"rank {rank}: control rel. error {r['control_err']:.3e}"


@pytest.mark.parametrize("name", list(CASES))
def test_every_shard_fused_no_fallback(ranks, name):
    for rank, r in enumerate(_case(ranks, name)):
        n = r["segments"]
        assert r["stats"] == {"fused": n, "unfused": 0, "fallback": 0, "decline_reasons": {},
                              "compiled": {}}, (rank, r["stats"])
        assert r["unfused_stats"]["unfused"] == n, (rank, r["unfused_stats"])
        assert r["fused_equals_unfused"], f"rank {rank}: fused and unfused bytes differ under sharding"


@pytest.mark.parametrize("name", list(CASES))
def test_conversion_keeps_hook_contract(ranks, name):
    """The converted block forward keeps diffusers' parameter names (the _cp_plan hooks find inputs by name
    and position), and the processors keep the model's _parallel_config."""
    for rank, r in enumerate(_case(ranks, name)):
        assert r["signature_kept"], rank
        assert r["processors"] > 0 and r["parallel_config_kept"], (rank, r["processors"])


def test_convert_after_enable_parallelism_refused(ranks):
    for rank, r in enumerate(ranks):
        message = r["refusal"]
        assert not isinstance(message, dict), f"rank {rank}:\n{message['error']}"
        assert message, f"rank {rank}: converting after enable_parallelism was not refused"
        assert "enable_parallelism" in message and "Convert first" in message, message

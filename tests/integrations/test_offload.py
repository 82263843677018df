"""Converted models under accelerate's sequential CPU offload (``pipe.enable_sequential_cpu_offload()``), as its
hooks behave: a module with parameters of its own holds them on the meta device except inside its own forward.
The quantized layers' tensors are parameters, so a converted block cannot read a layer's activation scale
before calling the layer: the fused path declines (``device_mismatch``) and the layers quantize their inputs in
their forwards, the same bytes."""

from __future__ import annotations

from typing import Dict

import pytest
import torch

import qwen_resnorm_fp4.integrations.diffusers as qd

from helpers.diffusers_models import SMALL_CASES, needs_diffusers, run

pytestmark = needs_diffusers


def offload_like_accelerate(model: torch.nn.Module) -> None:
    """accelerate's AlignDevicesHook with offloading, in miniature: each module's own parameters live on the meta
    device and are brought back (the kept values) for that module's forward only."""
    for module in model.modules():
        kept: Dict[str, torch.nn.Parameter] = dict(module.named_parameters(recurse=False))
        if not kept:
            continue

        def put(mod, values, kept=kept):
            for name, p in kept.items():
                mod._parameters[name] = torch.nn.Parameter(values(p), requires_grad=p.requires_grad)

        put(module, lambda p: p.detach().to("meta"))
        module.register_forward_pre_hook(lambda mod, args, put=put: put(mod, lambda p: p.detach()))
        module.register_forward_hook(lambda mod, args, out, put=put: put(mod, lambda p: p.detach().to("meta")))


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("case", list(SMALL_CASES))
def test_sequential_offload_gives_the_same_bytes(case, fmt):
    model, inputs, _segments = SMALL_CASES[case]()
    qd.convert_transformer(model, format=fmt, linears="all", calibration_inputs=inputs, allow_cpu=True)
    want = run(model, inputs[0])
    qd.fused_path_stats(model, reset=True)
    offload_like_accelerate(model)
    assert torch.equal(run(model, inputs[0]), want)
    stats = qd.fused_path_stats(model)
    assert stats["fused"] == 0 and set(stats["decline_reasons"]) == {"device_mismatch"}, stats


def test_restore_under_offload_is_refused_and_changes_nothing():
    """restore_transformer would put back BF16 layers without the offload hooks the quantized ones carry: it
    refuses, naming the layer, and the model stays converted and serving the same bytes."""
    model, inputs, _segments = SMALL_CASES["qwen_image_zero_cond_t"]()
    qd.convert_transformer(model, format="fp8", linears="all", calibration_inputs=inputs, allow_cpu=True)
    want = run(model, inputs[0])
    offload_like_accelerate(model)
    with pytest.raises(ValueError, match=r"transformer_blocks\.0\..* has hooks"):
        qd.restore_transformer(model)
    assert qd.conversion_info(model) is not None and torch.equal(run(model, inputs[0]), want)

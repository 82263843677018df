"""The test suite's one input builder of the three ops and the argument tuples made from it.

``make_inputs(B, S, D, form, param_dtype, seed, ...)`` returns a dict keyed by the ops' argument names (random
but deterministic: the same seed gives the same values on every device); ``op_args(inp, op)`` is the positional
argument tuple of ``torch.ops.qwen_fp4.<op>`` for such a dict, ``wrapper_kwargs(inp)`` the typed wrappers'
keyword-only arguments. ``FORMS``: the modulation forms ``make_inputs`` understands.
"""

from __future__ import annotations

from typing import Dict

import torch


#: Modulation forms understood by make_inputs.
FORMS = ("shared", "batch", "token", "indexed_int32", "indexed_int64", "indexed_bool")


def make_inputs(
    B: int,
    S: int,
    D: int,
    form: str = "shared",
    param_dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    *,
    device: str | torch.device = "cpu",
    bias: bool = True,
    affine: bool = False,
    global_scale: float = 200.0,
    eps: float = 1e-6,
    x_std: float = 1.0,
    residual_std: float = 2.0,
    generate_on_device: bool = False,
    strided: bool = False,
) -> Dict[str, object]:
    """Random but deterministic inputs of the three ops, the test suite's one input builder
    (``helpers.reliability.block_inputs`` and the GPU kernel tests call it with their own defaults).

    Generated on CPU, then moved to ``device``, so the same seed gives the same values on every device;
    ``generate_on_device=True`` draws them on ``device`` instead (fast for large GPU cases; other values).

    x, residual: bf16 [B, S, D] with standard deviations ``x_std`` and ``residual_std``. ``form`` picks the
    modulation parameters gate/scale/shift:
      "shared" -> [D]; "batch" -> [B, D]; "token" -> [B, S, D] (per token; ``strided=True``: shift, scale
      and gate are ``temb.chunk(6, dim=2)[:3]`` views of one contiguous temb [B, S, 6D], row stride 6D, the
      other three chunks random, same values as without it); "indexed_<int32|int64|bool>" -> [2B, D] plus
      modulate_index [B, S] of that dtype (about half the tokens non-zero; for the ints, non-zero
      values other than 1 appear too, since the contract says "non-zero", not "1").
    Parameters are ``param_dtype`` (bf16 or fp32). bias: [D] or None; affine: weight/norm_bias [D] or None.
    global_scale: fp32 one-element tensor [1]. Returns a dict keyed by the op's argument names.
    """
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}")
    gen_device = torch.device(device) if generate_on_device else torch.device("cpu")
    g = torch.Generator(device=gen_device).manual_seed(seed)

    def randn(*shape, std=1.0, mean=0.0):
        return torch.randn(*shape, generator=g, device=gen_device) * std + mean

    x = randn(B, S, D, std=x_std).to(torch.bfloat16)
    residual = randn(B, S, D, std=residual_std).to(torch.bfloat16)
    if strided and form != "token":
        raise ValueError("strided=True needs form='token'")
    rows = 1 if form == "shared" else (B if form == "batch" else 2 * B)
    pshape = (D,) if form == "shared" else ((B, S, D) if form == "token" else (rows, D))
    gate = randn(*pshape, std=0.5, mean=0.5).to(param_dtype)
    scale = randn(*pshape, std=0.3).to(param_dtype)
    shift = randn(*pshape, std=0.3).to(param_dtype)
    modulate_index = None
    if form.startswith("indexed"):
        idx = torch.randint(0, 2, (B, S), generator=g, device=gen_device)
        if form == "indexed_bool":
            modulate_index = idx.bool()
        else:
            idx = idx * torch.randint(1, 4, (B, S), generator=g, device=gen_device)  # non-zero values 1..3
            modulate_index = idx.to(torch.int32 if form == "indexed_int32" else torch.int64)
    inp = dict(
        residual=residual,
        x=x,
        bias=randn(D, std=0.2).to(param_dtype) if bias else None,
        gate=gate,
        scale=scale,
        shift=shift,
        global_scale=torch.tensor([global_scale], dtype=torch.float32),
        eps=eps,
        weight=randn(D, std=0.2, mean=1.0).to(param_dtype) if affine else None,
        norm_bias=randn(D, std=0.2).to(param_dtype) if affine else None,
        modulate_index=modulate_index,
    )
    out = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    if strided:  # the views are made on the target device (moving a view would copy it contiguous)
        temb = torch.cat([shift, scale, gate, randn(B, S, 3 * D).to(param_dtype)], dim=2).to(device)
        out["shift"], out["scale"], out["gate"] = temb.chunk(6, dim=2)[:3]
    return out


def op_args(inp: Dict[str, object], op: str, fast_math: bool = True) -> tuple:
    """Positional arguments of ``torch.ops.qwen_fp4.<op>`` (op: "resnorm_quant" or "resnorm") for a
    make_inputs dict (all optional arguments passed explicitly)."""
    common = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"])
    tail = (inp["weight"], inp["norm_bias"], inp["modulate_index"])
    if op == "resnorm_quant":
        return common + (inp["global_scale"], float(inp["eps"]), fast_math) + tail
    if op == "resnorm":
        return common + (float(inp["eps"]),) + tail
    raise ValueError(op)


def wrapper_kwargs(inp: Dict[str, object]) -> Dict[str, object]:
    """Keyword-only arguments of the typed wrappers for a make_inputs dict."""
    return dict(weight=inp["weight"], norm_bias=inp["norm_bias"], modulate_index=inp["modulate_index"])

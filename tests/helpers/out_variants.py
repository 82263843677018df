"""Helpers shared by the out-variant tests (test_out_variants.py on CPU, test_gpu_out_variants.py on CUDA):
inputs with every optional argument, the out-variants' outputs pre-filled with a marker byte, calls of the
ops and the wrappers by name, and memory layouts that make one tensor overlap another.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch

import qwen_resnorm_fp4 as q
from helpers.inputs import make_inputs, op_args
from qwen_resnorm_fp4.layout import round_up

ops = torch.ops.qwen_fp4

#: The out-variants' outputs, by functional op, in the schema's order.
OUTPUTS = {"resnorm_quant": ("packed", "scales", "residual_out"), "resnorm": ("y", "residual_out"),
           "nvfp4_quantize": ("packed", "scales")}
#: The tensor inputs of each op.
INPUTS = {"resnorm_quant": ("residual", "x", "bias", "gate", "scale", "shift", "global_scale", "weight", "norm_bias",
                            "modulate_index"),
          "resnorm": ("residual", "x", "bias", "gate", "scale", "shift", "weight", "norm_bias", "modulate_index"),
          "nvfp4_quantize": ("y", "global_scale")}
#: The byte every output is filled with before a call (so a refused call can be seen to write nothing).
MARKER = 0xAB


def full_inputs(rows: int, cols: int, device="cpu", seed: int = 0, form: str = "indexed_int64", bias: bool = True,
                affine: bool = True, param_dtype=torch.bfloat16) -> Dict[str, object]:
    """make_inputs for ``rows`` rows of ``cols`` (one batch, or two when rows is even and form is not shared),
    plus "y" (= x, nvfp4_quantize's input)."""
    batches = 2 if rows % 2 == 0 and rows > 0 and form != "shared" else 1
    inp = make_inputs(batches, rows // batches, cols, form, param_dtype, seed, device=device, bias=bias,
                      affine=affine, generate_on_device=torch.device(device).type == "cuda")
    inp["y"] = inp["x"]
    return inp


def output_shapes(op: str, like: torch.Tensor) -> Dict[str, Tuple[int, ...]]:
    """The outputs' shapes for inputs like ``like`` [..., D]."""
    d = like.shape[-1]
    rows = like.numel() // d
    quant = {"packed": (rows, d // 2), "scales": (round_up(rows, 128), d // 16)}
    return {name: quant.get(name, tuple(like.shape)) for name in OUTPUTS[op]}


def output_dtype(name: str, scale_dtype=torch.uint8) -> torch.dtype:
    return {"packed": torch.uint8, "scales": scale_dtype}.get(name, torch.bfloat16)


def filled_outputs(op: str, inp: Dict[str, object], scale_dtype=torch.uint8) -> Dict[str, torch.Tensor]:
    """The op's outputs, every byte MARKER."""
    like = inp["x"]
    outs = {}
    for name, shape in output_shapes(op, like).items():
        t = torch.empty(shape, dtype=output_dtype(name, scale_dtype), device=like.device)
        t.view(torch.uint8).fill_(MARKER)
        outs[name] = t
    return outs


def functional(op: str, inp: Dict[str, object], fast: bool = True, code: Optional[int] = None) -> Tuple[torch.Tensor,
                                                                                                        ...]:
    """The functional op's outputs (``code``: nvfp4_4over6_code, passed when given)."""
    tail = () if code is None else (code,)
    if op == "nvfp4_quantize":
        return ops.nvfp4_quantize(inp["y"], inp["global_scale"], fast, *tail)
    args = op_args(inp, op, fast_math=fast)
    if code is not None:
        args = args + (None,) * (12 - len(args)) + tail  # the optional arguments up to nvfp4_4over6_code
    return getattr(ops, op)(*args)


def out_op_args(op: str, inp: Dict[str, object], outs: Dict[str, torch.Tensor], fast: bool = True,
                code: Optional[int] = None) -> tuple:
    """Positional arguments of torch.ops.qwen_fp4.<op>_out (``code``: nvfp4_4over6_code, passed when given)."""
    given = tuple(outs[name] for name in OUTPUTS[op])
    tail = () if code is None else (code,)
    if op == "nvfp4_quantize":
        return (inp["y"], inp["global_scale"], fast) + given + tail
    args = op_args(inp, op, fast_math=fast)
    split = 9 if op == "resnorm_quant" else 7  # the required arguments, then the outputs
    return args[:split] + given + args[split:] + tail


def call_out_op(op: str, inp, outs, fast: bool = True, code: Optional[int] = None) -> None:
    getattr(ops, op + "_out")(*out_op_args(op, inp, outs, fast, code))


def call_out_wrapper(op: str, inp, outs, fast: bool = True) -> tuple:
    """The typed wrapper q.<op>_out; returns what it returns."""
    if op == "nvfp4_quantize":
        return q.nvfp4_quantize_out(inp["y"], inp["global_scale"], fast, **outs)
    extra = dict(weight=inp["weight"], norm_bias=inp["norm_bias"], modulate_index=inp["modulate_index"])
    common = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"])
    if op == "resnorm_quant":
        return q.resnorm_quant_out(*common, inp["global_scale"], inp["eps"], fast, **outs, **extra)
    return q.resnorm_out(*common, inp["eps"], **outs, **extra)


def assert_bytes_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Same shape and the same bytes (a float8 tensor compared with a uint8 one by its bytes)."""
    assert got.shape == want.shape, what
    assert torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8)), what


def output_bytes(outs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A copy of each output's bytes."""
    return {name: t.view(torch.uint8).clone() for name, t in outs.items()}


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def carve(arena: torch.Tensor, offset: int, like: torch.Tensor, values: bool) -> torch.Tensor:
    """A contiguous view of ``arena`` (uint8) at byte ``offset`` with ``like``'s dtype and shape, holding
    like's values when ``values``."""
    n = like.numel() * like.element_size()
    t = arena[offset:offset + n].view(like.dtype).view(like.shape)
    if values:
        t.view(torch.uint8).copy_(as_bytes(like).reshape(t.view(torch.uint8).shape))
    return t


def overlapping_pair(first: torch.Tensor, second: torch.Tensor, first_values: bool, second_values: bool):
    """(first', second', arena): copies of the two layouts in one arena, second' starting inside the last 16
    bytes of first' (both 16-byte aligned), so that their memory overlaps."""
    n_first = first.numel() * first.element_size()
    offset = max(0, (n_first - 1) // 16 * 16)
    size = offset + second.numel() * second.element_size() + 16
    arena = torch.full((max(size, n_first + 16),), MARKER, dtype=torch.uint8, device=first.device)
    a = carve(arena, 0, first, first_values)
    b = carve(arena, offset, second, second_values)
    return a, b, arena


def with_overlap(op: str, inp, outs, out_name: str, other: str, output_first: bool):
    """(inp', outs', arena): the arguments with output ``out_name`` and ``other`` (an input, or another
    output) sharing memory; inputs keep their values."""
    inp, outs = dict(inp), dict(outs)
    other_is_input = other in INPUTS[op]
    src = inp if other_is_input else outs
    first, second = (outs[out_name], src[other]) if output_first else (src[other], outs[out_name])
    fv, sv = (False, other_is_input) if output_first else (other_is_input, False)
    a, b, arena = overlapping_pair(first, second, fv, sv)
    new_out, new_other = (a, b) if output_first else (b, a)
    outs[out_name] = new_out
    src[other] = new_other
    if other == "x":
        inp["y"] = new_other
    if other == "y" and other_is_input:
        inp["x"] = new_other
    return inp, outs, arena


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """t's shape and dtype at an offset of one element from a 16-byte boundary (elements of 1 to 8 bytes)."""
    step = t.element_size()
    buf = torch.empty(t.numel() * step + 32, dtype=torch.uint8, device=t.device)
    start = (16 - buf.data_ptr() % 16) % 16 + step
    return buf[start:start + t.numel() * step].view(t.dtype).view(t.shape)


#: Ways to break an output's static rules: kind -> (a broken copy of the output, the words of the refusal
#: after the output's name, which the Python rules and the C++ checks both say). "device" takes the device.
BROKEN_OUTPUTS = {
    "dtype": (lambda t: torch.empty(t.shape, dtype=torch.int8 if t.dtype == torch.uint8 else torch.float32,
                                    device=t.device), "must be"),
    "shape": (lambda t: torch.empty(t.shape[0] + 1, *t.shape[1:], dtype=t.dtype, device=t.device),
              "must have shape"),
    "contiguity": (lambda t: torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype,
                                         device=t.device)[..., :t.shape[-1]], "must be contiguous"),
    "alignment": (_misaligned, "must be 16-byte aligned"),
}


def assert_each_output_refused(op: str, inp, make, error: type, words: str, call=None) -> None:
    """For each output of ``op`` in turn replaced by ``make(output)``: the call (``call``, default the op)
    raises ``error`` with "<name> <words>", and the other outputs keep their bytes."""
    import pytest

    call = call or call_out_op
    for name in OUTPUTS[op]:
        outs = filled_outputs(op, inp)
        outs[name] = make(outs[name])
        kept = {k: v for k, v in outs.items() if k != name}
        before = output_bytes(kept)
        with pytest.raises(error, match=rf"{name} {words}"):
            call(op, inp, outs)
        if inp["x"].is_cuda:
            torch.cuda.synchronize()
        for k, b in before.items():
            assert torch.equal(kept[k].view(torch.uint8), b), f"{k} written by a refused call"


def on_device(t: torch.Tensor, device) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=device)


def overlap_pairs(op: str) -> Sequence[Tuple[str, str]]:
    """(output, other) pairs to test: each output with each input, and each pair of outputs."""
    outs = OUTPUTS[op]
    pairs = [(o, i) for o in outs for i in INPUTS[op]]
    pairs += [(outs[j], outs[i]) for j in range(len(outs)) for i in range(j)]
    return pairs

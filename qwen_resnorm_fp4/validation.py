"""The argument rules of the ``qwen_fp4`` ops, written once.

Each rule function returns ``None`` when the arguments satisfy it, or a :class:`Problem`: the
:class:`DeclineReason` that :func:`~qwen_resnorm_fp4.fused_path.try_fused_resnorm_quant` records, and the
exception (TypeError for a type or dtype, ValueError for a shape, device or value) with a message that
names the argument. The op rules take the op's own arguments, in the schema's order (ops.py). Their callers
raise (:func:`require`: the fakes and CPU implementations in ops.py; api.py, to name the argument of a call
the CUDA op refused, and first for an out-variant input it replaced with a copy) or decline (the fused
path). The raw CUDA op has its own checks (csrc/ops.cpp), which hold without this module; the limits they
share are csrc/op_limits.h's, and tests/ops/test_validation.py holds the two equal.

The rules read only static properties (types, dtypes, devices, shapes, Python scalars), so they cost no
device work, trace away under torch.compile, and run while a CUDA graph is captured. They are on the hot
path of every eager call: written to read each attribute once.
"""

from __future__ import annotations

import enum
import math
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import torch

from .constants import FP8_DTYPE, is_fp8_input_scale
from .env import DISABLE_VAR
from .layout import packed_shape, scales_bytes, scales_shape
from .recipe import NVFP4_4OVER6_CODES

Tensor = torch.Tensor

#: D (the last dimension) is at most this (csrc/op_limits.h kMaxCols).
MAX_COLS = 16384
#: D is a positive multiple of this: four 16-element scale blocks (csrc/op_limits.h kColsMultiple).
COLS_MULTIPLE = 64
#: D of the bf16 row op and the FP8 ops is a positive multiple of this (csrc/op_limits.h kRowColsMultiple): whole
#: 16-byte vectors of bf16 and whole 16-byte rows of E4M3, no NVFP4 scale tiles.
ROW_COLS_MULTIPLE = 16
#: Rows (x.numel() / D) the kernels take at most: their row index is a 32-bit int (csrc/op_limits.h kMaxRows).
MAX_ROWS = (1 << 31) - 128
#: K (2 x the packed row length) the bf16 dequantization takes at most: its 128x4 scale offsets are 32-bit
#: (csrc/op_limits.h kMaxDequantizeCols).
MAX_DEQUANTIZE_COLS = 1 << 27

ACTIVATION_DTYPES = (torch.bfloat16,)
PARAM_DTYPES = (torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64, torch.bool)
GLOBAL_SCALE_DTYPES = (torch.float32,)

WIDTH_RULE = f"a positive multiple of {COLS_MULTIPLE}, at most {MAX_COLS}"
#: The width rule of the bf16 row op and the FP8 ops.
ROW_WIDTH_RULE = f"a positive multiple of {ROW_COLS_MULTIPLE}, at most {MAX_COLS}"


def is_supported_width(cols: int) -> bool:
    """The width rule of the kernels: D a positive multiple of COLS_MULTIPLE, at most MAX_COLS."""
    return 0 < cols <= MAX_COLS and cols % COLS_MULTIPLE == 0


def is_supported_row_width(cols: int) -> bool:
    """The width rule of the bf16 row op and the FP8 ops: D a positive multiple of ROW_COLS_MULTIPLE, at
    most MAX_COLS."""
    return 0 < cols <= MAX_COLS and cols % ROW_COLS_MULTIPLE == 0


class DeclineReason(str, enum.Enum):
    """Why a fused-path gate did not serve a call: ``try_fused_resnorm_quant``, ``try_fused_resnorm_quant_fp8``,
    ``try_fused_norm_modulate_quant_fp8`` or ``try_fused_gelu_tanh_fp8_quantize`` returned ``None`` (their
    ``serve_fused_*`` forms, a :class:`~qwen_resnorm_fp4.Decline` with this reason). The value is a stable
    identifier (compare with the member or with the string); :attr:`description` is a sentence. Every rule's
    :class:`Problem` carries one too; UNSUPPORTED_SCALE (an input_scale value the FP8 ops refuse) only comes
    from rules that read a value, which no gate applies (that would synchronize)."""

    DISABLED_BY_ENV = "disabled_by_env"
    UNSUPPORTED_RECIPE = "unsupported_recipe"
    UNSUPPORTED_DEVICE = "unsupported_device"
    CPU_TENSORS = "cpu_tensors"
    DEVICE_MISMATCH = "device_mismatch"
    NO_KERNEL_FOR_DEVICE = "no_kernel_for_device"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    UNSUPPORTED_SHAPE = "unsupported_shape"
    UNSUPPORTED_WIDTH = "unsupported_width"
    NON_CONTIGUOUS = "non_contiguous"
    UNSUPPORTED_MODULATION = "unsupported_modulation"
    UNSUPPORTED_NORM = "unsupported_norm"
    FC1_NOT_NVFP4 = "fc1_not_nvfp4"
    FC1_WIDTH_MISMATCH = "fc1_width_mismatch"
    UNSUPPORTED_SCALE = "unsupported_scale"

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]

    def __str__(self) -> str:  # "cpu_tensors", not "DeclineReason.CPU_TENSORS"
        return self.value


_DESCRIPTIONS: Dict[DeclineReason, str] = {
    DeclineReason.DISABLED_BY_ENV: f"{DISABLE_VAR}=1 turns the fused path off",
    DeclineReason.UNSUPPORTED_RECIPE: (
        "the NVFP4 recipe (nvfp4_4over6, or the FLASHINFER_NVFP4_4OVER6* environment) is not an "
        "NVFP44Over6Config FlashInfer's packing can carry"),
    DeclineReason.UNSUPPORTED_DEVICE: "the tensors are on a device other than CUDA or CPU",
    DeclineReason.CPU_TENSORS: "the tensors are on the CPU (pass allow_cpu=True to run the reference there)",
    DeclineReason.DEVICE_MISMATCH: "the tensors (or FC1's input global scale) are not all on one device",
    DeclineReason.NO_KERNEL_FOR_DEVICE: (
        "no compiled code serves this GPU: the CUDA library is not built or not loaded, or the GPU's "
        "compute capability is below 9.0"),
    DeclineReason.UNSUPPORTED_DTYPE: (
        "x and residual must be bfloat16; gate, scale, shift, bias and the norm's parameters bfloat16 or "
        "float32; modulate_index int32, int64 or bool"),
    DeclineReason.UNSUPPORTED_SHAPE: f"residual and x must have one shape [..., D] with 1 to {MAX_ROWS} rows",
    DeclineReason.UNSUPPORTED_WIDTH: f"D (x.shape[-1]) must be {WIDTH_RULE} (the FP8 gates: {ROW_WIDTH_RULE})",
    DeclineReason.NON_CONTIGUOUS: (
        "x or residual is not contiguous; the fused path declines rather than copy the activations"),
    DeclineReason.UNSUPPORTED_MODULATION: (
        "gate, scale and shift must share one shape: [D], [B, D] or [B, 1, D] (x's rows split into B equal "
        "groups), per token [B, S, D] with B * S = x's rows, or [2B, D] with modulate_index [B, S]"),
    DeclineReason.UNSUPPORTED_NORM: (
        "the norm is not a LayerNorm over the last dimension (e.g. RMSNorm), or its parameters or eps are "
        "unusable"),
    DeclineReason.FC1_NOT_NVFP4: (
        "FC1 is not an NVFP4 layer: not an NVFP4Linear and without in_features and a float32 one-element "
        "input_global_scale on x's device"),
    DeclineReason.FC1_WIDTH_MISMATCH: "FC1's in_features differs from D",
    DeclineReason.UNSUPPORTED_SCALE: "a static FP8 input_scale is not a positive, normal, finite float32",
}


class Problem(NamedTuple):
    """A broken rule: the decline reason, the exception type, and the message as a template and its
    arguments (formatted only when asked: a traced decline keeps the template)."""

    reason: DeclineReason
    error: type
    template: str
    args: tuple

    def message(self) -> str:
        return self.template.format(*self.args)

    def exception(self) -> Exception:
        return self.error(self.message())


def require(problem: Optional[Problem]) -> None:
    """Raise the problem's exception (TypeError / ValueError naming the argument); nothing when None."""
    if problem is not None:
        raise problem.exception()


R = DeclineReason
# The shape rule of a [D] parameter belongs to what the parameter is part of: bias to the inputs, the
# LayerNorm's weight and bias to the norm.
_VECTOR_SHAPE_REASON = {"bias": R.UNSUPPORTED_SHAPE, "weight": R.UNSUPPORTED_NORM, "norm_bias": R.UNSUPPORTED_NORM}
_MODULATION = ("gate", "scale", "shift")
_NO_GATE_MODULATION = ("scale", "shift")


def _listed(names: Sequence[str]) -> str:
    """"gate, scale and shift" / "scale and shift"."""
    return ", ".join(names[:-1]) + " and " + names[-1]
_INF = math.inf


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def tensor_problem(name: str, t: object, dtypes: Sequence[torch.dtype], device: Optional[torch.device],
                   like: str = "x", not_a_tensor: DeclineReason = R.UNSUPPORTED_DTYPE) -> Optional[Problem]:
    """``t`` is a tensor of one of ``dtypes`` on ``device`` (None: any device), where ``like`` names the
    argument that set the device."""
    if not isinstance(t, Tensor):
        return Problem(not_a_tensor, TypeError, "{} must be a torch.Tensor, got {}", (name, type(t).__name__))
    if t.dtype not in dtypes:
        return Problem(R.UNSUPPORTED_DTYPE, TypeError, "{} must be {}, got {}", (name, _dtype_names(dtypes), t.dtype))
    if device is not None and t.device != device:
        return Problem(R.DEVICE_MISMATCH, ValueError, "{} is on {} but {} is on {}: all tensors must be on one device",
                       (name, t.device, like, device))
    return None


def width_problem(name: str, cols: int, multiple: int = COLS_MULTIPLE) -> Optional[Problem]:
    """D = ``cols`` (``name``.shape[-1]) is a positive multiple of ``multiple`` (COLS_MULTIPLE for the NVFP4
    ops: :func:`is_supported_width`; ROW_COLS_MULTIPLE for the bf16 row op and the FP8 ops), at most MAX_COLS; the
    message says which half of the rule it breaks."""
    if 0 < cols <= MAX_COLS and cols % multiple == 0:
        return None
    if cols > MAX_COLS and cols % multiple == 0:
        return Problem(R.UNSUPPORTED_WIDTH, ValueError, "{}.shape[-1] (D) must be at most {}, got {}",
                       (name, MAX_COLS, cols))
    return Problem(R.UNSUPPORTED_WIDTH, ValueError, "{}.shape[-1] (D) must be a positive multiple of {}, got {}",
                   (name, multiple, cols))


def rows_problem(name: str, rows: int) -> Optional[Problem]:
    """At most MAX_ROWS rows."""
    if rows > MAX_ROWS:
        return Problem(R.UNSUPPORTED_SHAPE, ValueError, "{} has too many rows ({}); at most {}", (name, rows, MAX_ROWS))
    return None


def global_scale_problem(global_scale: object, device: torch.device, like: str = "x",
                         name: str = "global_scale") -> Optional[Problem]:
    """A float32 one-element tensor on ``device``."""
    if not isinstance(global_scale, Tensor) or global_scale.dtype is not torch.float32 \
            or global_scale.device != device:
        return tensor_problem(name, global_scale, GLOBAL_SCALE_DTYPES, device, like)
    if global_scale.numel() != 1:
        return Problem(R.UNSUPPORTED_SHAPE, ValueError, "{} must have exactly one element, got shape {}",
                       (name, tuple(global_scale.shape)))
    return None


def eps_problem(eps: object) -> Optional[Problem]:
    """A finite float (or int) >= 0."""
    if type(eps) is float:  # the common case, one test
        if 0 <= eps < _INF:  # NaN fails both comparisons
            return None
    elif isinstance(eps, bool) or not isinstance(eps, (float, int)):
        return Problem(R.UNSUPPORTED_NORM, TypeError, "eps must be a float, got {}", (type(eps).__name__,))
    elif math.isfinite(eps) and eps >= 0:
        return None
    return Problem(R.UNSUPPORTED_NORM, ValueError, "eps must be finite and >= 0, got {}", (eps,))


def _modulation_shape_problem(name: str, shape: torch.Size, cols: int) -> Problem:
    return Problem(R.UNSUPPORTED_MODULATION, ValueError,
                   "{} must be [D], [B, D] or [B, S, D] with D={}, got shape {}", (name, cols, tuple(shape)))


def modulation_layout_problem(name: str, t: Tensor) -> Optional[Problem]:
    """The CUDA op's layout rule for gate, scale and shift (csrc/ops.cpp modulation_param), which it reads in
    place: stride 1 in the last dimension, and every row at a 16-byte boundary, i.e. the stride of each
    leading dimension with more than one entry a multiple of 16 bytes (and data_ptr() % 16 == 0, which only
    a tensor with data can tell: :func:`modulation_in_place`). ``temb.chunk(6, dim=-1)`` views of a
    contiguous temb satisfy it. The typed wrappers copy a tensor that breaks it; the raw op refuses it."""
    shape, strides = t.shape, t.stride()
    if shape[-1] != 1 and strides[-1] != 1:
        return Problem(R.NON_CONTIGUOUS, ValueError, "{} must have stride 1 in its last dimension, got strides {}; "
                       "pass {}.contiguous()", (name, strides, name))
    item = t.element_size()
    for n, stride in zip(shape[:-1], strides[:-1]):
        if n != 1 and (stride * item) % 16 != 0:
            return Problem(R.NON_CONTIGUOUS, ValueError, "{}'s rows must start at 16-byte boundaries: its strides {} "
                           "(elements of {} bytes) are not multiples of 16 bytes; pass {}.contiguous()",
                           (name, strides, item, name))
    return None


def modulation_in_place(t: Tensor, has_data: bool) -> bool:
    """Whether the CUDA op reads ``t`` (gate, scale or shift) as it is: :func:`modulation_layout_problem`
    finds nothing and, for a tensor with data (``has_data``), data_ptr() is 16-byte aligned."""
    return modulation_layout_problem("", t) is None and not (has_data and t.data_ptr() & 15)


def _vector_shape_problem(name: str, shape: torch.Size, cols: int) -> Problem:
    return Problem(_VECTOR_SHAPE_REASON[name], ValueError, "{} must have shape ({},) like x's last dim, got {}",
                   (name, cols, tuple(shape)))


def resnorm_inputs_problem(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index,
                           cols_multiple: int, *, residual_update: bool = True) -> Optional[Problem]:
    """The rules of the row ops' shared inputs, in the order they are reported: x and residual, D (a positive
    multiple of ``cols_multiple``, at most MAX_COLS) and the row count, the [D] parameters, gate/scale/shift,
    modulate_index, eps. The no-residual ops pass ``residual_update=False``: residual and gate are not
    read, and the messages name scale and shift. Each check reads an attribute once; messages are made only for a broken
    rule."""
    if not isinstance(x, Tensor) or x.dtype is not torch.bfloat16:
        return tensor_problem("x", x, ACTIVATION_DTYPES, None)
    dev = x.device
    if residual_update and (not isinstance(residual, Tensor) or residual.dtype is not torch.bfloat16
                                 or residual.device != dev):
        return tensor_problem("residual", residual, ACTIVATION_DTYPES, dev)
    shape = x.shape
    if not shape:
        return Problem(R.UNSUPPORTED_SHAPE, ValueError, "x must have at least one dimension ([..., D])", ())
    if residual_update and residual.shape != shape:
        return Problem(R.UNSUPPORTED_SHAPE, ValueError, "residual shape {} must equal x shape {}",
                       (tuple(residual.shape), tuple(shape)))
    cols = shape[-1]
    if not (0 < cols <= MAX_COLS and cols % cols_multiple == 0):
        return width_problem("x", cols, cols_multiple)
    rows = x.numel() // cols
    if rows > MAX_ROWS:
        return rows_problem("x", rows)

    if bias is not None or weight is not None or norm_bias is not None:
        for name, t in (("bias", bias), ("weight", weight), ("norm_bias", norm_bias)):
            if t is not None:
                p = tensor_problem(name, t, PARAM_DTYPES, dev)
                if p is not None:
                    return p
                if t.shape != (cols,):
                    return _vector_shape_problem(name, t.shape, cols)

    names = _MODULATION if residual_update else _NO_GATE_MODULATION
    for i, t in enumerate((gate, scale, shift) if residual_update else (scale, shift)):
        if not isinstance(t, Tensor) or t.dtype not in PARAM_DTYPES or t.device != dev:
            return tensor_problem(names[i], t, PARAM_DTYPES, dev, not_a_tensor=R.UNSUPPORTED_MODULATION)
        tshape = t.shape
        if i == 0:
            gshape = tshape
            ndim = len(gshape)
            if ndim not in (1, 2, 3) or gshape[-1] != cols:
                return _modulation_shape_problem(names[0], gshape, cols)
        elif tshape != gshape:
            if len(tshape) not in (1, 2, 3) or tshape[-1] != cols:
                return _modulation_shape_problem(names[i], tshape, cols)
            return Problem(R.UNSUPPORTED_MODULATION, ValueError, "{} must have one shape, but {} is {} and {} is {}",
                           (_listed(names), names[0], tuple(gshape), names[i], tuple(tshape)))

    if modulate_index is not None:
        p = tensor_problem("modulate_index", modulate_index, INDEX_DTYPES, dev)
        if p is not None:
            return p
        if modulate_index.dim() != 2:
            return Problem(R.UNSUPPORTED_MODULATION, ValueError, "modulate_index must be [B, S], got shape {}",
                           (tuple(modulate_index.shape),))
        b, s = modulate_index.shape
        if ndim != 2 or gshape[0] != 2 * b:
            return Problem(R.UNSUPPORTED_MODULATION, ValueError, "with modulate_index of shape {}, {} must be "
                           "[2B, D] = [{}, {}], got {}", (tuple(modulate_index.shape), "/".join(names), 2 * b, cols,
                                                          tuple(gshape)))
        if b * s != rows:
            return Problem(R.UNSUPPORTED_MODULATION, ValueError, "modulate_index has {}x{} = {} entries but x has {} "
                           "rows", (b, s, b * s, rows))
    elif ndim == 3 and gshape[1] != 1:
        b, s = gshape[0], gshape[1]
        if b * s != rows:
            return Problem(R.UNSUPPORTED_MODULATION, ValueError, "per-token {} [B, S, D] need B * S = x's rows "
                           "({}), got shape {}", ("/".join(names), rows, tuple(gshape)))
    elif ndim >= 2:  # [B, D] or [B, 1, D]
        b = gshape[0]
        if b == 0 or rows % b != 0:
            return Problem(R.UNSUPPORTED_MODULATION, ValueError, "x has {} rows, which does not split into "
                           "{}.shape[0] = {} batches", (rows, names[0], b))

    return eps_problem(eps)


def resnorm_problem(residual, x, bias, gate, scale, shift, eps, weight=None, norm_bias=None,
                    modulate_index=None) -> Optional[Problem]:
    """The rules of the bf16 row op: :func:`resnorm_inputs_problem` with D a multiple of ROW_COLS_MULTIPLE."""
    return resnorm_inputs_problem(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index,
                                  ROW_COLS_MULTIPLE)


def resnorm_quant_problem(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math=None, weight=None,
                          norm_bias=None, modulate_index=None, nvfp4_4over6_code=0) -> Optional[Problem]:
    """The rules of the NVFP4 row op: :func:`resnorm_inputs_problem` with D a multiple of COLS_MULTIPLE,
    then global_scale and the recipe code (``fast_math`` has none beyond the schema's bool)."""
    return resnorm_inputs_problem(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index,
                                  COLS_MULTIPLE) or \
        global_scale_problem(global_scale, x.device) or nvfp4_4over6_code_problem(nvfp4_4over6_code)


def quantize_problem(y, global_scale, fast_math=None, nvfp4_4over6_code=0) -> Optional[Problem]:
    """The rules of the NVFP4 quantizer: y bf16 [..., D] with a supported D and row count, global_scale,
    the recipe code."""
    if not isinstance(y, Tensor) or y.dtype is not torch.bfloat16:
        return tensor_problem("y", y, ACTIVATION_DTYPES, None)
    shape = y.shape
    if not shape:
        return Problem(R.UNSUPPORTED_SHAPE, ValueError, "y must have at least one dimension ([..., D])", ())
    cols = shape[-1]
    return width_problem("y", cols) or rows_problem("y", y.numel() // cols) or \
        global_scale_problem(global_scale, y.device, like="y") or nvfp4_4over6_code_problem(nvfp4_4over6_code)


def nvfp4_4over6_code_problem(code: object) -> Optional[Problem]:
    """The rule of the ops' ``nvfp4_4over6_code`` (csrc/ops.cpp check_nvfp4_4over6_code is the same): an int,
    0 or FlashInfer's packing (bit 0 on, bit 1 e4m3_max 256, bits 2-3 err_mode 0 = MAE / 1 = MSE, bit 4
    err_use_fast_math), no other bits."""
    if type(code) is int and code in NVFP4_4OVER6_CODES:  # the common case, one test
        return None
    if isinstance(code, bool) or not isinstance(code, int):
        return Problem(R.UNSUPPORTED_RECIPE, TypeError, "nvfp4_4over6_code must be an int, got {}",
                       (type(code).__name__,))
    if code not in NVFP4_4OVER6_CODES:
        return Problem(R.UNSUPPORTED_RECIPE, ValueError,
                       "nvfp4_4over6_code must be 0 (the standard recipe) or FlashInfer's packing of "
                       "NVFP44Over6Config (bit 0 set; bit 1: e4m3_max 256; bits 2-3: err_mode 0 = MAE or 1 = MSE; "
                       "bit 4: err_use_fast_math; no other bits), got {}", (code,))
    return None


def dequantize_problem(packed, scales, global_scale, rows: Optional[int]) -> Tuple[Optional[Problem], int, int]:
    """The rules of dequantize_nvfp4; returns (problem, rows, cols), rows resolved (None: packed's rows)."""
    p = tensor_problem("packed", packed, (torch.uint8,), None)
    if p is not None:
        return p, 0, 0
    p = tensor_problem("scales", scales, (torch.uint8,), packed.device, like="packed") or \
        global_scale_problem(global_scale, packed.device, like="packed")
    if p is not None:
        return p, 0, 0
    if packed.dim() != 2:
        return Problem(R.UNSUPPORTED_SHAPE, ValueError, "packed must be [M, D/2], got shape {}",
                       (tuple(packed.shape),)), 0, 0
    m, half = packed.shape
    rows = m if rows is None else int(rows)
    if not 0 <= rows <= m:
        return Problem(R.UNSUPPORTED_SHAPE, ValueError, "rows must be in [0, {}], got {}", (m, rows)), rows, 0
    cols = half * 2
    p = width_problem("packed (2 * last dim)", cols)
    if p is not None:
        return p, rows, cols
    need = scales_bytes(rows, cols)
    if scales.numel() < need:
        return Problem(R.UNSUPPORTED_SHAPE, ValueError, "scales has {} bytes, {} needed for {} rows of {}",
                       (scales.numel(), need, rows, cols)), rows, cols
    return None, rows, cols


SCALE_DTYPES = (torch.uint8, torch.float8_e4m3fn)


def dequantize_bf16_problem(packed, scales) -> Optional[Problem]:
    """The rules of the bf16 dequantization op (the tensor-core GEMM's operands): packed uint8 [rows, K/2]
    with K a positive multiple of 64 (at most MAX_DEQUANTIZE_COLS), scales uint8 or float8_e4m3fn on the same
    device holding round_up(rows, 128) x K/16 bytes of the 128x4 layout."""
    if not isinstance(packed, Tensor) or packed.dtype is not torch.uint8 or packed.dim() != 2:
        return Problem(R.UNSUPPORTED_DTYPE, TypeError, "packed must be a uint8 tensor [rows, K/2] of packed E2M1 "
                       "pairs", ())
    if not isinstance(scales, Tensor) or scales.dtype not in SCALE_DTYPES:
        return Problem(R.UNSUPPORTED_DTYPE, TypeError, "scales must be a uint8 or float8_e4m3fn tensor of "
                       "128x4-swizzled block scales", ())
    rows, k = packed.shape[0], packed.shape[1] * 2
    if k <= 0 or k % COLS_MULTIPLE != 0:
        return Problem(R.UNSUPPORTED_WIDTH, ValueError, "packed.shape[1] * 2 (K) must be a positive multiple of "
                       "{}, got {}", (COLS_MULTIPLE, k))
    if k > MAX_DEQUANTIZE_COLS:
        return Problem(R.UNSUPPORTED_WIDTH, ValueError, "packed.shape[1] * 2 (K) must be at most {}, got {}",
                       (MAX_DEQUANTIZE_COLS, k))
    if scales.device != packed.device:
        return Problem(R.DEVICE_MISMATCH, ValueError, "scales is on {} but packed is on {}",
                       (scales.device, packed.device))
    need = scales_bytes(rows, k)
    if scales.numel() < need:
        return Problem(R.UNSUPPORTED_SHAPE, ValueError, "scales has {} bytes, {} needed for {} rows of K = {}",
                       (scales.numel(), need, rows, k))
    return None


__all__ = ["MAX_COLS", "COLS_MULTIPLE", "ROW_COLS_MULTIPLE", "MAX_ROWS", "WIDTH_RULE", "ROW_WIDTH_RULE",
           "is_supported_width", "is_supported_row_width", "DeclineReason", "Problem",
           "require", "tensor_problem", "width_problem", "rows_problem", "global_scale_problem", "eps_problem",
           "modulation_layout_problem", "modulation_in_place", "resnorm_inputs_problem", "resnorm_problem",
           "resnorm_quant_problem", "quantize_problem", "dequantize_problem",
           "MAX_DEQUANTIZE_COLS", "dequantize_bf16_problem", "OUTPUT_ALIGNMENT", "OUT_SCALE_DTYPES", "has_data",
           "output_problem", "byte_span", "memory_problem", "nvfp4_4over6_code_problem",
           "resnorm_quant_out_problem", "resnorm_out_problem", "quantize_out_problem"]


# ---------------------------------------------------------------------------------------------------
# The out-variants: the outputs the caller provides
# ---------------------------------------------------------------------------------------------------

#: Byte alignment of every caller-provided output: the kernels store with 16-byte vectors (csrc/ops.cpp
#: check_output, check_aligned16).
OUTPUT_ALIGNMENT = 16
#: dtypes of the caller-provided scales: uint8, or float8_e4m3fn (the same bytes, as the FP4 GEMMs take them).
OUT_SCALE_DTYPES = (torch.uint8, torch.float8_e4m3fn)


def has_data(t: Tensor) -> bool:
    """False for tensors without real memory (meta, FakeTensor, FunctionalTensor over a fake one), whose
    data_ptr() must not be read (torch warns, or raises under make_fx / FakeTensorMode)."""
    if t.device.type == "meta":
        return False
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # pragma: no cover - torch without fake tensors
        return True
    return not is_fake(t)


def output_problem(name: str, t: object, dtypes: Sequence[torch.dtype], shape: tuple, device: torch.device,
                   like: str) -> Optional[Problem]:
    """The static rules of a caller-provided output: a tensor of one of ``dtypes`` on ``device`` (that of
    ``like``), of exactly ``shape``, contiguous."""
    p = tensor_problem(name, t, dtypes, device, like)
    if p is not None:
        return p
    if tuple(t.shape) != tuple(shape):
        return Problem(R.UNSUPPORTED_SHAPE, ValueError, "{} must have shape {}, got {}",
                       (name, tuple(shape), tuple(t.shape)))
    if not t.is_contiguous():
        return Problem(R.NON_CONTIGUOUS, ValueError, "{} must be contiguous (the kernels write it row by row)",
                       (name,))
    return None


def byte_span(t: Tensor) -> Tuple[int, int]:
    """[start, end) of the bytes ``t``'s elements lie in (every element between its first and its last, so
    a strided view's gaps count); start == end for an empty tensor."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def _is_same_view(a: Tensor, b: Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() \
        and a.dtype == b.dtype


def memory_problem(outputs: Sequence[Tuple[str, Tensor]], inputs: Sequence[Tuple[str, Optional[Tensor]]],
                   in_place: Optional[Tuple[str, str]] = None) -> Optional[Problem]:
    """The memory rules of the out-variants, on tensors with data: each output is OUTPUT_ALIGNMENT-byte
    aligned, no output's bytes overlap another output's or an input's, except that the output named
    ``in_place[0]`` may be the input named ``in_place[1]`` itself (same memory, shape and strides: the
    in-place residual update)."""
    for name, t in outputs:
        if t.data_ptr() % OUTPUT_ALIGNMENT:
            return Problem(R.NON_CONTIGUOUS, ValueError, "{} must be {}-byte aligned (a view at an odd offset?)",
                           (name, OUTPUT_ALIGNMENT))
    spans = [(name, t, byte_span(t)) for name, t in outputs]
    for i, (name, t, (start, end)) in enumerate(spans):
        for other, _, (o_start, o_end) in spans[:i]:
            if start < o_end and o_start < end:
                return Problem(R.UNSUPPORTED_SHAPE, ValueError, "{} overlaps {} in memory: the outputs must be "
                               "distinct", (name, other))
        for in_name, inp in inputs:
            if inp is None:
                continue
            in_start, in_end = byte_span(inp)
            if not (start < in_end and in_start < end):
                continue
            if in_place == (name, in_name) and _is_same_view(t, inp):
                continue
            allowed = f" ({name} may be {in_name} itself, not part of it)" if in_place == (name, in_name) else ""
            return Problem(R.UNSUPPORTED_SHAPE, ValueError, "{} overlaps the input {} in memory{}",
                           (name, in_name, allowed))
    return None


def _quantized_output_problem(packed, scales, like: Tensor, like_name: str) -> Optional[Problem]:
    cols = like.shape[-1]
    rows = like.numel() // cols
    dev = like.device
    return output_problem("packed", packed, (torch.uint8,), packed_shape(rows, cols), dev, like_name) or \
        output_problem("scales", scales, OUT_SCALE_DTYPES, scales_shape(rows, cols), dev, like_name)


def _resnorm_inputs(residual, x, bias, gate, scale, shift, weight, norm_bias, modulate_index, *scalars):
    """The named inputs of a row op for :func:`memory_problem`, its one-element scale tensors (``scalars``:
    (name, tensor) pairs) after shift."""
    return (("residual", residual), ("x", x), ("bias", bias), ("gate", gate), ("scale", scale), ("shift", shift),
            *scalars, ("weight", weight), ("norm_bias", norm_bias), ("modulate_index", modulate_index))


def _memory_checked(memory: Optional[bool], outputs) -> bool:
    """Whether the memory rules apply: ``memory`` when given, else when every output has data."""
    return all(has_data(t) for _, t in outputs) if memory is None else memory


def resnorm_quant_out_problem(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math, packed, scales,
                              residual_out, weight=None, norm_bias=None, modulate_index=None,
                              nvfp4_4over6_code=0, memory: Optional[bool] = None) -> Optional[Problem]:
    """The rules of the NVFP4 row op's out-variant: those of the op for the inputs; packed uint8 [M, D/2], scales
    uint8 or float8_e4m3fn [round_up(M, 128), D/16], residual_out bf16 of x's shape, each contiguous on x's
    device; and, when ``memory`` (None: when the tensors have data), :func:`memory_problem` with
    residual_out allowed to be residual."""
    p = resnorm_quant_problem(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math, weight, norm_bias,
                              modulate_index, nvfp4_4over6_code) or \
        _quantized_output_problem(packed, scales, x, "x") or \
        output_problem("residual_out", residual_out, ACTIVATION_DTYPES, tuple(x.shape), x.device, "x")
    if p is not None:
        return p
    outputs = (("packed", packed), ("scales", scales), ("residual_out", residual_out))
    if not _memory_checked(memory, outputs):
        return None
    inputs = _resnorm_inputs(residual, x, bias, gate, scale, shift, weight, norm_bias, modulate_index,
                             ("global_scale", global_scale))
    return memory_problem(outputs, inputs, in_place=("residual_out", "residual"))


def resnorm_out_problem(residual, x, bias, gate, scale, shift, eps, y, residual_out, weight=None, norm_bias=None,
                        modulate_index=None, memory: Optional[bool] = None) -> Optional[Problem]:
    """The rules of the bf16 row op's out-variant: those of the op for the inputs; y and residual_out bf16 of x's shape,
    contiguous on x's device; the memory rules as in :func:`resnorm_quant_out_problem`."""
    p = resnorm_problem(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index) or \
        output_problem("y", y, ACTIVATION_DTYPES, tuple(x.shape), x.device, "x") or \
        output_problem("residual_out", residual_out, ACTIVATION_DTYPES, tuple(x.shape), x.device, "x")
    if p is not None:
        return p
    outputs = (("y", y), ("residual_out", residual_out))
    if not _memory_checked(memory, outputs):
        return None
    inputs = _resnorm_inputs(residual, x, bias, gate, scale, shift, weight, norm_bias, modulate_index)
    return memory_problem(outputs, inputs, in_place=("residual_out", "residual"))


def quantize_out_problem(y, global_scale, fast_math, packed, scales, nvfp4_4over6_code=0,
                         memory: Optional[bool] = None) -> Optional[Problem]:
    """The rules of the NVFP4 quantizer's out-variant: those of the quantizer for the inputs, packed and scales as in
    :func:`resnorm_quant_out_problem`, no overlap at all."""
    p = quantize_problem(y, global_scale, fast_math, nvfp4_4over6_code) or \
        _quantized_output_problem(packed, scales, y, "y")
    if p is not None:
        return p
    outputs = (("packed", packed), ("scales", scales))
    if not _memory_checked(memory, outputs):
        return None
    return memory_problem(outputs, (("y", y), ("global_scale", global_scale)))


# ---------------------------------------------------------------------------------------------------
# The FP8 (E4M3) ops (row, element-wise, no-residual; their out-variants) and the no-residual NVFP4 op: the
# rules above, with input_scale in place of global_scale
# ---------------------------------------------------------------------------------------------------



def input_scale_problem(input_scale: object, device: torch.device, like: str = "x") -> Optional[Problem]:
    """The static rule of the FP8 ops' input_scale: a float32 one-element tensor on ``device`` (its value is
    :func:`input_scale_value_problem`'s)."""
    return global_scale_problem(input_scale, device, like, name="input_scale")


def input_scale_value_problem(input_scale: Tensor) -> Optional[Problem]:
    """The value rule of input_scale (ModelOpt's amax / 448): a positive, normal, finite fp32. Reads the
    value, so on CUDA it synchronizes: the CPU implementations apply it on every call, the CUDA kernels
    apply it on the device instead (a refused scale makes every output byte 0x7F, E4M3 NaN)."""
    value = float(input_scale.reshape(()))
    if not is_fp8_input_scale(value):
        return Problem(R.UNSUPPORTED_SCALE, ValueError, "input_scale must be a positive, normal, finite float32 "
                       "(ModelOpt's amax / 448), got {}", (value,))
    return None


def resnorm_quant_fp8_problem(residual, x, bias, gate, scale, shift, input_scale, eps, weight=None, norm_bias=None,
                              modulate_index=None) -> Optional[Problem]:
    """The rules of the FP8 row op: those of the bf16 row op (D a multiple of ROW_COLS_MULTIPLE) and input_scale."""
    return resnorm_problem(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index) or \
        input_scale_problem(input_scale, x.device)


def fp8_quantize_problem(y, input_scale) -> Optional[Problem]:
    """The rules of the element-wise FP8 ops: y a bf16 tensor of any shape, input_scale on its device."""
    if not isinstance(y, Tensor) or y.dtype is not torch.bfloat16:
        return tensor_problem("y", y, ACTIVATION_DTYPES, None)
    return input_scale_problem(input_scale, y.device, like="y")


def norm_modulate_inputs_problem(x, scale, shift, eps, weight, norm_bias, modulate_index,
                                 cols_multiple: int) -> Optional[Problem]:
    """The rules of the no-residual ops' inputs (no residual, no gate, no bias): those of
    :func:`resnorm_inputs_problem` without residual and gate, D a multiple of ``cols_multiple``."""
    return resnorm_inputs_problem(None, x, None, None, scale, shift, eps, weight, norm_bias, modulate_index,
                                  cols_multiple, residual_update=False)


def norm_modulate_quant_problem(x, scale, shift, global_scale, eps, fast_math=None, weight=None, norm_bias=None,
                                modulate_index=None, nvfp4_4over6_code=0) -> Optional[Problem]:
    """The rules of the no-residual NVFP4 op: :func:`norm_modulate_inputs_problem` with D a multiple of
    COLS_MULTIPLE, then global_scale and the recipe code."""
    return norm_modulate_inputs_problem(x, scale, shift, eps, weight, norm_bias, modulate_index, COLS_MULTIPLE) or \
        global_scale_problem(global_scale, x.device) or nvfp4_4over6_code_problem(nvfp4_4over6_code)


def norm_modulate_quant_fp8_problem(x, scale, shift, input_scale, eps, weight=None, norm_bias=None,
                                    modulate_index=None) -> Optional[Problem]:
    """The rules of the no-residual FP8 op: :func:`norm_modulate_inputs_problem` with D a multiple of
    ROW_COLS_MULTIPLE, then input_scale."""
    return norm_modulate_inputs_problem(x, scale, shift, eps, weight, norm_bias, modulate_index,
                                        ROW_COLS_MULTIPLE) or input_scale_problem(input_scale, x.device)


def _fp8_outputs_problem(x: Tensor, y, y_bf16) -> Optional[Problem]:
    shape, dev = tuple(x.shape), x.device
    return output_problem("y", y, (FP8_DTYPE,), shape, dev, "x") or \
        (None if y_bf16 is None else output_problem("y_bf16", y_bf16, ACTIVATION_DTYPES, shape, dev, "x"))


def resnorm_quant_fp8_out_problem(residual, x, bias, gate, scale, shift, input_scale, eps, y, residual_out,
                                  weight=None, norm_bias=None, modulate_index=None, y_bf16=None,
                                  memory: Optional[bool] = None) -> Optional[Problem]:
    """The rules of the FP8 row op's out-variant: those of the op for the inputs; y float8_e4m3fn,
    residual_out and (optional) y_bf16 bf16, each of x's shape, contiguous, on x's device; the memory rules of
    :func:`resnorm_quant_out_problem` (residual_out may be residual)."""
    p = resnorm_quant_fp8_problem(residual, x, bias, gate, scale, shift, input_scale, eps, weight, norm_bias,
                                  modulate_index) or _fp8_outputs_problem(x, y, y_bf16) or \
        output_problem("residual_out", residual_out, ACTIVATION_DTYPES, tuple(x.shape), x.device, "x")
    if p is not None:
        return p
    outputs = (("y", y), ("residual_out", residual_out)) + ((("y_bf16", y_bf16),) if y_bf16 is not None else ())
    if not _memory_checked(memory, outputs):
        return None
    inputs = _resnorm_inputs(residual, x, bias, gate, scale, shift, weight, norm_bias, modulate_index,
                             ("input_scale", input_scale))
    return memory_problem(outputs, inputs, in_place=("residual_out", "residual"))


def fp8_quantize_out_problem(y, input_scale, out, memory: Optional[bool] = None) -> Optional[Problem]:
    """The rules of the element-wise FP8 ops' out-variants: those of the ops; out float8_e4m3fn of y's shape,
    contiguous, on y's device, sharing no memory with y or input_scale."""
    p = fp8_quantize_problem(y, input_scale) or output_problem("out", out, (FP8_DTYPE,), tuple(y.shape), y.device,
                                                               "y")
    if p is not None:
        return p
    if not _memory_checked(memory, (("out", out),)):
        return None
    return memory_problem((("out", out),), (("y", y), ("input_scale", input_scale)))


def norm_modulate_quant_fp8_out_problem(x, scale, shift, input_scale, eps, y, weight=None, norm_bias=None,
                                        modulate_index=None, y_bf16=None,
                                        memory: Optional[bool] = None) -> Optional[Problem]:
    """The rules of the no-residual FP8 op's out-variant: those of the op; y and y_bf16 as in
    :func:`resnorm_quant_fp8_out_problem`, sharing no memory with the inputs or each other."""
    p = norm_modulate_quant_fp8_problem(x, scale, shift, input_scale, eps, weight, norm_bias, modulate_index) or \
        _fp8_outputs_problem(x, y, y_bf16)
    if p is not None:
        return p
    outputs = (("y", y),) + ((("y_bf16", y_bf16),) if y_bf16 is not None else ())
    if not _memory_checked(memory, outputs):
        return None
    inputs = (("x", x), ("scale", scale), ("shift", shift), ("input_scale", input_scale), ("weight", weight),
              ("norm_bias", norm_bias), ("modulate_index", modulate_index))
    return memory_problem(outputs, inputs)


__all__ += ["input_scale_problem",
            "input_scale_value_problem", "resnorm_quant_fp8_problem", "fp8_quantize_problem",
            "norm_modulate_inputs_problem", "norm_modulate_quant_problem",
            "norm_modulate_quant_fp8_problem", "resnorm_quant_fp8_out_problem", "fp8_quantize_out_problem",
            "norm_modulate_quant_fp8_out_problem"]

"""The number formats' facts, defined once: every module, test and benchmark that needs one imports it here.

The CUDA side states the same facts in csrc/formats.h; tests/ops/test_constants.py holds the two equal.
"""

from __future__ import annotations

import torch

#: Largest finite E4M3 (float8_e4m3fn) magnitude: the FP8 activations' and the NVFP4 block scales' range.
E4M3_MAX = 448.0
#: Largest E2M1 magnitude: an NVFP4 element's range.
E2M1_MAX = 6.0
#: E2M1 magnitudes by code 0..7; bit 3 of a code is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, E2M1_MAX)
#: Elements per NVFP4 block (one E4M3 scale each), along a row.
NVFP4_BLOCK = 16
#: The E4M3 maximum a 4over6 recipe may aim its block scales at instead of E4M3_MAX.
E4M3_MAX_4OVER6_256 = 256.0
#: NVFP4 global scale = FP4_AMAX_SCALE / amax (FlashInfer's and TensorRT-LLM's definition, standard recipe).
FP4_AMAX_SCALE = E4M3_MAX * E2M1_MAX
#: Largest finite fp32.
FLT_MAX = torch.finfo(torch.float32).max
#: Smallest normal fp32 (2^-126): the smallest static FP8 input_scale the ops accept.
FLT_MIN_NORMAL = torch.finfo(torch.float32).tiny
#: dtype of the FP8 ops' quantized output.
FP8_DTYPE = torch.float8_e4m3fn


def is_fp8_input_scale(value):
    """The FP8 ops' rule for a static input_scale (ModelOpt's amax / 448): a positive, normal, finite fp32,
    i.e. FLT_MIN_NORMAL <= value <= FLT_MAX (NaN fails both). ``value`` a float (a bool comes back) or an fp32
    tensor (a bool tensor: the reference's model of the kernels' on-device check, csrc/fp8_e4m3.cuh)."""
    return (value >= FLT_MIN_NORMAL) & (value <= FLT_MAX)


__all__ = ["E4M3_MAX", "E2M1_MAX", "E2M1_VALUES", "NVFP4_BLOCK", "E4M3_MAX_4OVER6_256", "FP4_AMAX_SCALE", "FLT_MAX",
           "FLT_MIN_NORMAL", "FP8_DTYPE", "is_fp8_input_scale"]

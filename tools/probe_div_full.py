"""Measure the GPU's div.full.f32(1, s) (the FP8 ops' inverse scale) over every positive normal fp32 s and
write the correction table that makes qwen_resnorm_fp4.reference.fp8_inverse_scale equal it.

Run on a GPU with the compiled library (a few seconds on an H200):

    python tools/probe_div_full.py [--out qwen_resnorm_fp4/data/div_full_rcp.bin]

1. For every mantissa m (2^23 of them), at s = 1.m: delta(m) = div.full(1, 1.m) - RN(1 / 1.m) in ulps
   (RN by IEEE division on the CPU). Only -1, 0 and +1 are representable in the table (plus / minus); any
   other difference stops the probe.
2. For every exponent of a positive normal s (biased 1 .. 254) and every mantissa: the GPU's inverse against
   the model of fp8_inverse_scale with those corrections, RN(R(m) x 2^-e). Where they differ, the scale is
   listed as an exception with the GPU's inverse; more than MAX_EXCEPTIONS stops the probe (the model would
   then need another rule).
3. The table is written, read back and checked against the GPU once more on all of step 2's scales.

Prints a summary: how many mantissas are corrected each way, the exceptions by exponent.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

MAX_EXCEPTIONS = 1 << 16
MANTISSAS = 1 << 23


def _scales(exponent: int, device) -> torch.Tensor:
    m = torch.arange(MANTISSAS, dtype=torch.int64, device=device)
    return ((exponent << 23) | m).to(torch.int32).view(torch.float32)


def main(argv=None) -> int:
    import qwen_resnorm_fp4  # noqa: F401 - loads the library
    from qwen_resnorm_fp4 import reference
    from qwen_resnorm_fp4.ops import gpu_div_full_rcp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=reference.DIV_FULL_TABLE_PATH)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_div_full: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")

    # 1. corrections by mantissa, at exponent 0 (s in [1, 2))
    unit = _scales(127, "cpu")
    rn = (torch.ones_like(unit) / unit).view(torch.int32).to(torch.int64)
    gpu = gpu_div_full_rcp(unit.to(dev)).cpu().view(torch.int32).to(torch.int64)
    delta = gpu - rn
    bad = delta.abs() > 1
    if bool(bad.any()):
        m = int(torch.nonzero(bad)[0])
        print(f"probe_div_full: div.full(1, 1.m) differs from RN(1/1.m) by {int(delta[m])} ulps at m = {m:#x}: the "
              "table format holds +-1 only", file=sys.stderr)
        return 1
    m_all = torch.arange(MANTISSAS, dtype=torch.int64)
    plus, minus = m_all[delta == 1], m_all[delta == -1]
    empty = torch.zeros(0, dtype=torch.int64)
    model = reference.DivFullTable(plus, minus, empty, empty)

    # 2. every exponent against the model
    exc_scales, exc_inverses, by_exponent = [], [], collections.Counter()
    for e in range(1, 255):
        s = _scales(e, dev)
        got = gpu_div_full_rcp(s)
        want = reference.fp8_inverse_scale(s, table=model)
        differ = got.view(torch.int32) != want.view(torch.int32)
        if bool(differ.any()):
            idx = torch.nonzero(differ).flatten()
            exc_scales.append(s.view(torch.int32)[idx].to(torch.int64).cpu())
            exc_inverses.append(got.view(torch.int32)[idx].to(torch.int64).cpu())
            by_exponent[e - 127] += idx.numel()
            if sum(by_exponent.values()) > MAX_EXCEPTIONS:
                print(f"probe_div_full: more than {MAX_EXCEPTIONS} scales differ from the model (by exponent: "
                      f"{dict(by_exponent)}): it needs another rule", file=sys.stderr)
                return 1
    table = reference.DivFullTable(plus, minus, torch.cat(exc_scales) if exc_scales else empty,
                                   torch.cat(exc_inverses) if exc_inverses else empty)

    # 3. write, read back, check again
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(reference.encode_div_full_table(table))
    again = reference.decode_div_full_table(args.out.read_bytes())
    for e in range(1, 255):
        s = _scales(e, dev)
        if not torch.equal(gpu_div_full_rcp(s).view(torch.int32),
                           reference.fp8_inverse_scale(s, table=again).view(torch.int32)):
            print(f"probe_div_full: the written table does not reproduce exponent {e - 127}", file=sys.stderr)
            return 1
    print(f"probe_div_full on {torch.cuda.get_device_name()}: {plus.numel()} mantissas +1 ulp, {minus.numel()} "
          f"-1 ulp, {table.exception_scales.numel()} exceptions (by unbiased exponent: {dict(by_exponent)}); "
          f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

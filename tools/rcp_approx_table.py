"""Writes qwen_resnorm_fp4/data/rcp_approx_f32.xz from the probe's delta_e127.bin (tools/rcp_approx_probe.cu),
after checking the probe's hypotheses.txt: the rules of qwen_resnorm_fp4/rcp_approx.py must hold with no miss.

    nvcc -O2 -arch=sm_90a tools/rcp_approx_probe.cu -o /tmp/probe && /tmp/probe /tmp/probe_out
    python tools/rcp_approx_table.py /tmp/probe_out
"""

import lzma
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "qwen_resnorm_fp4" / "data" / "rcp_approx_f32.xz"


def check_hypotheses(path: Path) -> None:
    """rcp.approx everywhere; the 0.25 rule at exponents 253-254; the 4x rule at exponent 0."""
    rows = [list(map(int, line.split())) for line in path.read_text().splitlines()[1:]]
    for e, miss_rcp, miss_quarter, miss_times4 in rows:
        assert miss_rcp == 0, f"div.full(1, s) != rcp.approx(s) at exponent {e}"
        assert e < 253 or miss_quarter == 0, f"the 0.25 rule misses at exponent {e}"
        assert e != 0 or miss_times4 == 0, "the 4x rule misses at exponent 0"


def main(probe_dir: str) -> None:
    d = Path(probe_dir)
    check_hypotheses(d / "hypotheses.txt")
    summary = [line.split() for line in (d / "summary.txt").read_text().splitlines()[1:]]
    assert all(int(r[7]) == 0 for r in summary if 1 <= int(r[0]) <= 252), "delta depends on the exponent"
    delta = np.fromfile(d / "delta_e127.bin", dtype=np.int8)
    assert delta.size == 1 << 23 and set(np.unique(delta)) <= {-1, 0, 1}
    bits = np.packbits(delta != 0, bitorder="little").tobytes() + np.packbits(delta[delta != 0] > 0,
                                                                               bitorder="little").tobytes()
    OUT.write_bytes(lzma.compress(bits, preset=9))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main(sys.argv[1])

"""GPU time per call by CUDA-graph replay (bench.graph_replay_us) for several row counts and widths: the
fused op, the unfused pair, the pair's kernels alone and a copy of the same bytes. A tuning aid; at many
rows it shows the GPU time without the per-call event records of the eager timing.

    python scripts/graph_replay.py --rows 17,64,256 --dims 3072,5120
"""
import argparse

from qwen_resnorm_fp4 import bench


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=bench._int_list, default=[17, 64, 256])
    p.add_argument("--dims", type=bench._int_list, default=[3072, 5120])
    p.add_argument("--repeat", type=int, default=3, help="measurements per case (each a median of replays)")
    args = p.parse_args()
    fm = bench._fast_math()
    for d in args.dims:
        for m in args.rows:
            runs = [bench.graph_replay_us(m, d, fm) for _ in range(args.repeat)]
            best = {k: min(r[k] for r in runs) for k in runs[0]}
            print(f"graph D={d} rows={m}: fused {best['fused']:.2f} us, unfused {best['unfused']:.2f} us "
                  f"({best['unfused'] / best['fused']:.3f}x), resnorm {best['resnorm']:.2f}, "
                  f"quantize {best['quantize']:.2f}, copy of the same bytes {best['copy']:.2f} us "
                  f"({bench.gbps(bench.bytes_moved(m, d), best['fused']):.0f} GB/s fused, "
                  f"{bench.gbps(best['copy_bytes'], best['copy']):.0f} GB/s copy)  [min of {args.repeat}]", flush=True)


if __name__ == "__main__":
    main()

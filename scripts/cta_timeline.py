"""Diagnostic only: where a fused call's GPU time goes, CTA by CTA. Needs a wheel built from a tree patched by
``scripts/cta_timestamps_patch.py`` (each row CTA writes its SM and its start and end %globaltimer into the
first 24 bytes of its row's packed output, so the outputs are wrong by design). Times calls as the benchmark
does (per-call CUDA events, queue pre-filled, cold L2), then reads the last call's timestamps.

    python scripts/cta_timeline.py --rows 4096,8192 --dim 3072
"""
import argparse
import statistics
from typing import List, Tuple

import torch

from qwen_resnorm_fp4 import bench


def timed_calls(rows: int, dim: int, op: str, output: int, calls: int = 30) -> Tuple[List[torch.Tensor], List[float]]:
    """Calls `op` (a name of bench.make_impls) `calls` times as the benchmark times it (per-call CUDA events,
    queue pre-filled, input sets rotated for a cold L2); returns output number `output` of every call and
    the calls' event times in us."""
    l2 = bench.l2_bytes()
    n_sets = bench.n_sets_for(rows, dim, l2)
    inp = bench.Inputs(rows, dim, n_sets)
    fn = bench.make_impls(inp, bench._fast_math(), None)[op]
    timer = bench.GpuTimer()
    outs = []
    for i in range(3):
        fn(i % n_sets)
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
    timer._sleep_us(40.0 * calls + 100.0)
    events[0].record()
    for i in range(calls):
        outs.append(fn(i % n_sets)[output])
        events[i + 1].record()
    torch.cuda.synchronize()
    return outs, [events[i].elapsed_time(events[i + 1]) * 1e3 for i in range(calls)]


def timeline(rows: int, dim: int, calls: int = 30) -> None:
    outs, event_us = timed_calls(rows, dim, "fused", 0, calls)
    spans, firsts, lasts, durs_first, durs_mid, tails, gaps = [], [], [], [], [], [], []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for c in range(calls):
        t = outs[c][:, :24].contiguous().view(torch.int64).reshape(rows, 3).cpu()
        start, end = t[:, 1].double(), t[:, 2].double()
        t0 = start.min()
        start, end = (start - t0) / 1e3, (end - t0) / 1e3  # us from the first CTA's start
        dur = end - start
        order = torch.argsort(start)
        span = float(end.max())
        spans.append(span)
        resident = min(rows, int((start < 0.2).sum()))  # CTAs started in the first 0.2 us: the first wave
        durs_first.append(float(dur[order[:resident]].median()))
        mid = order[resident: max(resident + 1, rows - resident)]
        durs_mid.append(float(dur[mid].median()) if len(mid) else float("nan"))
        tails.append(span - float(start.max()))
        firsts.append(resident)
        lasts.append(float(start.max()))
        gaps.append(event_us[c] - span)
    med = statistics.median
    nbytes = bench.bytes_moved(rows, dim)
    print(f"rows={rows} D={dim}: event time {med(event_us):.2f} us per call; CTAs' span (first start to last end) "
          f"{med(spans):.2f} us -> {bench.gbps(nbytes, med(spans)):.0f} GB/s over the span; event time - span "
          f"{med(gaps):.2f} us (launch, first CTA start, completion)")
    print(f"  first wave: {med(firsts):.0f} CTAs started within 0.2 us ({med(firsts) / sms:.1f} per SM), their median "
          f"lifetime {med(durs_first):.2f} us; later CTAs' median lifetime {med(durs_mid):.2f} us")
    print(f"  last CTA started at {med(lasts):.2f} us; from then to the end {med(tails):.2f} us")
    # Rows finished per microsecond over the last call (a throughput profile).
    t = outs[-1][:, :24].contiguous().view(torch.int64).reshape(rows, 3).cpu()
    start, end = t[:, 1].double(), t[:, 2].double()
    t0 = start.min()
    end_us = (end - t0) / 1e3
    active = lambda x: int(((start - t0) / 1e3 <= x).sum() - (end_us <= x).sum())  # noqa: E731
    bins = int(end_us.max()) + 1
    done = torch.histc(end_us.float(), bins=bins, min=0, max=bins)
    print("  rows finished per us (last call): " + " ".join(f"{int(v)}" for v in done.tolist()))
    print("  CTAs resident at each us (last call): " + " ".join(str(active(x + 0.5)) for x in range(bins)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=bench._int_list, default=[4096, 8192])
    p.add_argument("--dim", type=int, default=3072)
    args = p.parse_args()
    for m in args.rows:
        timeline(m, args.dim)


if __name__ == "__main__":
    main()

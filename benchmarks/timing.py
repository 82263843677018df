"""The one timing module of the benchmarks: every benchmark in this directory times through it.

Nothing here knows the op under test: a measured thing is a callable, and "rotating inputs" means a callable
``fn(i)`` that works on input set ``i`` of ``n_sets`` (made before timing). Imports without a GPU; the
functions that measure need one. Times are microseconds (``_us``), bandwidths GB/s of 1e9 bytes.

GPU time of one call
    :class:`EventTimer` ``.per_call_us(fn, n_sets, reps)``: CUDA events between consecutive calls of
    ``fn(i)``, ``i`` rotating over the sets (cold L2 when the sets span more than twice the L2:
    :func:`sets_for_cold_l2`), the GPU queue pre-filled by a spinning kernel ahead of each batch so that
    host launch time is not counted; the median. ``.probe_us`` and :func:`adaptive_reps` size the reps.
    :func:`flushed_per_call_us` ``(fn, reps, warmup, flush)``: events around each call after writing a
    buffer larger than L2 (for work whose inputs are too large to rotate: GEMMs, whole models), the host's
    work before the first kernel counted; :func:`queued_flushed_per_call_us` the same with the queue
    pre-filled ahead of each call, so that it is not (a call's time inside a busy loop).

GPU time by CUDA-graph replay (no launch cost at all)
    :func:`graph_per_call_us` ``(fn, calls, replays)``: ``fn(0) .. fn(calls - 1)`` captured in one graph
    (:func:`capture_calls`), median replay time / calls. :func:`replay_in_turns_us` replays several graphs
    in turns (so a clock drift moves them alike). The first graph of a process is preceded by a throwaway
    one (the first graph replayed in a process runs faster than every later one).

Host time
    :func:`host_us_per_call` ``(cases, calls, rounds)``: wall time per call of argument-less callables,
    the cases taking turns within each round.

The copy ceiling and a same-bytes copy
    :func:`copy_ceiling_gbps`: the highest device-to-device copy bandwidth of a few 1 GiB buffer pairs
    (read + write bytes / median time). :func:`same_bytes_copy` ``(nbytes, n_sets)``: a copy moving
    ``nbytes`` as ``fn(i)`` like an implementation, to be timed exactly like it: what the simplest kernel
    reaches at that size.

Comparing implementations in one call
    :func:`compare_by_graph` ``(impls, nbytes, calls, ceiling_gbps)``: each ``fn(i)`` of ``impls`` and a
    same-bytes copy of each by graph replay; one flat row ``{name}_us``, ``_gbps``, ``_frac_copy`` (of the
    ceiling), ``_own_copy_us``, ``_frac_own_copy`` (of a copy of its own bytes). A new benchmark (e.g. an
    FP8 op against a copy and its unfused chain) builds its input sets, calls this, checks bytes with
    :func:`results.outputs_equal`, and writes with :func:`results.write_report`.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Dict, List, Mapping, Tuple, Union

import torch

#: Where the buffers of the copy measurements live (the tests point it at the CPU).
DEVICE = "cuda"
#: L2 size assumed when the device does not report one (the H200's).
DEFAULT_L2_BYTES = 60 * 1024 * 1024
#: Bytes of each buffer of the copy ceiling.
COPY_BYTES = 1 << 30
#: Buffer pairs the copy ceiling is the best of.
COPY_PAIRS = 3
#: The fewest calls in one captured graph.
GRAPH_CALLS = 20
#: The most input sets made for one case.
MAX_SETS = 2048

Fn = Callable[[int], object]


def gbps(nbytes: int, us: float) -> float:
    """GB/s of moving ``nbytes`` in ``us`` microseconds."""
    return nbytes / (us * 1e-6) / 1e9


def l2_bytes() -> int:
    """The L2 size of GPU 0 (:data:`DEFAULT_L2_BYTES` where the device does not say)."""
    props = torch.cuda.get_device_properties(0)
    size = getattr(props, "L2_cache_size", None) or getattr(props, "l2_cache_size", None)
    return int(size) if size else DEFAULT_L2_BYTES


def sets_for_cold_l2(bytes_per_set: int, l2: int, minimum: int = 1, cap: int = MAX_SETS) -> int:
    """Input sets (at least ``minimum``, at most ``cap``) that together span more than twice the L2, so that
    no call finds its inputs there when the calls rotate over them."""
    if bytes_per_set < 1 or minimum < 1:
        raise ValueError(f"bytes_per_set and minimum must be >= 1, got {bytes_per_set} and {minimum}")
    return int(min(max(minimum, math.ceil(2 * l2 / bytes_per_set)), cap))


def adaptive_reps(est_us: float, max_reps: int, budget_s: float, min_reps: int = 10) -> int:
    """Timed calls for a case whose call takes about ``est_us``: as many as ``budget_s`` allows, between
    ``min(min_reps, max_reps)`` and ``max_reps``."""
    if not math.isfinite(est_us) or est_us <= 0:
        return max_reps
    return int(max(min(max_reps, budget_s * 1e6 / est_us), min(min_reps, max_reps)))


# ----------------------------------------------------------------------------------------------------
# Per-call GPU time, CUDA events
# ----------------------------------------------------------------------------------------------------


class EventTimer:
    """Per-call GPU time with CUDA events, the queue pre-filled by a spinning kernel (``torch.cuda._sleep``,
    whose clock rate is measured once here) so that launches do not count."""

    def __init__(self) -> None:
        self.has_sleep = hasattr(torch.cuda, "_sleep")
        self.cycles_per_us = 1500.0
        if self.has_sleep:
            torch.cuda._sleep(1000)
            torch.cuda.synchronize()
            samples = []
            for _ in range(3):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                torch.cuda._sleep(2_000_000)
                e.record()
                e.synchronize()
                samples.append(2_000_000 / (s.elapsed_time(e) * 1e3))
            self.cycles_per_us = statistics.median(samples)

    def clock_note(self) -> str:
        """One line on the SM clock the spinning kernel measured."""
        if not self.has_sleep:
            return "SM clock: not measured (no torch.cuda._sleep)"
        return f"SM clock under a spinning kernel (torch.cuda._sleep): {self.cycles_per_us:.0f} MHz"

    def sleep_us(self, us: float) -> None:
        """Queue spinning kernels of about ``us`` in all on the current stream (each at most 100 ms, so that
        the cycle count stays well inside an int32 at any clock)."""
        while self.has_sleep and us > 0:
            torch.cuda._sleep(int(min(us, 100_000.0) * self.cycles_per_us))
            us -= 100_000.0

    def per_call_us(self, fn: Fn, n_sets: int, reps: int, warmup: int = 3, batch: int = 25) -> float:
        """Median GPU time (us) of ``fn(i)``, ``i`` rotating over ``n_sets`` input sets."""
        for i in range(warmup):
            fn(i % n_sets)
        torch.cuda.synchronize()
        # Host time to enqueue one call: the sleep ahead of a batch must cover the batch's.
        k = 3
        t0 = time.perf_counter()
        for i in range(k):
            fn((warmup + i) % n_sets)
        host_us = (time.perf_counter() - t0) / k * 1e6
        torch.cuda.synchronize()
        times: List[float] = []
        idx = warmup + k
        done = 0
        while done < reps:
            b = min(batch, reps - done)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(b + 1)]
            self.sleep_us(2.0 * host_us * b + 50.0)
            events[0].record()
            for j in range(b):
                fn(idx % n_sets)
                idx += 1
                events[j + 1].record()
            torch.cuda.synchronize()
            times += [events[j].elapsed_time(events[j + 1]) * 1e3 for j in range(b)]
            done += b
        return statistics.median(times)

    @staticmethod
    def probe_us(fn: Fn, n_sets: int) -> float:
        """A rough GPU time per call (us), to size the reps (:func:`adaptive_reps`)."""
        fn(0)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for i in range(3):
            fn(i % n_sets)
        e.record()
        e.synchronize()
        return s.elapsed_time(e) * 1e3 / 3

    def adaptive_per_call_us(self, fn: Fn, n_sets: int, max_reps: int, budget_s: float) -> Tuple[float, int]:
        """(median GPU time per call in us, reps used): :meth:`per_call_us` with reps from :meth:`probe_us`."""
        reps = adaptive_reps(self.probe_us(fn, n_sets), max_reps, budget_s)
        return self.per_call_us(fn, n_sets, reps), reps


def flushed_per_call_us(fn: Callable[[], object], reps: int, warmup: int, flush: torch.Tensor) -> float:
    """Median GPU time (us) of ``fn()`` by CUDA events around each call, each call after writing ``flush``
    (a buffer larger than L2: cold L2) and synchronized before the next."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return _flushed_median_us(fn, reps, flush, lambda: None)


def queued_flushed_per_call_us(fn: Callable[[], object], reps: int, warmup: int, flush: torch.Tensor,
                               timer: EventTimer) -> float:
    """Median GPU time (us) of ``fn()`` as :func:`flushed_per_call_us` measures it, but with the GPU queue
    pre-filled ahead of each call (``timer``'s spinning kernel, twice the call's host time), so that the host
    work before its first kernel (guards, wrappers, launches) runs while the GPU is busy, as it does in a loop
    whose previous step keeps the GPU busy: the call's GPU-bound time. A loop of such calls runs at the larger
    of this and the call's host time where the call makes no synchronizing CUDA call (one that does waits for
    the queue and counts what the host does after it). NaN without ``torch.cuda._sleep``."""
    if not timer.has_sleep:
        return float("nan")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start_s = time.perf_counter()
    fn()
    host_us = (time.perf_counter() - start_s) * 1e6
    torch.cuda.synchronize()
    return _flushed_median_us(fn, reps, flush, lambda: timer.sleep_us(2.0 * host_us + 50.0))


def _flushed_median_us(fn: Callable[[], object], reps: int, flush: torch.Tensor, ahead: Callable[[], None]) -> float:
    """The median of ``reps`` event-timed calls of ``fn()``, each after writing ``flush`` and queuing ``ahead()``
    (nothing, or a spin), and synchronized before the next."""
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ahead()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def l2_flush_buffer(nbytes: int = 256 * 1024 * 1024) -> torch.Tensor:
    """A buffer to write before each call of :func:`flushed_per_call_us` (default 256 MiB, over any L2)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)


# ----------------------------------------------------------------------------------------------------
# CUDA-graph replay
# ----------------------------------------------------------------------------------------------------

_first_graph_done = False


def _capture(fn: Fn, calls: int) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up calls on a side stream, as torch's capture rules ask
        for i in range(min(3, calls)):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    return graph


def capture_calls(fn: Fn, calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``fn(0) .. fn(calls - 1)``, replayed once. The first graph of a process runs faster
    than every later one, so before the first capture a throwaway graph of ``fn`` is captured and replayed:
    no measured graph gets that advantage and the order of the cases does not change their figures."""
    global _first_graph_done
    if not _first_graph_done:
        _first_graph_done = True
        throwaway = _capture(fn, min(calls, GRAPH_CALLS))
        for _ in range(5):
            throwaway.replay()
        torch.cuda.synchronize()
        del throwaway
    return _capture(fn, calls)


def replay_once_us(graph: torch.cuda.CUDAGraph) -> float:
    """GPU time (us) of one replay of ``graph``, by CUDA events."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    graph.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3


def graph_per_call_us(fn: Fn, calls: int, replays: int = 50) -> float:
    """GPU time per call (us): the median over ``replays`` replays of a graph of ``calls`` calls of ``fn``
    (one input set each), divided by ``calls``."""
    graph = capture_calls(fn, calls)
    us = statistics.median(replay_once_us(graph) for _ in range(replays)) / calls
    del graph
    return us


def replay_in_turns_us(graphs: Mapping[str, torch.cuda.CUDAGraph], calls: int,
                       replays: int = 50) -> Dict[str, float]:
    """GPU time per call (us) of each graph of ``calls`` calls (:func:`capture_calls`): the graphs replayed in
    turns, so that a drift of the GPU's clocks moves them alike; the median replay / ``calls``. The caller
    captures them (under whatever setting each needs)."""
    samples: Dict[str, List[float]] = {name: [] for name in graphs}
    for _ in range(replays):
        for name, graph in graphs.items():
            samples[name].append(replay_once_us(graph))
    return {name: statistics.median(v) / calls for name, v in samples.items()}


# ----------------------------------------------------------------------------------------------------
# Host time
# ----------------------------------------------------------------------------------------------------


def host_us_per_call(cases: Mapping[str, Callable[[], object]], calls: int = 300,
                     rounds: int = 9) -> Dict[str, Tuple[float, float, float]]:
    """Host wall time per call (us) of each case: (median, min, max) over the rounds. The cases take turns
    within each round, so a drift of the host's speed moves them alike instead of favouring whichever ran
    first. Meant for work whose GPU time is far shorter than its host time; the stream is synchronized
    between the timed loops."""
    for fn in cases.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    samples: Dict[str, List[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    return {name: (statistics.median(v), min(v), max(v)) for name, v in samples.items()}


# ----------------------------------------------------------------------------------------------------
# Copies: the ceiling, and a copy of the same bytes
# ----------------------------------------------------------------------------------------------------


def copy_bandwidth_gbps(src: torch.Tensor, dst: torch.Tensor, reps: int = 20) -> float:
    """Device-to-device copy bandwidth of ``src`` into ``dst``: (read + write bytes) / median time."""
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    return 2 * src.numel() * src.element_size() / statistics.median(times) / 1e9


def copy_ceiling_gbps(nbytes: int = COPY_BYTES, reps: int = 20, pairs: int = COPY_PAIRS,
                      measure: Callable[[torch.Tensor, torch.Tensor, int], float] = copy_bandwidth_gbps
                      ) -> Tuple[float, List[float]]:
    """The copy ceiling and each pair's figure: the highest copy bandwidth of ``pairs`` pairs of ``nbytes``
    buffers, all allocated before any is timed (so that they lie in different memory). One pair's figure
    moves by a few percent between processes while kernel times do not; the highest of several is the best
    a copy reaches, the conservative ceiling for fractions against it. Fewer pairs where memory runs out
    (at least one)."""
    def pair() -> Tuple[torch.Tensor, torch.Tensor]:  # (no name outside `buffers` keeps a buffer alive)
        src = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE).fill_(1)
        return src, torch.empty_like(src)

    buffers = []
    try:
        for _ in range(max(1, pairs)):
            buffers.append(pair())
    except torch.cuda.OutOfMemoryError:
        if not buffers:
            raise
    per_pair = [measure(src, dst, reps) for src, dst in buffers]
    del buffers
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return max(per_pair), per_pair


def ceiling_note(ceiling: float, per_pair: List[float]) -> str:
    """One line naming the copy ceiling and how it was taken."""
    detail = (f"the highest of {len(per_pair)} buffer pairs: " + ", ".join(f"{g:.0f}" for g in per_pair)
              if len(per_pair) > 1 else "one buffer pair")
    return (f"copy ceiling: {ceiling:.0f} GB/s ({COPY_BYTES >> 20} MiB device-to-device copy, read + write bytes / "
            f"median time; {detail})")


def same_bytes_copy(nbytes: int, n_sets: int) -> Tuple[Fn, int]:
    """A device-to-device copy of the same traffic as ``nbytes`` (half read, half written) on ``n_sets``
    buffer pairs, as ``fn(i)`` like the implementations, and the bytes it moves."""
    half = nbytes // 2
    src = [torch.empty(half, dtype=torch.uint8, device=DEVICE).fill_(1) for _ in range(n_sets)]
    dst = [torch.empty_like(t) for t in src]
    return (lambda i: dst[i].copy_(src[i])), 2 * half


# ----------------------------------------------------------------------------------------------------
# Several implementations of one case
# ----------------------------------------------------------------------------------------------------


def compare_by_graph(impls: Mapping[str, Fn], nbytes: Union[int, Mapping[str, int]], calls: int,
                     ceiling_gbps: float, replays: int = 50) -> Dict[str, float]:
    """Each ``impls[name]`` (``fn(i)`` over ``calls`` input sets) by :func:`graph_per_call_us`, and a copy of
    its bytes timed the same way (one per distinct byte count). ``nbytes``: the bytes every implementation
    must move, one number or one per name. Returns ``{name}_bytes``, ``{name}_us``, ``{name}_gbps``,
    ``{name}_frac_copy`` (of ``ceiling_gbps``), ``{name}_own_copy_us`` and ``{name}_frac_own_copy`` (the copy's
    time over the implementation's: 1.0 = as fast as a copy of its bytes)."""
    row: Dict[str, float] = {}
    copy_us: Dict[int, float] = {}
    for name, fn in impls.items():
        n = nbytes if isinstance(nbytes, int) else nbytes[name]
        us = graph_per_call_us(fn, calls, replays)
        if n not in copy_us:
            copy_fn, copied = same_bytes_copy(n, calls)
            copy_us[n] = graph_per_call_us(copy_fn, calls, replays) * n / copied
            del copy_fn
        row.update({f"{name}_bytes": n, f"{name}_us": us, f"{name}_gbps": gbps(n, us),
                    f"{name}_frac_copy": gbps(n, us) / ceiling_gbps, f"{name}_own_copy_us": copy_us[n],
                    f"{name}_frac_own_copy": copy_us[n] / us})
    return row

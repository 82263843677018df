"""GPU tests of programmatic dependent launch (csrc/pdl.cuh): with PDL on and off (set_launch_options), every row
kernel gives the bytes of a fully synchronized run when its inputs are written by the kernel just before it
and when its outputs reuse memory the kernel before it still reads; CUDA-graph capture keeps PDL (a
programmatic edge) and the bytes; the switch reaches the C++ launcher.

Why these predecessors can expose a missing wait: this library's own kernels let their successors launch
early (griddepcontrol.launch_dependents right after their wait), once every CTA of theirs has started. With
rows for one wave (17, 256, 1024: every CTA resident at once) the successor then starts while every
predecessor CTA still runs, so one without griddepcontrol.wait would read rows not yet written, or overwrite
memory still being read. (With many waves only the last wave overlaps the successor's first CTAs, which take
other rows; 4096 rows cover the many-rows configuration's kernels.)
"""

from __future__ import annotations

import ctypes
import inspect
from typing import Dict, Tuple

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import _library

pytestmark = pytest.mark.gpu

D = 3072
EPS = 1e-6
ROWS = (17, 256, 1024, 4096)
ops = torch.ops.qwen_fp4 if _library.cuda_available() else None


@pytest.fixture
def set_pdl():
    """Sets the PDL switch for the test (qwen_resnorm_fp4.set_launch_options); the options come back after."""
    before = q.launch_options()
    yield lambda on: q.set_launch_options(pdl=on)
    q.set_launch_options(*before)


def make_inputs(rows: int, seed: int = 0) -> Dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed + rows)
    bf = torch.bfloat16

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * std).to(bf)

    return {"residual": randn(1, rows, D, std=2.0), "x": randn(1, rows, D), "gate": randn(1, D, std=0.5),
            "scale": randn(1, D, std=0.1), "shift": randn(1, D, std=0.1),
            "a": randn(rows, D), "weight": randn(D, D, std=D ** -0.5),
            "global_scale": torch.full((1,), 60.0, device="cuda", dtype=torch.float32)}


def chain(inp: Dict[str, torch.Tensor], synchronize: bool) -> Tuple[torch.Tensor, ...]:
    """A GEMM, then each op on the outputs of the kernel just before it: mm -> resnorm -> resnorm_quant ->
    resnorm -> nvfp4_quantize (synchronize: the stream drained after every step, the reference)."""
    g, s, sh, gs = inp["gate"], inp["scale"], inp["shift"], inp["global_scale"]
    out = []

    def step(t):
        if synchronize:
            torch.cuda.synchronize()
        out.extend(t if isinstance(t, (tuple, list)) else (t,))
        return t

    x = step(torch.mm(inp["a"], inp["weight"].t()).view(1, -1, D))
    y1, r1 = step(ops.resnorm(inp["residual"], x, None, g, s, sh, EPS))
    _, _, r2 = step(ops.resnorm_quant(r1, y1, None, g, s, sh, gs, EPS, True))
    y3, _ = step(ops.resnorm(r2, y1, None, g, s, sh, EPS))
    step(ops.nvfp4_quantize(y3, gs, False))
    if synchronize:
        torch.cuda.synchronize()
    return tuple(out)


def assert_same_bytes(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and torch.equal(a, b), f"output {i} of the chain differs"


@pytest.mark.parametrize("pdl", [True, False])
@pytest.mark.parametrize("rows", ROWS)
def test_chain_on_predecessor_outputs_matches_synchronized_run(rows, pdl, set_pdl):
    inp = make_inputs(rows)
    set_pdl(False)
    want = chain(inp, synchronize=True)
    set_pdl(pdl)
    for _ in range(3):  # several runs: a race would not show every time
        got = chain(inp, synchronize=False)
        torch.cuda.synchronize()
        assert_same_bytes(got, want)


@pytest.mark.skipif(not hasattr(torch.cuda, "use_mem_pool"), reason="this torch has no torch.cuda.use_mem_pool")
@pytest.mark.parametrize("rows", (17, 256))
def test_output_reusing_memory_the_predecessor_still_reads(rows, set_pdl):
    """resnorm B's output gets the block of resnorm A's input x, freed right after A was enqueued: B must not
    write it before A has finished reading it. A fresh memory pool per run makes the reuse certain: x, then
    A's two outputs, fill the start of its first segment, so x's block is the smallest free block that fits."""
    set_pdl(True)
    inp = make_inputs(rows, seed=1)
    g, s, sh = inp["gate"], inp["scale"], inp["shift"]
    y_a_ref, r_a_ref = ops.resnorm(inp["residual"], inp["x"], None, g, s, sh, EPS)
    torch.cuda.synchronize()
    y_b_ref, r_b_ref = ops.resnorm(r_a_ref, y_a_ref, None, g, s, sh, EPS)
    torch.cuda.synchronize()
    for _ in range(3):
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            x_tmp = inp["x"].clone()
            torch.cuda.synchronize()
            y_a, r_a = ops.resnorm(inp["residual"], x_tmp, None, g, s, sh, EPS)
            x_ptr, x_bytes = x_tmp.data_ptr(), x_tmp.numel() * x_tmp.element_size()
            del x_tmp  # back to the pool, reusable at once on this stream
            y_b, r_b = ops.resnorm(r_a, y_a, None, g, s, sh, EPS)
        assert any(t.data_ptr() < x_ptr + x_bytes and x_ptr < t.data_ptr() + x_bytes for t in (y_b, r_b)), \
            "precondition: B's output reuses A's input block"
        torch.cuda.synchronize()
        assert_same_bytes((y_a, r_a, y_b, r_b), (y_a_ref, r_a_ref, y_b_ref, r_b_ref))
        del y_a, r_a, y_b, r_b
        del pool


def _capture(fn, keep_graph: bool = False):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True) if keep_graph else torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.parametrize("rows", (17, 6889))
def test_graph_capture_with_pdl(rows, set_pdl):
    set_pdl(True)
    inp = make_inputs(rows, seed=2)
    graph, out = _capture(lambda: chain(inp, synchronize=False))
    for seed in (2, 3):  # new inputs copied into the captured ones: the replay recomputes everything
        fresh = make_inputs(rows, seed=seed)
        for k in inp:
            inp[k].copy_(fresh[k])
        set_pdl(False)
        want = chain(fresh, synchronize=True)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bytes(out, want)


class _EdgeData(ctypes.Structure):  # CUgraphEdgeData
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


_PROGRAMMATIC = 1  # CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC


def _edge_types(graph: torch.cuda.CUDAGraph):
    """The dependency types of the captured graph's edges, by the driver's cuGraphGetEdges_v2."""
    try:
        get_edges = ctypes.CDLL("libcuda.so.1").cuGraphGetEdges_v2
    except (OSError, AttributeError):
        pytest.skip("the driver has no cuGraphGetEdges_v2 (CUDA 12.3+)")
    handle = ctypes.c_void_p(graph.raw_cuda_graph())
    n = ctypes.c_size_t(0)
    assert get_edges(handle, None, None, None, ctypes.byref(n)) == 0
    frm, to = (ctypes.c_void_p * n.value)(), (ctypes.c_void_p * n.value)()
    data = (_EdgeData * n.value)()
    assert get_edges(handle, frm, to, data, ctypes.byref(n)) == 0
    return [d.type for d in data[:n.value]]


@pytest.mark.skipif("keep_graph" not in str(inspect.signature(torch.cuda.CUDAGraph.__new__)),
                    reason="this torch has no CUDAGraph(keep_graph=True)")
@pytest.mark.parametrize("pdl", [True, False])
def test_switch_reaches_the_launcher(pdl, set_pdl):
    """The PDL switch decides whether resnorm -> nvfp4_quantize is captured with a programmatic edge."""
    set_pdl(pdl)
    inp = make_inputs(256, seed=4)

    def pair():
        y, _ = ops.resnorm(inp["residual"], inp["x"], None, inp["gate"], inp["scale"], inp["shift"], EPS)
        return ops.nvfp4_quantize(y, inp["global_scale"], True)

    graph, _ = _capture(pair, keep_graph=True)
    types = _edge_types(graph)
    assert types, "the graph has the pair's edge"
    assert (_PROGRAMMATIC in types) == pdl, types

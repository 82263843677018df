"""CPU tests of the FP8 benchmarks (benchmarks/bench_fp8.py, bench_fp8_linear.py) and of bench_model: byte models,
option parsing, the torch peers, the tables, the correctness checks, and each main with its measurements faked
(the rows reach the report; a failed or missing check fails the run, a poor figure does not). None needs a GPU;
the tests that run this build's FP8 ops on the CPU skip where the build has none."""

from __future__ import annotations

import functools
import math
import os
import sys
import types

import pytest
import torch

from helpers.diffusers_models import needs_diffusers
from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
BENCH = ROOT / "benchmarks"
if not (BENCH / "bench_fp8.py").is_file():
    pytest.skip("benchmarks/ not in this copy of the tests", allow_module_level=True)
sys.path.insert(0, str(BENCH))

import bench_fp8  # noqa: E402
import bench_fp8_linear  # noqa: E402
import bench_model  # noqa: E402
import harness  # noqa: E402
import qwen_resnorm_fp4  # noqa: E402
import timing  # noqa: E402

HAS_FP8_OPS = bench_fp8.fp8_ops_missing() is None
needs_fp8_ops = pytest.mark.skipif(not HAS_FP8_OPS, reason="this build has no FP8 ops")
needs_fp8_linear = pytest.mark.skipif(not hasattr(qwen_resnorm_fp4, "FP8Linear"), reason="this build has no FP8Linear")
nan = float("nan")


def _fake_gpu(monkeypatch):
    monkeypatch.setattr(harness, "refuse_without_gpu", lambda prog: None)
    monkeypatch.setattr(harness, "run_header", lambda: ["GPU: fake"])
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


# ----------------------------------------------------------------------------------------------------
# bench_fp8: bytes, options, peers
# ----------------------------------------------------------------------------------------------------


def test_fp8_byte_models():
    d = 3072
    assert bench_fp8.fused_bytes(1, d) == 2 * d * 2 + d * 2 + d == 21_504  # residual + x, residual_out, y
    assert bench_fp8.fused_bytes(4096, d, per_token=True) == 4096 * (21_504 + 3 * d * 2)
    assert bench_fp8.norm_modulate_bytes(17, 5120) == 17 * 5120 * 3
    assert bench_fp8.norm_modulate_bytes(17, 5120, per_token=True) == 17 * 5120 * (3 + 4)
    assert bench_fp8.quantize_bytes(256, 12288) == 256 * 12288 * 3
    assert bench_fp8.op_bytes("gelu_fp8", 256, 12288, True) == bench_fp8.quantize_bytes(256, 12288)
    assert bench_fp8.op_bytes("resnorm_quant_fp8", 8, d, True) == bench_fp8.fused_bytes(8, d, True)
    with pytest.raises(ValueError, match="op must be one of"):
        bench_fp8.op_bytes("resnorm_quant", 1, d, False)


@pytest.mark.parametrize("dims, ok", [("3072,5120", True), ("48,16384", True), ("40", False), ("3072,8", False),
                                      ("16400", False)])
def test_fp8_width_rule_is_judged_before_needing_a_gpu(dims, ok, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_fp8.main(["--dims", dims]) == 2
    err = capsys.readouterr().err
    assert ("D must be a positive multiple of 16, at most 16384" in err) != ok
    assert ("GPU only" in err) == ok


@pytest.mark.parametrize("argv, message", [
    (["--ops", "fp8_quantize,nope"], "argument --ops: expected comma-separated ops of resnorm_quant_fp8"),
    (["--ops", ""], "argument --ops: expected comma-separated ops"),
    (["--modulation", "row"], "argument --modulation: expected comma-separated modulations of batch, token"),
])
def test_fp8_choice_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_fp8.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_fp8_options_parse():
    args = bench_fp8.build_parser().parse_args(["--ops", "gelu_fp8,fp8_quantize,gelu_fp8", "--modulation",
                                                "token,batch"])
    assert args.ops == ["gelu_fp8", "fp8_quantize"] and args.modulation == ["token", "batch"]
    args = bench_fp8.build_parser().parse_args([])
    assert args.ops == list(bench_fp8.OPS) and args.modulation == ["batch"]


def test_fp8_refuses_a_build_without_the_ops(monkeypatch, tmp_path, capsys):
    _fake_gpu(monkeypatch)
    monkeypatch.setattr(bench_fp8, "fp8_ops_missing", lambda: "this build has no FP8 ops (fake)")
    assert bench_fp8.main(["--out", str(tmp_path / "never")]) == 2
    assert "this build has no FP8 ops (fake); nothing to measure." in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_fp8_ops_missing_names_the_first_missing_op():
    reason = bench_fp8.fp8_ops_missing()
    present = all(hasattr(torch.ops.qwen_fp4, n) for n in ("resnorm_quant_fp8", "fp8_quantize",
                                                            "norm_modulate_quant_fp8"))
    assert (reason is None) == present
    if reason is not None:
        assert reason.startswith("this build of qwen_resnorm_fp4 has no torch.ops.qwen_fp4.")


def test_torch_quantize_saturates_and_rounds_to_nearest_even():
    y = torch.tensor([1000.0, -1000.0, 1.0625, 1.1875, 0.0, -0.0, 448.0, 464.0]).bfloat16()
    q = bench_fp8.torch_quantize(y, torch.tensor([1.0]))
    assert q.dtype == torch.float8_e4m3fn
    # 1.0625 is halfway between 1.0 and 1.125 (even: 1.0); 1.1875 between 1.125 and 1.25 (even: 1.25)
    assert q.float().tolist() == [448.0, -448.0, 1.0, 1.25, 0.0, -0.0, 448.0, 448.0]
    assert bench_fp8.torch_quantize(torch.tensor([3.0]).bfloat16(), torch.tensor([0.5])).float().tolist() == [1.5]


def test_torch_chains_compute_the_diffusers_segment():
    g = torch.Generator().manual_seed(0)
    res, x = (torch.randn(1, 5, 64, generator=g).bfloat16() for _ in range(2))
    gate, scale, shift = ((torch.randn(1, 64, generator=g) * 0.3).bfloat16() for _ in range(3))
    inv = torch.tensor([2.0])
    q, r = bench_fp8.torch_resnorm_fp8(res, x, gate, scale, shift, inv)
    expect_r = res + gate * x
    assert torch.equal(r, expect_r) and q.shape == x.shape and q.dtype == torch.float8_e4m3fn
    n = torch.nn.functional.layer_norm(expect_r, (64,), eps=harness.EPS)
    assert torch.equal(q.view(torch.uint8), bench_fp8.torch_quantize(n * (1 + scale) + shift, inv).view(torch.uint8))
    q2 = bench_fp8.torch_norm_modulate_fp8(expect_r, scale, shift, inv)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
    h = torch.randn(3, 32, generator=g).bfloat16()
    gq = bench_fp8.torch_gelu_fp8(h, inv)
    ref = bench_fp8.torch_quantize(torch.nn.functional.gelu(h, approximate="tanh"), inv)
    assert torch.equal(gq.view(torch.uint8), ref.view(torch.uint8))


def test_input_scale_and_equal_frac():
    y = torch.tensor([[1.0, -896.0], [2.0, 0.5]]).bfloat16()
    s = bench_fp8.input_scale_for(y)
    assert s.dtype == torch.float32 and s.tolist() == [2.0]
    a = torch.tensor([1.0, 2.0, 3.0, 4.0]).to(torch.float8_e4m3fn)
    b = torch.tensor([1.0, 2.0, 3.5, 4.0]).to(torch.float8_e4m3fn)
    assert bench_fp8.equal_frac(a, b) == 0.75


@needs_fp8_ops
@pytest.mark.parametrize("op", bench_fp8.OPS)
@pytest.mark.parametrize("per_token", [False, True], ids=["batch", "token"])
def test_fp8_implementations_on_cpu(op, per_token):
    """This build's CPU ops: the fused op equals its unfused chain on every set; each implementation returns
    E4M3 of the input's shape."""
    from results import outputs_equal

    dim = 1024 if op == "gelu_fp8" else 256
    inp = bench_fp8.Inputs(op, 9, dim, 2, per_token, device="cpu")
    impls = bench_fp8.make_impls(inp, None)
    assert list(impls) == [n for n in bench_fp8.IMPLS[op] if n != "compiled"]
    for i in range(2):
        out = bench_fp8.first(impls["fused"](i))
        assert out.dtype == torch.float8_e4m3fn and out.shape == inp.x[i].shape
        if "unfused" in impls:
            assert outputs_equal(impls["fused"](i), impls["unfused"](i))
        assert bench_fp8.first(impls["torch"](i)).shape == out.shape


# ----------------------------------------------------------------------------------------------------
# bench_fp8: the byte check and the report
# ----------------------------------------------------------------------------------------------------


def _fp8_row(op="resnorm_quant_fp8", rows=4096, frac=0.93, x_unfused=1.55, x_torch=4.0, exact=True,
             modulation="batch", dim=3072):
    r = {"op": op, "dim": dim, "rows": rows, "modulation": modulation, "calls": 20, "bytes": 1,
         "fused_us": 10.0, "fused_frac_own_copy": frac, "fused_frac_copy": frac - 0.05,
         "torch_us": 10.0 * x_torch, "x_torch": x_torch, "compiled_us": nan, "x_compiled": nan}
    if "unfused" in bench_fp8.IMPLS[op]:
        r.update(unfused_us=10.0 * x_unfused, x_unfused=x_unfused)
        if exact is not None:
            r["byte_exact"] = exact
    return r


def test_fp8_byte_check_covers_every_op_with_an_unfused_chain_and_missing_checks():
    rows = [_fp8_row(), _fp8_row("norm_modulate_quant_fp8", rows=17, exact=False),
            _fp8_row("norm_modulate_quant_fp8", rows=256, exact=None)]
    assert bench_fp8.byte_check_failures(rows) == [
        "norm_modulate_quant_fp8 D=3072 rows=17, batch modulation: byte_exact failed",
        "norm_modulate_quant_fp8 D=3072 rows=256, batch modulation: byte_exact not checked"]
    assert bench_fp8.byte_check_failures([_fp8_row("gelu_fp8", dim=12288)]) == []
    assert bench_fp8.byte_check_failures([_fp8_row("gelu_fp8", dim=12288, exact=None)]) == [
        "gelu_fp8 D=12288 rows=4096: byte_exact not checked"]
    assert bench_fp8.byte_check_failures([_fp8_row("fp8_quantize", exact=None)]) == []  # no unfused chain


def test_fp8_tables():
    rows = [_fp8_row(rows=17), _fp8_row("fp8_quantize", rows=17), _fp8_row(rows=4096, exact=False)]
    lines = bench_fp8.table_lines(rows, "resnorm_quant_fp8")
    assert len(lines) == 4 and lines[0].startswith("| D | rows | modulation | us | % of a same-bytes copy |")
    assert lines[0].endswith("| fused == unfused |") and lines[3].endswith("| NO |")
    assert lines[2] == ("| 3072 | 17 | batch | 10.00 | 93.0 | 88.0 | 15.50 | 1.55 | 40.00 | 4.00 | n/a | n/a "
                        "| yes |")
    q = bench_fp8.table_lines(rows, "fp8_quantize")
    assert len(q) == 3 and "modulation" not in q[0] and "fused == unfused" not in q[0] and "unfused us" not in q[0]


def _fake_fp8_measurements(monkeypatch, bad=()):
    calls = []

    def measure_case(op, rows, dim, modulation, l2, ceiling, compiled, replays):
        calls.append((op, rows, dim, modulation, compiled is None, replays))
        r = _fp8_row(op, rows=rows, dim=dim, modulation=modulation, exact=(op, rows) not in bad)
        r["calls"], r["bytes"] = 20, bench_fp8.op_bytes(op, rows, dim, modulation == "token")
        return r

    _fake_gpu(monkeypatch)
    monkeypatch.setattr(bench_fp8, "fp8_ops_missing", lambda: None)
    monkeypatch.setattr(timing, "l2_bytes", lambda: 50 << 20)
    monkeypatch.setattr(timing, "copy_ceiling_gbps", lambda: (4000.0, [4000.0]))
    monkeypatch.setattr(bench_fp8, "measure_case", measure_case)
    return calls


def test_fp8_main_measures_every_case_and_writes_the_report(monkeypatch, tmp_path, capsys):
    calls = _fake_fp8_measurements(monkeypatch)
    argv = ["--rows", "17,4096", "--dims", "3072,5120", "--modulation", "batch,token", "--no-compile",
            "--out", str(tmp_path)]
    assert bench_fp8.main(argv) == 0
    per_norm_op = [(r, d, m) for d in (3072, 5120) for r in (17, 4096) for m in ("batch", "token")]
    assert [c[1:4] for c in calls if c[0] == "resnorm_quant_fp8"] == per_norm_op
    assert [c[1:4] for c in calls if c[0] == "norm_modulate_quant_fp8"] == per_norm_op
    assert [c[1:4] for c in calls if c[0] == "fp8_quantize"] == [(r, d, "batch") for d in (3072, 5120)
                                                                 for r in (17, 4096)]
    assert [c[1:4] for c in calls if c[0] == "gelu_fp8"] == [(17, 12288, "batch"), (4096, 12288, "batch")]
    assert all(c[4] and c[5] == 50 for c in calls)  # --no-compile: no compiled peer
    csv_lines = (tmp_path / "bench_fp8.csv").read_text().splitlines()
    assert csv_lines[0].split(",") == bench_fp8.CSV_FIELDS and len(csv_lines) == 1 + len(calls)
    first = dict(zip(bench_fp8.CSV_FIELDS, csv_lines[1].split(",")))
    assert (first["op"], first["rows"], first["modulation"], first["fused_us"], first["x_unfused"]) == (
        "resnorm_quant_fp8", "17", "batch", "10.0", "1.55")
    md = (tmp_path / "bench_fp8.md").read_text()
    for op in bench_fp8.OPS:
        assert f"## {bench_fp8.SUBJECT[op]}" in md
    assert "| 5120 | 4096 | token | 10.00 | 93.0 | 88.0 | 15.50 | 1.55 |" in md
    out, err = capsys.readouterr()
    assert "resnorm_quant_fp8 D=5120 rows=4096, token modulation: 10.00 us (93.0% of a same-bytes copy)" in out
    assert err == ""


def test_fp8_main_quick_and_failures(monkeypatch, tmp_path, capsys):
    calls = _fake_fp8_measurements(monkeypatch, bad={("norm_modulate_quant_fp8", 4096)})
    assert bench_fp8.main(["--quick", "--no-compile", "--ops", "resnorm_quant_fp8,norm_modulate_quant_fp8",
                           "--out", str(tmp_path)]) == 1
    assert {c[1] for c in calls} == set(bench_fp8.QUICK_ROWS) and {c[2] for c in calls} == {3072}
    assert all(c[5] == 20 for c in calls)
    err = capsys.readouterr().err
    assert "check failed: fused and unfused FP8 outputs differ" in err
    assert "norm_modulate_quant_fp8 D=3072 rows=4096, batch modulation: byte_exact failed" in err


def test_fp8_main_prints_a_slow_figure_without_failing(monkeypatch, tmp_path, capsys):
    """The fused op slower than its unfused chain and far from the copy is a measurement, not a failed run."""
    _fake_fp8_measurements(monkeypatch)
    real = bench_fp8.measure_case

    def slow(*a, **k):
        r = real(*a, **k)
        r.update(x_unfused=0.8, fused_frac_own_copy=0.3)
        return r

    monkeypatch.setattr(bench_fp8, "measure_case", slow)
    assert bench_fp8.main(["--rows", "4096", "--dims", "3072", "--ops", "resnorm_quant_fp8", "--no-compile",
                           "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "(30.0% of a same-bytes copy), x unfused 0.80" in out and err == ""
    md = (tmp_path / "bench_fp8.md").read_text()
    assert "| 3072 | 4096 | batch | 10.00 | 30.0 |" in md and "PASS" not in md and "FAIL" not in md


# ----------------------------------------------------------------------------------------------------
# bench_fp8_linear
# ----------------------------------------------------------------------------------------------------


def _fake_layer(per_channel: bool, bias: bool = True):
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(8, 32, generator=g) * 50).clamp(-448, 448).to(torch.float8_e4m3fn)
    ws = torch.rand(8 if per_channel else 1, generator=g) + 0.01
    return types.SimpleNamespace(weight=w, weight_scale=ws, input_scale=torch.tensor([0.25]),
                                 bias=torch.randn(8, generator=g).bfloat16() if bias else None)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_dequantized_reference(per_channel, bias):
    layer = _fake_layer(per_channel, bias)
    q = (torch.randn(5, 32) * 30).to(torch.float8_e4m3fn)
    ref = bench_fp8_linear.dequantized_reference(layer, q)
    assert ref.dtype == torch.float64 and ref.shape == (5, 8)
    expect = torch.empty(5, 8, dtype=torch.float64)
    for i in range(5):
        for j in range(8):
            acc = sum(float(q[i, k].float()) * float(layer.weight[j, k].float()) for k in range(32))
            s = float(layer.weight_scale[j if per_channel else 0])
            expect[i, j] = acc * 0.25 * s + (float(layer.bias[j].float()) if bias else 0.0)
    assert torch.allclose(ref, expect, rtol=1e-12, atol=1e-9)


def test_linear_rel_err():
    ref = torch.tensor([3.0, 4.0])
    assert bench_fp8_linear.rel_err(torch.tensor([3.0, 4.0]), ref) == 0.0
    assert bench_fp8_linear.rel_err(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)


@needs_fp8_linear
def test_fp8_linear_cpu_path_is_within_the_bound_of_the_reference():
    """FP8Linear's dequantized CPU path against the float64 oracle: within REL_ERR_BOUND (one bf16 rounding),
    and the BF16-input form equals the E4M3-input form."""
    lin = torch.nn.Linear(128, 64).bfloat16()
    x = torch.randn(16, 128).bfloat16()
    layer = qwen_resnorm_fp4.FP8Linear.from_linear(lin, x.float().abs().amax())
    q = qwen_resnorm_fp4.fp8_quantize(x, layer.input_scale)
    out = layer(q)
    assert torch.equal(layer(x), out)
    err = bench_fp8_linear.rel_err(out, bench_fp8_linear.dequantized_reference(layer, q))
    assert 0 < err <= bench_fp8_linear.REL_ERR_BOUND


def _linear_row(name="fc1", m=4096, k=3072, n=12288, forms=True, close=True):
    return {"layer": name, "M": m, "K": k, "N": n, "bf16_ms": 0.4, "fp8_ms": 0.26, "fp8_prequantized_ms": 0.24,
            "quantize_ms": 0.02, "ratio": 0.65, "ratio_prequantized": 0.6, "rel_err_vs_reference": 1.7e-3,
            "rel_err_vs_bf16": 3.1e-2, "forms_equal": forms, "close_to_reference": close}


def test_linear_checks_and_table():
    assert bench_fp8_linear.byte_check_failures([_linear_row()]) == []
    assert bench_fp8_linear.byte_check_failures([_linear_row(forms=False, close=False)]) == [
        "fc1 4096 x 3072 x 12288: forms_equal failed", "fc1 4096 x 3072 x 12288: close_to_reference failed"]
    row = _linear_row()
    del row["close_to_reference"]
    assert bench_fp8_linear.byte_check_failures([row]) == ["fc1 4096 x 3072 x 12288: close_to_reference not checked"]
    lines = bench_fp8_linear.table_lines([_linear_row()])
    assert lines[2] == ("| fc1 | 4096 x 3072 x 12288 | 0.400 | 0.260 | 0.65x | 0.240 | 0.60x | 0.020 | 1.70e-03 | "
                        "3.10e-02 | yes |")


def test_linear_shapes_are_qwen_images():
    assert bench_fp8_linear.SHAPES == (("qkv_out", 3072, 3072), ("fc1", 3072, 12288), ("fc2", 12288, 3072))
    assert bench_fp8_linear.DEFAULT_TOKENS == (4096, 6889, 10209)


def _fake_linear(monkeypatch, bad=()):
    calls = []

    def bench_shape(name, m, k, n, reps, warmup, per_channel, use_fast_accum, flush):
        calls.append((name, m, k, n, reps, warmup, per_channel, use_fast_accum))
        return _linear_row(name, m, k, n, forms=(name, m) not in bad)

    _fake_gpu(monkeypatch)
    monkeypatch.setattr(bench_fp8_linear, "fp8_linear_missing", lambda: None)
    monkeypatch.setattr(timing, "l2_flush_buffer", lambda: None)
    monkeypatch.setattr(bench_fp8_linear, "bench_shape", bench_shape)
    return calls


def test_linear_main(monkeypatch, tmp_path, capsys):
    calls = _fake_linear(monkeypatch)
    assert bench_fp8_linear.main(["--out", str(tmp_path)]) == 0
    assert [(c[0], c[1]) for c in calls] == [(s, m) for s, _, _ in bench_fp8_linear.SHAPES for m in (4096, 6889, 10209)]
    assert all(c[4:] == (30, 5, False, True) for c in calls)
    assert len((tmp_path / "bench_fp8_linear.csv").read_text().splitlines()) == 1 + 9
    assert "| fc2 | 10209 x 12288 x 3072 |" in (tmp_path / "bench_fp8_linear.md").read_text()
    calls.clear()
    assert bench_fp8_linear.main(["--tokens", "256", "--per-channel", "--no-fast-accum", "--reps", "7",
                                  "--out", str(tmp_path)]) == 0
    assert [c[1] for c in calls] == [256] * 3 and all(c[4:] == (7, 5, True, False) for c in calls)


def test_linear_main_fails_loudly(monkeypatch, tmp_path, capsys):
    _fake_linear(monkeypatch, bad={("qkv_out", 6889)})
    assert bench_fp8_linear.main(["--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "check failed: FP8Linear" in err and "qkv_out 6889 x 3072 x 3072: forms_equal failed" in err


def test_linear_refuses_a_build_without_fp8linear(monkeypatch, tmp_path, capsys):
    _fake_gpu(monkeypatch)
    monkeypatch.setattr(bench_fp8_linear, "fp8_linear_missing", lambda: "no FP8Linear (fake)")
    assert bench_fp8_linear.main(["--out", str(tmp_path / "never")]) == 2
    assert "no FP8Linear (fake); nothing to measure." in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


# ----------------------------------------------------------------------------------------------------
# bench_model: cases, checks, the report, --peers
# ----------------------------------------------------------------------------------------------------


def test_model_image_shapes():
    assert bench_model.image_shapes(6889, False) == [(1, 83, 83)]
    assert bench_model.image_shapes(10209, False) == [(1, 83, 123)]
    assert bench_model.image_shapes(6889, True) == [(1, 83, 42), (1, 83, 41)]
    assert bench_model.image_shapes(10209, True) == [(1, 83, 62), (1, 83, 61)]
    assert bench_model.image_shapes(7, False) == [(1, 1, 7)]
    for t in (6889, 10209, 4096, 24, 2):
        for z in (False, True):
            assert sum(f * h * w for f, h, w in bench_model.image_shapes(t, z)) == t
    with pytest.raises(ValueError, match="cannot be split"):
        bench_model.image_shapes(1, True)


def test_model_rejects_unsplittable_tokens_before_needing_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_model.main(["--tokens", "6889,1"]) == 2
    assert "--tokens: tokens=1 cannot be split" in capsys.readouterr().err
    assert bench_model.main(["--tokens", "1", "--zero-cond-t", "off"]) == 2  # fine: then no GPU
    assert "GPU only" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--formats", "fp4"], "argument --formats: expected comma-separated formats of nvfp4, fp8"),
    (["--linears", "modelopt"], "argument --linears: expected comma-separated linears presets of all, fc1"),
    (["--zero-cond-t", "yes"], "argument --zero-cond-t: invalid choice"),
])
def test_model_choice_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_model.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_model_stats_fields():
    good = {"fused": 8, "unfused": 0, "fallback": 0, "decline_reasons": {}}
    assert bench_model.stats_fields(good, 8) == {"fused_segments": 8, "fallbacks": 0, "decline_reasons": "",
                                                 "no_fallback": True}
    fell = {"fused": 6, "unfused": 0, "fallback": 2, "decline_reasons": {"cpu_tensors": 1, "a": 1}}
    f = bench_model.stats_fields(fell, 8)
    assert f["no_fallback"] is False and f["decline_reasons"] == "a: 1; cpu_tensors: 1"
    assert bench_model.stats_fields({"fused": 4, "unfused": 0, "fallback": 0}, 8)["no_fallback"] is False
    assert bench_model.stats_fields({}, 8)["no_fallback"] is False


def _model_row(tokens=6889, zct=False, fmt="fp8", linears="all", ratio=0.75, err=0.004, exact=True,
               no_fallback=True, batch=1):
    return {"tokens": tokens, "zero_cond_t": zct, "batch": batch, "format": fmt, "linears": linears,
            "bf16_ms": 20.0, "fused_ms": 20.0 * ratio, "unfused_ms": 21.0 * ratio, "fused_over_bf16": ratio,
            "rel_err_vs_bf16": err, "fused_equals_unfused": exact, "no_fallback": no_fallback,
            "fused_segments": 8 if no_fallback else 6, "fallbacks": 0 if no_fallback else 2,
            "restored_equals_bf16": True}


def test_model_fp8_over_nvfp4_and_table():
    rows = [_model_row(fmt="nvfp4", ratio=1.0), _model_row(fmt="fp8", ratio=0.75), _model_row(fmt="fp8", zct=True)]
    bench_model.add_fp8_over_nvfp4(rows)
    assert rows[1]["fp8_over_nvfp4"] == pytest.approx(0.75)
    assert rows[0]["fp8_over_nvfp4"] != rows[0]["fp8_over_nvfp4"] and rows[2]["fp8_over_nvfp4"] != \
        rows[2]["fp8_over_nvfp4"]  # NaN: no peer
    lines = bench_model.table_lines(rows)
    assert lines[3] == "| 6889 | no | 1 | fp8 | all | 20.00 | 15.00 | 15.75 | 0.75x | 0.75 | 0.0040 | yes | 8 (0) |"
    assert "| 6889 | yes | 1 | fp8 |" in lines[4] and "| n/a |" in lines[4]


def test_model_checks_cover_fallbacks_and_restore():
    row = _model_row(no_fallback=False)
    del row["restored_equals_bf16"]
    assert bench_model.byte_check_failures([row]) == [
        "6889 tokens batch 1 format=fp8 linears=all: no_fallback failed",
        "6889 tokens batch 1 format=fp8 linears=all: restored_equals_bf16 not checked"]


def _fake_model(monkeypatch, change=None):
    calls = []

    def measure_model(zct, tokens, batches, formats, linears, layers, text_len, reps, warmup, flush, log=print,
                      text_mask="unset", attention_backend="unset"):
        calls.append((zct, list(tokens), list(batches), list(formats), list(linears), layers, text_len, reps, warmup,
                      text_mask, attention_backend))
        rows = [_model_row(t, zct, f, li, batch=b) for f in formats for li in linears for t in tokens for b in batches]
        for r in rows:
            r.update((change or {}).get((r["tokens"], zct, r["format"]), {}))
        return rows

    _fake_gpu(monkeypatch)
    qd = types.SimpleNamespace()
    monkeypatch.setitem(sys.modules, "qwen_resnorm_fp4.integrations.diffusers", qd)
    import qwen_resnorm_fp4.integrations as integrations
    monkeypatch.setattr(integrations, "diffusers", qd, raising=False)
    monkeypatch.setattr(timing, "l2_flush_buffer", lambda: None)
    monkeypatch.setattr(bench_model, "measure_model", measure_model)
    return calls


def test_model_main_quick(monkeypatch, tmp_path, capsys):
    calls = _fake_model(monkeypatch)
    assert bench_model.main(["--quick", "--out", str(tmp_path)]) == 0
    assert calls == [(z, [6889, 10209], [1], ["fp8"], ["all"], 4, 128, 3, 2, "pipeline", None) for z in (False, True)]
    csv_lines = (tmp_path / "bench_model.csv").read_text().splitlines()
    assert csv_lines[0].split(",") == bench_model.CSV_FIELDS and len(csv_lines) == 1 + 4
    first = dict(zip(bench_model.CSV_FIELDS, csv_lines[1].split(",")))
    assert (first["tokens"], first["format"], first["fused_ms"], first["fused_over_bf16"]) == (
        "6889", "fp8", "15.0", "0.75")
    md = (tmp_path / "bench_model.md").read_text()
    assert "| 10209 | yes | 1 | fp8 | all | 20.00 | 15.00 | 15.75 | 0.75x |" in md
    assert capsys.readouterr().err == ""


def test_model_main_default_cases_and_failures(monkeypatch, tmp_path, capsys):
    calls = _fake_model(monkeypatch, change={(10209, True, "fp8"): {"fused_over_bf16": 1.3, "rel_err_vs_bf16": 0.2}})
    assert bench_model.main(["--out", str(tmp_path)]) == 0  # a slow or inaccurate figure is printed, not failed
    assert calls[0][3:5] == (["nvfp4", "fp8"], ["all", "fc1"]) and calls[0][7:] == (10, 3, "pipeline", None)
    assert "| 1.30x |" in (tmp_path / "bench_model.md").read_text() and capsys.readouterr().err == ""
    _fake_model(monkeypatch, change={(6889, False, "nvfp4"): {"fused_equals_unfused": False}})
    assert bench_model.main(["--zero-cond-t", "off", "--out", str(tmp_path)]) == 1
    assert "6889 tokens batch 1 format=nvfp4 linears=all: fused_equals_unfused failed" in capsys.readouterr().err


def _fake_peers(monkeypatch, change=None):
    calls = []

    def measure_peers(zct, tokens, variants, layers, text_len, reps, warmup, flush, log=print, text_mask="unset",
                      profile=None, attention_backend="unset", trace_dir="unset", on_variant=None):
        calls.append((zct, list(tokens), list(variants), layers, text_len, reps, warmup, text_mask, profile,
                      attention_backend, trace_dir))
        rows = []
        for v in variants:
            for t in tokens:
                ms = 20.0 if v == "bf16_eager" else 30.0  # ours slower than BF16: a figure, not a failure
                r = {"variant": v, "tokens": t, "zero_cond_t": zct, "ms": ms, "compile_s": 0.0 if v == "bf16_eager"
                     else 12.5, "graphs": 1, "rel_err_vs_bf16": 0.0 if v == "bf16_eager" else 0.0138,
                     "rel_err_vs_fp32": 0.0065 if v == "bf16_eager" else 0.0042,
                     "over_bf16_eager": ms / 20.0, "over_torchao_row": nan, "queued_ms": ms - 2.0,
                     "queued_over_bf16_eager": (ms - 2.0) / 18.0, "queued_over_torchao_row": nan}
                if v == "ours_compiled":  # inductor's check at the first token count only, as measure_peers does
                    r.update(compiled_paths="norm1: fused", compiled_all_fused=True, fused_equals_unfused=True)
                    if t == tokens[0]:
                        r["fused_equals_unfused_inductor"] = True
                if profile:
                    r.update({f"{k}_ms": 1.0 + i for i, k in enumerate(bench_model.KIND_NAMES)}, kernels=321)
                r.update((change or {}).get((t, zct, v), {}))
                if isinstance(r.get("raise"), BaseException):
                    raise r["raise"]
                rows.append(r)
            if on_variant is not None:
                on_variant(rows)
        return rows

    _fake_gpu(monkeypatch)
    monkeypatch.setattr(harness, "compile_for_many_shapes", lambda *a, **k: None)
    monkeypatch.setattr(timing, "l2_flush_buffer", lambda: None)
    monkeypatch.setattr(bench_model, "measure_peers", measure_peers)
    return calls


def test_model_peers_main_writes_the_peers_report(monkeypatch, tmp_path, capsys):
    calls = _fake_peers(monkeypatch)
    assert bench_model.main(["--peers", "--variants", "bf16_eager,ours_compiled", "--reps", "7", "--warmup", "2",
                             "--out", str(tmp_path)]) == 0
    assert calls == [(z, [6889, 10209], ["bf16_eager", "ours_compiled"], 4, 128, 7, 2, "pipeline", False, None, None)
                     for z in (False, True)]
    csv_lines = (tmp_path / "bench_model_peers.csv").read_text().splitlines()
    assert csv_lines[0].split(",") == bench_model.PEER_FIELDS and len(csv_lines) == 1 + 2 * 2 * 2
    md = (tmp_path / "bench_model_peers.md").read_text()
    row = "| 6889 | no | ours_compiled | 30.00 | 1.500 | n/a | 28.00 | 1.556 | n/a | 12.5 | 1 | 0.0138 | 0.0042 |"
    assert row + " yes / yes |" in md
    assert "| 10209 | yes | bf16_eager | 20.00 | 1.000 | n/a | 18.00 | 1.000 | n/a | 0.0 | 1 | 0.0000 | 0.0065 |  |" \
        in md
    assert row.replace("6889", "10209") + " yes / not checked |" in md
    assert capsys.readouterr().err == ""


def test_model_peers_without_torchao_refuses_its_variants_before_measuring(monkeypatch, capsys):
    """torchao variants asked for where torchao is not installed: exit status 2 naming them and the extra,
    before any measurement; the other variants do not need it."""
    import importlib.util

    calls = _fake_peers(monkeypatch)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao"
                        else real_find_spec(name, *a))
    assert bench_model.main(["--peers", "--variants", "bf16_eager,torchao_fp8_row_compiled"]) == 2
    err = capsys.readouterr().err
    assert "--variants torchao_fp8_row_compiled need torchao" in err and "qwen-resnorm-fp4[bench]" in err
    assert calls == []
    assert bench_model.missing_peer_package(["bf16_eager", "ours_compiled"]) is None


def test_model_peers_report_keeps_the_variants_measured_before_a_stop(monkeypatch, tmp_path):
    """A run stopped midway (here: the second variant raises) leaves the report of the variants measured."""
    _fake_peers(monkeypatch, change={(6889, False, "ours_compiled"): {"raise": KeyboardInterrupt()}})
    with pytest.raises(KeyboardInterrupt):
        bench_model.main(["--peers", "--zero-cond-t", "off", "--variants", "bf16_eager,ours_compiled",
                          "--out", str(tmp_path)])
    csv_lines = (tmp_path / "bench_model_peers.csv").read_text().splitlines()
    assert [line.split(",")[:2] for line in csv_lines[1:]] == [["bf16_eager", "6889"], ["bf16_eager", "10209"]]
    assert "| 10209 | no | bf16_eager | 20.00 | 1.000 |" in (tmp_path / "bench_model_peers.md").read_text()


@pytest.mark.parametrize("change, message", [
    ({"fused_equals_unfused": False}, "10209 tokens zct ours_compiled: fused != unfused under compile (aot_eager)"),
    ({"fused_equals_unfused_inductor": False},
     "10209 tokens zct ours_compiled: fused != unfused under compile (inductor, deterministic)"),
    ({"fused_equals_unfused_inductor": None, "check_errors": ["inductor: RuntimeError: no"]},
     "10209 tokens zct ours_compiled: fused == unfused not checked (inductor: RuntimeError: no)"),
    ({"compiled_all_fused": False, "compiled_paths": "norm1: fused/unfused"},
     "10209 tokens zct ours_compiled: compiled paths norm1: fused/unfused"),
])
def test_model_peers_main_fails_a_check(change, message, monkeypatch, tmp_path, capsys):
    _fake_peers(monkeypatch, change={(10209, True, "ours_compiled"): change})
    assert bench_model.main(["--peers", "--variants", "bf16_eager,ours_compiled", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "check failed: the converted model under torch.compile" in err and message in err
    assert (tmp_path / "bench_model_peers.csv").is_file()


def test_model_peers_profile_and_text_mask_reach_the_measurement(monkeypatch, tmp_path):
    calls = _fake_peers(monkeypatch)
    assert bench_model.main(["--peers", "--variants", "ours_compiled", "--zero-cond-t", "off", "--profile",
                             "--text-mask", "always", "--attention-backend", "_native_cudnn",
                             "--out", str(tmp_path)]) == 0
    assert calls == [(False, [6889, 10209], ["ours_compiled"], 4, 128, 10, 3, "always", True, "_native_cudnn",
                      tmp_path)]  # the profiled forwards' traces go beside the report
    md = (tmp_path / "bench_model_peers.md").read_text()
    assert "attention / gemm / ours / inductor / other (kernels)" in md
    assert "| 1.00 / 2.00 / 3.00 / 4.00 / 5.00 (321) |" in md
    assert "text mask: always, attention backend: _native_cudnn" in md


@pytest.mark.parametrize("name, kind", [
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0", "attention"),
    ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off", "gemm"),
    ("nvjet_qqtst_128x256_64x4_2x1_v_bz_coopA_TNT", "gemm"),
    ("void cutlass::device_kernel<f8f8bf16_rowwise::Kernel>(Params)", "gemm"),
    ("void qwen_fp4::(anonymous namespace)::fp8_quantize_kernel(qwen_fp4::Fp8QuantizeArgs)", "ours"),
    ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_stack_sub_3", "inductor"),
    ("triton_poi_fused__scaled_dot_product_efficient_attention_cat_ones_4", "inductor"),
    ("triton_tem_fused__scaled_mm_0", "gemm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::mul_kernel_cuda>(int, ...)", "other"),
    ("Memcpy DtoD (Device -> Device)", "other"),
])
def test_model_kernel_kinds(name, kind):
    assert bench_model.kernel_kind(name) == kind


def test_model_kernel_summary_totals_kinds_and_ranks_each_kinds_kernels():
    kernels = [("cudnn_generated_fort_native_sdpa_sm90_a", 3.0), ("cudnn_generated_fort_native_sdpa_sm90_a", 2.0),
               ("fmha_cutlassF_b", 1.0), ("triton_poi_fused_add_0", 0.5), ("triton_per_fused_mean_1", 0.25),
               ("triton_poi_fused_add_0", 0.5), ("nvjet_qqtst_a", 4.0), ("Memcpy DtoD (Device -> Device)", 0.125)]
    row = bench_model.kernel_summary(kernels, top=1)
    assert (row["attention_ms"], row["gemm_ms"], row["ours_ms"], row["inductor_ms"], row["other_ms"]) == (
        6.0, 4.0, 0.0, 1.25, 0.125)
    assert row["kernels"] == 8
    assert row["top_attention"] == "cudnn_generated_fort_native_sdpa_sm90_a (5.00 ms)"
    # per kind but attention, the kernel with the most time (summed over its launches) first; no empty kind
    assert row["top_kernels"] == ("gemm: nvjet_qqtst_a 4.00 ms x1 | inductor: triton_poi_fused_add_0 1.00 ms x2 | "
                                  "other: Memcpy DtoD (Device -> Device) 0.12 ms x1")
    assert bench_model.kernel_summary([])["top_kernels"] == "" and bench_model.kernel_summary([])["kernels"] == 0


def test_model_inputs_text_mask_follows_the_pipeline():
    shapes = bench_model.image_shapes(16, False)
    assert bench_model.model_inputs(1, shapes, 5, seed=0, device="cpu")["encoder_hidden_states_mask"] is None
    kept = bench_model.model_inputs(1, shapes, 5, seed=0, text_mask="always", device="cpu")
    assert kept["encoder_hidden_states_mask"].all() and kept["encoder_hidden_states_mask"].shape == (1, 5)
    padded = bench_model.model_inputs(2, shapes, 6, seed=0, device="cpu")["encoder_hidden_states_mask"]
    assert padded.tolist() == [[True] * 6, [True] * 3 + [False] * 3]  # a padded prompt keeps its mask
    with pytest.raises(ValueError, match="text_mask must be one of pipeline, always"):
        bench_model.model_inputs(1, shapes, 5, seed=0, text_mask="never", device="cpu")


@pytest.mark.exhaustive  # about 20 s of dynamo on CPU; CI runs it with the sweep's CPU cases
@needs_diffusers
def test_model_measure_peers_runs_each_variant_in_its_own_cold_cache(monkeypatch):
    """measure_peers end to end on a small CPU Qwen-Image (dynamo with aot_eager in place of inductor, the
    timing faked): a row per variant and token count with its figures, ours compiled with each segment's path
    (on CPU the reference: "cpu_tensors") and fused == unfused under compile, and every variant compiled in a
    fresh inductor cache of its own, removed after it."""
    from diffusers import QwenImageTransformer2DModel

    def small_model(layers, zero_cond_t, attention_backend=None):
        torch.manual_seed(0)
        return QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=layers,
                                           attention_head_dim=32, num_attention_heads=2, joint_attention_dim=3584,
                                           axes_dims_rope=(8, 12, 12), zero_cond_t=zero_cond_t).bfloat16().eval()

    real_compile, real_callable, cache_dirs = torch.compile, bench_model._peer_callable, {}

    def peer_callable(variant, model):
        cache_dirs[variant] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        return real_callable(variant, model)

    def aot_eager(model=None, **kw):  # what the variants trace, without inductor's code generation
        return real_compile(model, **{**kw, "backend": "aot_eager"})

    _fake_gpu(monkeypatch)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch, "compile", aot_eager)
    monkeypatch.setattr(bench_model, "build_model", small_model)
    monkeypatch.setattr(bench_model, "model_inputs", functools.partial(bench_model.model_inputs, device="cpu"))
    monkeypatch.setattr(bench_model, "_peer_callable", peer_callable)
    monkeypatch.setattr(timing, "flushed_per_call_us", lambda fn, reps, warmup, flush: (fn(), 2000.0)[1])
    monkeypatch.setattr(timing, "queued_flushed_per_call_us", lambda fn, reps, warmup, flush, timer: (fn(), 1500.0)[1])
    monkeypatch.setattr(timing, "EventTimer", lambda: None)
    variants = ["bf16_eager", "bf16_compiled", "ours_eager", "ours_compiled", "ours_regional"]
    seen = []
    rows = bench_model.measure_peers(False, [16, 24], variants, 1, 8, 1, 0, None, log=lambda line: None,
                                     on_variant=lambda rows: seen.append(len(rows)))
    assert [(r["variant"], r["tokens"]) for r in rows] == [(v, t) for v in variants for t in (16, 24)]
    assert seen == [2, 4, 6, 8, 10]
    by = {(r["variant"], r["tokens"]): r for r in rows}
    assert all(r["ms"] == 2.0 and r["over_bf16_eager"] == 1.0 and r["rel_err_vs_fp32"] > 0 for r in rows)
    assert all(r["queued_ms"] == 1.5 and r["queued_over_bf16_eager"] == 1.0 for r in rows)
    assert by["bf16_eager", 16]["rel_err_vs_bf16"] == 0 and by["ours_eager", 16]["rel_err_vs_bf16"] > 0
    assert by["bf16_compiled", 16]["graphs"] >= 1 and by["bf16_eager", 16]["compile_s"] == 0.0
    for t in (16, 24):
        paths = dict(p.split(": ") for p in by["ours_compiled", t]["compiled_paths"].split("; "))
        assert set(paths) >= {"img", "txt"} and set(paths.values()) == {"cpu_tensors"}  # on CPU: the reference
        assert not by["ours_compiled", t]["compiled_all_fused"]
        assert by["ours_compiled", t]["fused_equals_unfused"]
    assert by["ours_compiled", 16]["fused_equals_unfused_inductor"]
    assert "fused_equals_unfused_inductor" not in by["ours_compiled", 24]
    assert len(set(cache_dirs.values())) == len(variants) and None not in cache_dirs.values()
    assert not any(os.path.exists(d) for d in cache_dirs.values())
    assert "2.00 ms (queued 1.50), compile 0.0 s" in bench_model.peer_row_line(by["bf16_eager", 16])


def test_model_peer_ratios_per_measure_and_token_count():
    rows = [{"variant": "bf16_eager", "tokens": 16, "ms": 40.0, "queued_ms": 32.0},
            {"variant": "torchao_fp8_row_compiled", "tokens": 16, "ms": 25.0, "queued_ms": 20.0},
            {"variant": "ours_compiled", "tokens": 16, "ms": 20.0, "queued_ms": 16.0},
            {"variant": "ours_compiled", "tokens": 24, "ms": 30.0},  # no BF16 eager here, no queued figure
            {"variant": "bf16_eager", "tokens": 32, "ms": 50.0, "queued_ms": nan}]
    bench_model.add_peer_ratios(rows)
    ours = rows[2]
    assert (ours["over_bf16_eager"], ours["over_torchao_row"]) == (0.5, 0.8)
    assert (ours["queued_over_bf16_eager"], ours["queued_over_torchao_row"]) == (0.5, 0.8)
    assert rows[1]["queued_over_bf16_eager"] == 20.0 / 32.0
    assert all(math.isnan(rows[3][f]) for f in ("over_bf16_eager", "queued_over_bf16_eager", "over_torchao_row"))
    assert rows[4]["over_bf16_eager"] == 1.0 and math.isnan(rows[4]["queued_over_bf16_eager"])


def test_model_timeline_summary_counts_only_the_gpu_waits_between_kernels():
    # kernels (name, start us, duration us): b overlaps a (no wait), c waits 30 us after b's end, d 10 us after c
    kernels = [("c", 200.0, 50.0), ("a", 100.0, 50.0), ("b", 120.0, 50.0), ("d", 260.0, 5.0)]
    row = bench_model.timeline_summary(40.0, kernels, top=1)
    assert row["first_kernel_ms"] == 0.06
    assert abs(row["gpu_idle_ms"] - 0.04) < 1e-12
    assert row["top_gaps"] == "0.030 ms before c"
    assert bench_model.timeline_summary(0.0, [])["gpu_idle_ms"] == 0.0

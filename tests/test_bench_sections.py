"""CPU tests of the benchmark's optional sections (--pdl-sequence, --peer-dit): their options, the byte
models, the tables, the PDL setting, and the FlashInfer peer's skip path where FlashInfer, nvcc or a GPU are
absent."""

from __future__ import annotations

import math

import pytest

from qwen_resnorm_fp4 import bench, bench_pdl, bench_per_token
from qwen_resnorm_fp4.peers import flashinfer_dit


def test_section_options_parse():
    args = bench.build_parser().parse_args(["--pdl-sequence", "--pdl-rows", "256,4096", "--peer-dit",
                                            "--per-token-rows", "17", "--sections-only"])
    assert args.pdl_sequence and args.peer_dit and args.sections_only
    assert args.pdl_rows == [256, 4096] and args.per_token_rows == [17]
    assert bench.check_section_args(args) is None
    args = bench.build_parser().parse_args([])
    assert not (args.pdl_sequence or args.peer_dit or args.sections_only)
    assert bench.check_section_args(args) is None


@pytest.mark.parametrize("argv, needs", [(["--sections-only"], "--pdl-sequence or --peer-dit"),
                                         (["--pdl-rows", "256"], "--pdl-sequence"),
                                         (["--per-token-rows", "256"], "--peer-dit")])
def test_section_options_refused_before_needing_a_gpu(argv, needs, capsys):
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert needs in err and "GPU only" not in err


def test_section_rows_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.build_parser().parse_args(["--pdl-sequence", "--pdl-rows", "0"])
    assert exc.value.code == 2


def test_per_token_byte_model():
    rows, dim = 4096, 3072
    mod = 3 * rows * dim * 2
    b = bench_per_token.impl_bytes(rows, dim)
    assert b["resnorm"] == b["flashinfer_dit"] == (2 + 2 + 2 + 2) * rows * dim + mod
    assert b["resnorm_quant"] == bench.bytes_moved(rows, dim) + mod


def test_per_token_table_marks_what_was_not_measured():
    row = {"dim": 3072, "rows": 256, "calls": 20}
    for name, n in bench_per_token.impl_bytes(256, 3072).items():
        row[f"{name}_bytes"] = n
    row.update(flashinfer_dit_us=5.0, flashinfer_dit_gbps=800.0, flashinfer_dit_frac_copy=0.2,
               flashinfer_dit_frac_own_copy=0.85)
    lines = bench_per_token.table_lines([row])
    assert len(lines) == 2 + len(bench_per_token.IMPLS)
    assert "| flashinfer_dit | " in lines[2] and "| 85.0 |" in lines[2]
    assert "resnorm (not measured)" in lines[3] and "resnorm_quant (not measured)" in lines[4]


def test_pdl_table_and_calls():
    row = {"dim": 3072, "rows": 256, "calls": 20, "pair_pdl_us": 9.0, "pair_no_pdl_us": 10.0, "pdl_saves_us": 1.0,
           "pdl_saves_frac": 0.1, "gemm_us": 6.0, "op_pdl_us": 3.5, "op_no_pdl_us": 4.0, "byte_exact": True}
    lines = bench_pdl.table_lines([row])
    assert lines[2].startswith("| 3072 | 256 | 20 | 9.00 | 10.00 | 1.00 | 10.0 | 6.00 | 3.50 | 4.00 | yes |")
    l2 = 60 * 2 ** 20
    assert bench_pdl.calls_for(256, 3072, l2) >= bench.GRAPH_CALLS
    per_pair = bench.bytes_moved(32768, 3072) + 2 * 32768 * 3072 * 2
    assert bench_pdl.calls_for(32768, 3072, l2) == max(bench.GRAPH_CALLS, math.ceil(2 * l2 / per_pair))


@pytest.mark.parametrize("before", [False, True])
def test_pdl_setting_sets_and_restores(before):
    import qwen_resnorm_fp4 as q

    previous = q.set_launch_options(pdl=before)
    try:
        for on in (True, False):
            with bench_pdl.pdl_setting(on):
                assert q.launch_options().pdl is on
            assert q.launch_options().pdl is before
    finally:
        q.set_launch_options(*previous)


def test_section_csvs(tmp_path):
    row = {"dim": 3072, "rows": 256, "calls": 20, "pair_pdl_us": 9.0, "byte_exact": True}
    bench.write_csv(tmp_path / "p.csv", [row], bench_pdl.CSV_FIELDS)
    head, line = (tmp_path / "p.csv").read_text().splitlines()
    assert head.split(",") == bench_pdl.CSV_FIELDS
    assert line.startswith("3072,256,20,9.0,")


def test_peer_skipped_without_a_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    module, reason = flashinfer_dit.load()
    assert module is None and reason == "no CUDA GPU is available"


def test_peer_skipped_without_the_header(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flashinfer_dit, "include_roots", lambda: [tmp_path])
    module, reason = flashinfer_dit.load()
    assert module is None
    assert str(flashinfer_dit.HEADER) in reason and str(tmp_path) in reason


def test_peer_skipped_without_nvcc(monkeypatch, tmp_path):
    import torch

    (tmp_path / flashinfer_dit.HEADER).parent.mkdir(parents=True)
    (tmp_path / flashinfer_dit.HEADER).write_text("// stand-in\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flashinfer_dit, "include_roots", lambda: [tmp_path])
    monkeypatch.setattr(flashinfer_dit, "nvcc_path", lambda: None)
    module, reason = flashinfer_dit.load()
    assert module is None and "nvcc" in reason


def test_peer_header_found_by_the_build_variable(monkeypatch, tmp_path):
    (tmp_path / "include" / flashinfer_dit.HEADER).parent.mkdir(parents=True)
    (tmp_path / "include" / flashinfer_dit.HEADER).write_text("// stand-in\n")
    monkeypatch.setenv("QWEN_FP4_FLASHINFER_DIR", str(tmp_path))
    assert flashinfer_dit.find_include_root() == tmp_path / "include"


def test_peer_source_ships_with_the_package():
    text = flashinfer_dit.SOURCE.read_text()
    assert "#include <flashinfer/norm/fused_dit_layernorm.cuh>" in text
    assert "launchFusedLayerNorm" in text

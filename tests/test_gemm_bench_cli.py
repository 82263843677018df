"""The bench-gemm / bench-model subcommands: wired into the command line, refusing to run without a GPU."""

from __future__ import annotations

import pytest
import torch

from qwen_resnorm_fp4 import bench_gemm, cli


@pytest.mark.parametrize("command", ["bench-gemm", "bench-model"])
def test_subcommand_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0
    assert command in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("command", ["bench-gemm", "bench-model"])
def test_subcommand_needs_a_gpu(command, capsys):
    assert cli.main([command]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_model_inputs_token_counts():
    # 1328x1328 and 1024x1024 images: 6889 and 4096 tokens after the VAE (/8) and the 2x2 patchify
    assert [side * side for _, side in bench_gemm.RESOLUTIONS] == [6889, 4096]

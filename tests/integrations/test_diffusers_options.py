"""The conversion's typed options (``NVFP4Options``, ``FP8Options``, ``ConversionOptions``) and how
``convert_transformer``'s keywords become them: each options type refuses its own bad values with an error
naming the argument, a setting of the other format is refused by type (not by a hand cross-check), a format
given as an options object converts as its keywords would, and the per-model converters share
``convert_transformer``'s one signature.

The options tests need no model; the conversion tests use the small Qwen-Image of
tests/helpers/diffusers_models.py (skipped without diffusers)."""

from __future__ import annotations

import inspect
import logging

import pytest
import torch

import qwen_resnorm_fp4.integrations.diffusers as qd
from qwen_resnorm_fp4 import FP8Linear, NVFP4Linear
from qwen_resnorm_fp4.integrations._options import format_options

from helpers.diffusers_models import build_small, make_inputs, needs_diffusers, run


# ------------------------------------------------------------------------------------------------------------
# The options objects: each validates its own fields, each error names the argument
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, exc, argument", [
    (lambda: qd.NVFP4Options(fast_math=1), TypeError, "fast_math"),
    (lambda: qd.NVFP4Options(fast_math="yes"), TypeError, "fast_math"),
    (lambda: qd.NVFP4Options(gemm_backend=None), TypeError, "gemm_backend"),
    (lambda: qd.NVFP4Options(gemm_backend="tensorcore"), ValueError, "gemm_backend"),
    (lambda: qd.FP8Options(use_fast_accum=1), TypeError, "use_fast_accum"),
    (lambda: qd.FP8Options(use_fast_accum=None), TypeError, "use_fast_accum"),
    (lambda: qd.ConversionOptions(mode="fast"), ValueError, "mode"),
    (lambda: qd.ConversionOptions(format="fp8"), TypeError, "format"),
    (lambda: qd.ConversionOptions(linears="attention"), ValueError, "linears"),
    (lambda: qd.ConversionOptions(linears=[]), TypeError, "linears"),
    (lambda: qd.ConversionOptions(allow_cpu=1), TypeError, "allow_cpu"),
    (lambda: qd.ConversionOptions(keep_original="no"), TypeError, "keep_original"),
])
def test_each_options_error_names_its_argument(make, exc, argument):
    with pytest.raises(exc, match=rf"^{argument}\b"):
        make()


def test_options_are_frozen_and_checked_values_kept():
    nvfp4 = qd.NVFP4Options(fast_math=False, gemm_backend="reference")
    assert (nvfp4.fast_math, nvfp4.gemm_backend, nvfp4.name) == (False, "reference", "nvfp4")
    assert qd.FP8Options().use_fast_accum is True and qd.FP8Options.name == "fp8"
    options = qd.ConversionOptions(linears=["attn.to_q", "img_mlp.net.0.proj"], format=qd.FP8Options())
    assert options.linears == ("attn.to_q", "img_mlp.net.0.proj")  # a list is kept as a tuple
    with pytest.raises(AttributeError):
        options.mode = "unfused"
    with pytest.raises(AttributeError):
        nvfp4.fast_math = True
    assert qd.ConversionOptions().format == qd.NVFP4Options()


def test_keywords_become_the_formats_options():
    assert format_options("nvfp4", dict(fast_math=True, gemm_backend="auto", use_fast_accum=True)) == \
        qd.NVFP4Options(fast_math=True)
    assert format_options("fp8", dict(fast_math=None, gemm_backend="auto", use_fast_accum=False)) == \
        qd.FP8Options(use_fast_accum=False)
    given = qd.FP8Options(use_fast_accum=False)
    assert format_options(given, dict(fast_math=None, gemm_backend="auto", use_fast_accum=True)) is given
    options = qd.ConversionOptions.from_keywords(mode="unfused", format="fp8", linears="all", allow_cpu=True,
                                                 keep_original=False, fast_math=None, gemm_backend="auto",
                                                 use_fast_accum=False)
    assert options == qd.ConversionOptions("unfused", qd.FP8Options(False), "all", True, False)


@pytest.mark.parametrize("format, keywords, text", [
    ("fp8", dict(fast_math=True), "fast_math is a setting of the NVFP4 quantizer"),
    ("fp8", dict(fast_math=False), "fast_math is a setting of the NVFP4 quantizer"),
    ("fp8", dict(gemm_backend="reference"), "gemm_backend is a setting of NVFP4Linear"),
    ("nvfp4", dict(use_fast_accum=False), "use_fast_accum is a setting of FP8Linear"),
    (qd.FP8Options(), dict(use_fast_accum=False), "format is given as FP8Options.*set use_fast_accum there"),
    (qd.NVFP4Options(), dict(fast_math=True), "format is given as NVFP4Options.*set fast_math there"),
    ("int8", {}, "format must be one of"),
    (None, {}, "format must be one of"),
])
def test_a_setting_the_format_does_not_have_is_refused(format, keywords, text):
    with pytest.raises(ValueError, match=text):
        format_options(format, keywords)
    with pytest.raises(ValueError, match=text):
        qd.ConversionOptions.from_keywords(format=format, **keywords)


def test_an_unknown_setting_is_a_type_error():
    with pytest.raises(TypeError, match="fastmath"):
        format_options("nvfp4", dict(fastmath=True))


# ------------------------------------------------------------------------------------------------------------
# The converters: one signature, the options built once
# ------------------------------------------------------------------------------------------------------------


def test_converters_share_convert_transformers_signature():
    reference = inspect.signature(qd.convert_transformer)
    for converter in (qd.convert_qwen_image_transformer, qd.convert_qwen_image21_transformer,
                      qd.convert_flux_transformer, qd.convert_wan_transformer):
        assert inspect.signature(converter) == reference, converter.__name__
        assert converter.__name__.startswith("convert_") and "convert_transformer" in converter.__doc__
    # the keyword defaults are the options' own
    defaults = {k: p.default for k, p in reference.parameters.items()}
    assert defaults["mode"] == qd.ConversionOptions().mode
    assert defaults["linears"] == qd.ConversionOptions().linears
    assert (defaults["allow_cpu"], defaults["keep_original"]) == (qd.ConversionOptions().allow_cpu,
                                                                  qd.ConversionOptions().keep_original)
    assert (defaults["fast_math"], defaults["gemm_backend"]) == (qd.NVFP4Options().fast_math,
                                                                 qd.NVFP4Options().gemm_backend)
    assert defaults["use_fast_accum"] == qd.FP8Options().use_fast_accum


@needs_diffusers
def test_a_converter_refuses_an_unknown_keyword_and_a_positional_one():
    model = build_small(False)
    with pytest.raises(TypeError, match="fastmath"):
        qd.convert_qwen_image_transformer(model, input_amax=1.0, fastmath=True)
    with pytest.raises(TypeError):
        qd.convert_qwen_image_transformer(model, "fused", input_amax=1.0)
    assert qd.conversion_info(model) is None


@needs_diffusers
def test_format_given_as_options_converts_as_its_keywords():
    inp = make_inputs(1, 7, False, small=True, seed=3)
    by_keywords = build_small(False)
    by_options = build_small(False)
    qd.convert_transformer(by_keywords, format="fp8", use_fast_accum=False, input_amax=4.0, allow_cpu=True)
    qd.convert_qwen_image_transformer(by_options, format=qd.FP8Options(use_fast_accum=False), input_amax=4.0,
                                      allow_cpu=True)
    for model in (by_keywords, by_options):
        info = qd.conversion_info(model)
        assert info.format == "fp8" and info.format_options == qd.FP8Options(use_fast_accum=False)
        assert info.fast_math is None
        layer = model.transformer_blocks[0].img_mlp.net[0].proj
        assert isinstance(layer, FP8Linear) and layer.use_fast_accum is False
    assert torch.equal(run(by_keywords, inp), run(by_options, inp))
    nvfp4 = build_small(False)
    qd.convert_transformer(nvfp4, format=qd.NVFP4Options(fast_math=False, gemm_backend="reference"), input_amax=4.0)
    info = qd.conversion_info(nvfp4)
    assert (info.format, info.fast_math, info.format_options.gemm_backend) == ("nvfp4", False, "reference")
    layer = nvfp4.transformer_blocks[0].img_mlp.net[0].proj
    assert isinstance(layer, NVFP4Linear) and layer.gemm_backend == "reference"
    # linear_names and calibrate_input_amax take an options object too
    assert qd.linear_names(nvfp4, "fc1", qd.FP8Options()) == qd.linear_names(nvfp4, "fc1", "fp8")


@needs_diffusers
def test_refused_options_leave_the_model_untouched():
    model = build_small(False)
    calls = []
    bad = [
        (dict(format="nvfp4", use_fast_accum=False), ValueError, "use_fast_accum is a setting of FP8Linear"),
        (dict(format=qd.FP8Options(), use_fast_accum=False), ValueError, "format is given as FP8Options"),
        (dict(format=qd.FP8Options(), gemm_backend="reference"), ValueError, "format is given as FP8Options"),
        (dict(allow_cpu=1), TypeError, "allow_cpu"),
        (dict(keep_original=None), TypeError, "keep_original"),
    ]
    for kw, exc, text in bad:
        with pytest.raises(exc, match=text):
            qd.convert_transformer(model, calibration_inputs=lambda m: calls.append(m), **kw)
        assert qd.conversion_info(model) is None
    assert calls == []  # refused before the calibration pass
    assert isinstance(model.transformer_blocks[0].img_mlp.net[0].proj, torch.nn.Linear)


# ------------------------------------------------------------------------------------------------------------
# The fallback log belongs to the conversion
# ------------------------------------------------------------------------------------------------------------


@needs_diffusers
def test_a_fallback_is_logged_once_per_conversion(caplog):
    """The fused path declines on CPU without allow_cpu: each conversion logs that reason once (INFO), however
    many blocks and forwards fall back for it."""
    caplog.set_level(logging.INFO, logger="qwen_resnorm_fp4")
    inp = make_inputs(1, 7, False, small=True, seed=3)

    def fallbacks():
        return [r for r in caplog.records if r.name == "qwen_resnorm_fp4" and "declined" in r.getMessage()]

    first, second = build_small(False), build_small(False)
    qd.convert_transformer(first, input_amax=4.0)
    run(first, inp)
    run(first, inp)
    assert qd.fused_path_stats(first)["decline_reasons"] == {"cpu_tensors": 8}  # 2 blocks x 2 streams x 2 forwards
    assert len(fallbacks()) == 1 and "cpu_tensors" in fallbacks()[0].getMessage()
    qd.convert_transformer(second, input_amax=4.0)
    run(second, inp)
    assert len(fallbacks()) == 2  # a conversion of its own: logged once more
    qd.restore_transformer(first)
    qd.convert_transformer(first, input_amax=4.0)
    run(first, inp)
    assert len(fallbacks()) == 3

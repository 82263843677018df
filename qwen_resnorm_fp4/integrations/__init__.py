"""Integrations of the fused path into model libraries.

- :mod:`qwen_resnorm_fp4.integrations.diffusers`: diffusers' Qwen-Image, Qwen-Image 2.1, FLUX.1 and Wan
  transformers (:func:`~qwen_resnorm_fp4.integrations.diffusers.convert_transformer` and one converter per
  model; docs/diffusers.md, docs/qwen_image21.md, docs/flux.md, docs/wan.md). The per-model files
  (``_qwen_image``, ``_qwen_image21``, ``_flux``, ``_wan``) say where each block's segment is; the conversion
  core does the rest for all of them, one job per module: ``_options`` (the typed options), ``_spec`` (model
  specs, finding blocks), ``_selection`` (which layers), ``_calibration`` (input amax), ``_segments`` (what the
  converted forwards call), ``_state`` (block state, statistics, the record), ``_compiled_paths`` (what traced
  graphs run), ``_load_hooks`` (load_state_dict) and ``_convert`` (convert, restore, set_mode, statistics).
- :mod:`qwen_resnorm_fp4.integrations.sglang`: a drop-in for SGLang's
  ``try_fused_scale_residual_norm_scale_shift_nvfp4`` (docs/serving.md).

Nothing here is imported with the package: diffusers is an optional dependency
(``pip install "qwen_resnorm_fp4[diffusers]"``), and each integration module imports its library lazily.
"""

__all__ = ["diffusers", "sglang"]

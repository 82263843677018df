"""Integrations of the fused path into model libraries.

- :mod:`qwen_resnorm_fp4.integrations.diffusers`: diffusers' Qwen-Image, Qwen-Image 2.1, FLUX.1 and Wan
  transformers (:func:`~qwen_resnorm_fp4.integrations.diffusers.convert_transformer` and one converter per
  model; docs/diffusers.md, docs/qwen_image21.md, docs/flux.md, docs/wan.md). The per-model files
  (``_qwen_image``, ``_qwen_image21``, ``_flux``, ``_wan``) say where each block's segment is; ``_dit_core``
  does the conversion for all of them.
- :mod:`qwen_resnorm_fp4.integrations.sglang`: a drop-in for SGLang's
  ``try_fused_scale_residual_norm_scale_shift_nvfp4`` (docs/serving.md).

Nothing here is imported with the package: diffusers is an optional dependency
(``pip install "qwen-resnorm-fp4[diffusers]"``), and each integration module imports its library lazily.
"""

__all__ = ["diffusers", "sglang"]

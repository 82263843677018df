"""Integrations of the fused path into model libraries.

- :mod:`qwen_resnorm_fp4.integrations.diffusers`: diffusers' ``QwenImageTransformer2DModel`` (Qwen-Image,
  Qwen-Image-Edit): :func:`~qwen_resnorm_fp4.integrations.diffusers.convert_qwen_image_transformer` and
  :func:`~qwen_resnorm_fp4.integrations.diffusers.restore_qwen_image_transformer`. See docs/diffusers.md.

Nothing here is imported with the package: diffusers is an optional dependency
(``pip install "qwen-resnorm-fp4[diffusers]"``), and each integration module imports its library lazily.
"""

__all__ = ["diffusers"]

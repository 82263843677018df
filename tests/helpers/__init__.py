"""The test suite's one helpers package: everything a test module imports that is not a test.

Test modules import from here and from nothing else of tests/: never from another test module, never from
conftest.py (which holds only pytest's hooks and the ``seed`` fixture, applying :mod:`helpers.session` and
:mod:`helpers.tiers`). pyproject.toml's ``pythonpath = ["tests"]`` makes the package importable:

    from helpers.inputs import make_inputs, op_args
    from helpers.oracles import nvfp4_quantize_oracle
    from helpers.tiers import sweep

Modules
- ``inputs``: ``make_inputs`` (the suite's one input builder of the three ops: a dict keyed by the ops' argument
  names), ``op_args`` (the raw ops' positional tuple for it), ``wrapper_kwargs``, ``FORMS`` (modulation forms).
- ``oracles``: independent oracles written from the contract (docs/numerics.md), not from the reference: E2M1
  and E4M3 by brute force (``e2m1_code_oracle``, ``e4m3_table``, ``e4m3_byte_oracle``, ...), exact fp32
  arithmetic (``round_fraction_to_fp32``, ``fma_oracle``), the 128x4 layout by permutation
  (``sf_offsets_by_permute``; ``round_up`` re-exported from qwen_resnorm_fp4.layout), step 8
  (``nvfp4_quantize_oracle``, ``nvfp4_4over6_oracle``, ``block_scale_oracle``) and steps 1-7 in float64
  (``modulation_rows``, ``layer_norm_f64``).
- ``tiers``: the default run and the exhaustive sweep: ``sweep(argnames, values, default)`` (parametrize with the
  values outside ``default`` marked ``exhaustive``), ``exhaustive_run()``, and the deselection conftest applies.
- ``session``: what a session can run: the gpu / blackwell / blackwell_emulation skip reasons, the session guard
  (``what_runs``), the seed (``draw_seed``, ``SEED_VAR``), ``HANG_GUARD_S`` (the subprocesses' hang guard).
- ``paths``: ``REPO_ROOT``, the directory holding tests/ (the checkout, or a copy of the tests): test files
  compute no path from their own ``__file__``.
- ``reliability``: device-independent block inputs, NaN-aware bitwise comparison, the logical view of the 128x4
  scales, CUDA-graph capture, ``Y_ULPS_BOUND`` / ``y_ulps`` (the GPU's y tolerance, derived there), ``rel_err``,
  ``kernel_names`` / ``count_named`` (the kernels a call launches), ``CUDA_OK``: for the reliability, kernel and
  GEMM tests.
- ``out_variants``: the out-variant tests' inputs, pre-filled outputs, calls by name and overlapping layouts.
- ``shards``: sequence shards of a call as context parallelism makes them, and the row-by-row comparison with the
  full call.
- ``diffusers_models``: small diffusers transformers (Qwen-Image, Qwen-Image 2.1, FLUX.1, Wan) and their inputs,
  ``SKIP_REASON`` / ``needs_diffusers``, ``run``, ``fused_then_unfused``, ``sha256``, ``launches_by_mode``.
- ``inductor_code``: ``deterministic_compilation`` (one fresh compilation in inductor's deterministic mode),
  ``deterministic_flags`` (its kernels by that mode) and ``write_compilations`` (inductor's generated code of
  compilations that should agree, and the process's GPU numerics settings, ``numerics_settings``, written for a
  diff).
- ``progress``: the test-by-test log of ``QWEN_FP4_TEST_PROGRESS`` (tests/conftest.py's report hook).
- ``sglang``: ``leading_parameters`` (a drop-in's positional parameter names, compared with SGLang's).
"""

"""The joint attention a converted Qwen-Image block traces (integrations/_attention.py): the rotation on real
pairs equals diffusers' complex rotation, the traced attention equals diffusers' processor, other processors
and extra kwargs run the module, and a compiled converted model has no complex op left in its graph."""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4.integrations.diffusers as qd
from qwen_resnorm_fp4.integrations import _attention

from helpers.diffusers_models import SKIP_REASON, build_small, make_inputs, run

pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


def qwen_rotary(shapes, text_len: int, device: str = "cpu"):
    """(image freqs, text freqs) of a real-width Qwen-Image (complex64), as its model forward makes them."""
    from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope

    rope = QwenEmbedRope(theta=10000, axes_dim=[16, 56, 56], scale_rope=True).to(device)
    return rope([shapes], max_txt_seq_len=text_len, device=torch.device(device))


def diffusers_rotation(x, freqs):
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    return apply_rotary_emb_qwen(x, freqs, use_real=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rotate_pairs_equals_the_complex_rotation_on_cpu(dtype, seed):
    """PyTorch's CPU complex product contracts nothing into an FMA: the real form is the same bits."""
    img_freqs, txt_freqs = qwen_rotary([(1, 24, 16)], 19)
    g = torch.Generator().manual_seed(seed)
    for freqs in (img_freqs, txt_freqs):
        x = (torch.randn(2, freqs.shape[0], 24, 128, generator=g) * 4).to(dtype)
        got, want = _attention.rotate_pairs(x, freqs), diffusers_rotation(x, freqs)
        assert got.dtype == want.dtype == dtype
        assert torch.equal(got, want)


@pytest.mark.gpu
def test_rotate_pairs_is_within_one_fp32_bit_of_the_complex_rotation_on_gpu(seed):
    """The CUDA complex product may contract ``ac - bd`` into an FMA: fp32 results at most one last bit apart,
    bf16 results equal or adjacent."""
    img_freqs, _ = qwen_rotary([(1, 64, 64)], 77, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(1, img_freqs.shape[0], 24, 128, generator=g, device="cuda") * 4
    got, want = _attention.rotate_pairs(x, img_freqs), diffusers_rotation(x, img_freqs)
    ulp = torch.nextafter(want.abs(), torch.tensor(float("inf"), device="cuda")) - want.abs()
    assert ((got - want).abs() <= ulp).all()
    xb = x.bfloat16()
    got_b, want_b = _attention.rotate_pairs(xb, img_freqs), diffusers_rotation(xb, img_freqs)
    assert (got_b.view(torch.int16).int() - want_b.view(torch.int16).int()).abs().max().item() <= 1


def attention_arguments(model, zero_cond_t: bool, seed: int):
    """The first block's attention and its inputs: (attn, img, txt, mask with padding, rotary)."""
    block = model.transformer_blocks[0]
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, 4, 4), (1, 4, 2)] if zero_cond_t else [(1, 6, 4)]
    s, t, dim = sum(f * h * w for f, h, w in shapes), 9, block.attn.inner_dim
    img = torch.randn(2, s, dim, generator=g).bfloat16()
    txt = torch.randn(2, t, dim, generator=g).bfloat16()
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[1, 5:] = False
    return block.attn, img, txt, mask, model.pos_embed([shapes] * 2, max_txt_seq_len=t, device=torch.device("cpu"))


def traced_path(monkeypatch):
    """Make :func:`_attention.joint_attention` take the path dynamo traces, in an eager call."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)


@pytest.mark.parametrize("masked", [True, False], ids=["mask", "no_mask"])
def test_traced_joint_attention_equals_diffusers_processor(monkeypatch, masked, seed):
    model = build_small(False, seed=seed % 1000)
    attn, img, txt, mask, rotary = attention_arguments(model, False, seed)
    mask = mask if masked else None
    with torch.no_grad():
        want = attn(hidden_states=img, encoder_hidden_states=txt, encoder_hidden_states_mask=mask,
                    image_rotary_emb=rotary)
        traced_path(monkeypatch)
        got = _attention.joint_attention(attn, img, txt, mask, rotary, {})
    for g_, w_ in zip(got, want):
        assert torch.equal(g_, w_)


class _SpyProcessor:
    """Any other processor: a subclass of diffusers' (counts its calls)."""

    calls = 0

    def __new__(cls):
        from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

        class Spy(QwenDoubleStreamAttnProcessor2_0):
            def __call__(self, *args, **kwargs):
                _SpyProcessor.calls += 1
                return super().__call__(*args, **kwargs)

        return Spy()


def test_another_processor_or_extra_kwargs_run_the_module(monkeypatch, seed):
    model = build_small(False, seed=seed % 1000)
    attn, img, txt, mask, rotary = attention_arguments(model, False, seed)
    traced_path(monkeypatch)
    with torch.no_grad():
        attn.set_processor(_SpyProcessor())
        _attention.joint_attention(attn, img, txt, mask, rotary, {})
        assert _SpyProcessor.calls == 1
        from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

        attn.set_processor(QwenDoubleStreamAttnProcessor2_0())
        calls = []
        original = QwenDoubleStreamAttnProcessor2_0.__call__
        monkeypatch.setattr(QwenDoubleStreamAttnProcessor2_0, "__call__",
                            lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
        _attention.joint_attention(attn, img, txt, mask, rotary, {"attention_mask": None})
        _attention.joint_attention(attn, img, txt, mask, rotary, {})
        assert calls == [1], "extra kwargs run the module; none: the traced path"
        # a hooked module runs its hooks: a forward hook, a pre-hook, an instance forward (diffusers' hooks)
        seen = []
        for add, remove in (
            (lambda: attn.register_forward_hook(lambda m, a, out: seen.append("hook")), lambda h: h.remove()),
            (lambda: attn.register_forward_pre_hook(lambda m, a: seen.append("pre")), lambda h: h.remove()),
        ):
            handle = add()
            _attention.joint_attention(attn, img, txt, mask, rotary, {})
            remove(handle)
        class_forward = attn.forward
        attn.forward = lambda *a, **k: seen.append("instance") or class_forward(*a, **k)
        _attention.joint_attention(attn, img, txt, mask, rotary, {})
        del attn.forward
        _attention.joint_attention(attn, img, txt, mask, rotary, {})
    assert seen == ["hook", "pre", "instance"] and calls == [1, 1, 1, 1]


def graph_targets(model, inp):
    """The names of the functions in the dynamo graph of one compiled forward (fullgraph)."""
    names = []

    def backend(gm, example_inputs):
        names.extend(str(getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, fullgraph=True, backend=backend)(**inp)
    torch._dynamo.reset()
    return names


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("zero_cond_t", [False, True], ids=["plain", "zero_cond_t"])
def test_compiled_converted_blocks_have_no_complex_op(fmt, zero_cond_t):
    """The BF16 model's compiled graph rotates with view_as_complex (once per query and key of each stream and
    block); the converted model's has none left (its rotary frequencies are made complex outside the blocks)."""
    model = build_small(zero_cond_t)
    inp = make_inputs(1, 7, zero_cond_t, small=True, seed=5)
    blocks = len(model.transformer_blocks)
    assert graph_targets(model, inp).count("view_as_complex") == 4 * blocks
    eager = run(model, inp)
    qd.convert_transformer(model, format=fmt, linears="all", calibration_inputs=[inp], allow_cpu=True)
    assert graph_targets(model, inp).count("view_as_complex") == 0
    converted = run(model, inp)
    assert ((converted.float() - eager.float()).norm() / eager.float().norm()).item() < 5e-2

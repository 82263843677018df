"""The joint attention a converted Qwen-Image block traces (integrations/_attention.py): the rotation on real
pairs equals diffusers' complex rotation, the traced attention equals diffusers' processor, other processors
and extra kwargs run the module, and a compiled converted model has no complex op left in its graph."""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4.integrations.diffusers as qd
from qwen_resnorm_fp4.integrations import _attention

from helpers.diffusers_models import build_small, format_model_sweep, make_inputs, needs_diffusers, run

pytestmark = needs_diffusers


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


def spacing(t: torch.Tensor, mantissa_bits: int) -> torch.Tensor:
    """The distance between adjacent values of a float format with ``mantissa_bits`` explicit bits at |t|."""
    return torch.ldexp(torch.ones_like(t, dtype=torch.float32), torch.frexp(t.float()).exponent - 1 - mantissa_bits)


@pytest.mark.gpu
def test_rotate_pairs_is_within_one_product_bit_of_the_complex_rotation_on_gpu(seed):
    """The CUDA complex product may contract ``ac - bd`` into an FMA: each fp32 component within one last bit of
    the larger product (|a|, |b| bound both, the rotation being a unit) plus its own rounding, an absolute bound;
    each bf16 component within one bf16 step of the other's value plus that bound."""
    img_freqs, _ = qwen_rotary([(1, 64, 64)], 77, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(1, img_freqs.shape[0], 24, 128, generator=g, device="cuda") * 4
    for dtype, bits in ((torch.float32, 23), (torch.bfloat16, 7)):
        xd = x.to(dtype)
        got, want = _attention.rotate_pairs(xd, img_freqs).float(), diffusers_rotation(xd, img_freqs).float()
        pairs = xd.float().unflatten(-1, (-1, 2)).abs()
        larger = pairs.amax(-1, keepdim=True).expand_as(pairs).flatten(-2)  # max(|a|, |b|) for both components
        bound = spacing(larger, 23) + spacing(want, bits)
        assert ((got - want).abs() <= bound).all(), dtype


def attention_arguments(model, seed: int):
    """The first block's attention and its inputs: (attn, img, txt, mask with padding, rotary)."""
    block = model.transformer_blocks[0]
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, 6, 4)]
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
    attn, img, txt, mask, rotary = attention_arguments(model, seed)
    mask = mask if masked else None
    with torch.no_grad():
        want = attn(hidden_states=img, encoder_hidden_states=txt, encoder_hidden_states_mask=mask,
                    image_rotary_emb=rotary)
        traced_path(monkeypatch)
        got = _attention.joint_attention(attn, img, txt, mask, rotary, {})
    for g_, w_ in zip(got, want):
        assert torch.equal(g_, w_)


def spy_processor(calls: list):
    """Another processor: a subclass of diffusers' that appends to ``calls`` when called."""
    from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

    class Spy(QwenDoubleStreamAttnProcessor2_0):
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, encoder_hidden_states_mask=None,
                     attention_mask=None, image_rotary_emb=None):
            calls.append("spy")
            return super().__call__(attn, hidden_states, encoder_hidden_states, encoder_hidden_states_mask,
                                    attention_mask, image_rotary_emb)

    return Spy()


def test_another_processor_or_extra_kwargs_run_the_module(monkeypatch, seed):
    model = build_small(False, seed=seed % 1000)
    attn, img, txt, mask, rotary = attention_arguments(model, seed)
    traced_path(monkeypatch)
    with torch.no_grad():
        spied = []
        attn.set_processor(spy_processor(spied))
        _attention.joint_attention(attn, img, txt, mask, rotary, {})
        assert spied == ["spy"]
        import functools

        from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

        attn.set_processor(QwenDoubleStreamAttnProcessor2_0())
        calls = []
        original = QwenDoubleStreamAttnProcessor2_0.__call__
        monkeypatch.setattr(QwenDoubleStreamAttnProcessor2_0, "__call__",  # wraps: Attention reads its signature
                            functools.wraps(original)(lambda self, *a, **k: calls.append(1) or original(self, *a, **k)))
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
        handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: seen.append("global"))
        _attention.joint_attention(attn, img, txt, mask, rotary, {})
        handle.remove()
        class_forward = attn.forward
        attn.forward = lambda *a, **k: seen.append("instance") or class_forward(*a, **k)
        _attention.joint_attention(attn, img, txt, mask, rotary, {})
        attn.forward = class_forward  # what diffusers' HookRegistry puts back when its hook is removed
        _attention.joint_attention(attn, img, txt, mask, rotary, {})
        del attn.forward
        _attention.joint_attention(attn, img, txt, mask, rotary, {})
        attn.__class__ = type("Overridden", (type(attn),), {"forward": lambda self, *a, **k: (
            seen.append("subclass"), type(attn).__mro__[1].forward(self, *a, **k))[1]})
        _attention.joint_attention(attn, img, txt, mask, rotary, {})
    assert seen[0:2] == ["hook", "pre"] and "global" in seen and seen[-2:] == ["instance", "subclass"]
    assert calls == [1] * 6


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


@format_model_sweep()
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

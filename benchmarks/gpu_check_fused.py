"""The fused glue ops (kernels/fused) in the GPU acceptance check: one case per model shape a shipped recipe's GPU
scale builds, run by benchmarks/gpu_check.py's worker like its delta-kernel cases.

A case replays, at the recipe's micro-batch x training length, every fused op the model's training step runs on
CUDA, each on the tensors' real layouts, against its plain PyTorch form in float64 on the same inputs (rounded to
the dtype the op sees), forward and every input gradient:
- the delta mixer's short convolutions over q, k (with the per-head L2 norm) and v, each a column view of the one
  fused input projection with the mixer's own part widths and 16-column pads (models/mixers/delta.py `_in_weight`,
  built on the meta device, so the strides are the model's: the conv's loads vectorize or not by them), or the
  L2 norm over q and k for layers without a short convolution;
- the mixer's output RMSNorm with its SiLU gate (a column view of the same projection) or without;
- the LM's block RMSNorm at the hidden size (float32 input: the residual stream stays float32 under autocast).
Inputs are bf16 where autocast makes them so (the projection's outputs, the delta kernel's output), float32 under
`precision: fp32`; parameters are float32 as the model holds them.
"""
from __future__ import annotations

import zlib

MODEL_KEYS = ("family", "hidden_size", "num_heads", "head_dim", "expand_v", "num_householder", "use_short_conv",
              "use_output_gate", "conv_size", "norm_eps")
DELTA_FAMILIES = ("deltanet", "gated_deltanet", "deltaproduct", "gated_deltaproduct")
MAX_ELEMS = 2 ** 26  # B x T x widest row of a case (its float64 reference holds a few such tensors; cases share a GPU)


def fused_case(model: dict, dtype: str, B: int, T: int, source: str) -> dict:
    """One row of the check: the fused ops of one model shape (`model`: MODEL_KEYS of a resolved ModelConfig)."""
    delta = model["family"] in DELTA_FAMILIES
    width = _width(model) if delta else model["hidden_size"]
    while B > 1 and B * T * width > MAX_ELEMS:
        B //= 2
    c = dict(kind="fused", dtype=dtype, model={k: model[k] for k in MODEL_KEYS}, B=B, T=T, source=source,
             evals=[], cu=None, h0=False, ht=False, bwd=True, fla=False, gate="none", beta_max=1.0)
    if delta:
        from dpx.models.config import ModelConfig
        cfg = ModelConfig(**c["model"])
        c.update(n=cfg.num_householder, K=cfg.key_dim, V=cfg.value_dim, H=cfg.num_heads)
        glue = (f"n{c['n']} K{c['K']}V{c['V']} H{c['H']} {'conv' if model['use_short_conv'] else 'l2'}"
                f"{'+ogate' if model['use_output_gate'] else ''} ")
    else:  # the block norms only (other families keep their own glue unfused)
        c.update(n=1, K=0, V=0, H=0)
        glue = ""
    c["id"] = f"fused {_short(dtype)} {model['family']} {glue}d{model['hidden_size']} {B}x{T} [{source}]"
    return c


def _short(dtype):
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[dtype]


def _mixer_on_meta(model: dict):
    import torch
    from dpx.models.config import ModelConfig
    from dpx.models.mixers.delta import DeltaProductMixer
    with torch.device("meta"):
        return DeltaProductMixer(ModelConfig(**model))


def _width(model: dict) -> int:
    return sum(_mixer_on_meta(model)._in_weight()[1])


def run_fused_case(c, rel) -> dict:
    """{"errors": {op.tensor: relative error}} for every fused op of the case; rel(out, ref) as the check's."""
    import torch
    from dpx.kernels import fused
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    impl = c.get("impl", "triton")  # on the CPU the interpreter runs the same kernels (tests; "torch": the plain forms)
    dtype = getattr(torch, c["dtype"])
    gen = torch.Generator().manual_seed(zlib.crc32(c["id"].encode()))
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    B, T, m = c["B"], c["T"], c["model"]
    errors = {}

    def compare(name, fast, ref, inputs, dts):
        """fast(*xs) on the inputs cast to dts (None: absent), ref(*xs) in float64 on the same rounded values; the
        output and the gradient of every input against a random cotangent."""
        lo = [None if x is None else x.to(dt).to(dev).requires_grad_() for x, dt in zip(inputs, dts)]
        hi = [None if x is None else x.detach().double().requires_grad_() for x in lo]
        y = fast(*lo)
        dy = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(dev)
        (y.double() * dy).sum().backward()
        y_ref = ref(*hi)
        (y_ref * dy).sum().backward()
        errors[f"{name}.y"] = rel(y, y_ref)
        for i, (a, b) in enumerate(zip(lo, hi)):
            if a is not None:
                errors[f"{name}.d{i}"] = rel(a.grad, b.grad) if a.grad is not None else float("inf")

    if m["family"] in DELTA_FAMILIES:
        mixer = _mixer_on_meta(m)
        H, K, V, n = mixer.H, mixer.K, mixer.V, mixer.n
        _, sizes = mixer._in_weight()
        starts = [sum(sizes[:i]) for i in range(0, len(sizes), 2)]  # each real part's first column
        widths = sizes[::2]
        wide = r(B, T, sum(sizes))  # the projection's output, pads included: its parts are strided column views

        def part(i):  # fast(x_wide) -> the i-th part's view; ref gets the same view of the float64 copy
            return lambda x: x[..., starts[i]:starts[i] + widths[i]]
        if m["use_short_conv"]:
            for i, (nm, conv, group) in enumerate((("conv_q", mixer.q_conv, K), ("conv_k", mixer.k_conv, K),
                                                   ("conv_v", mixer.v_conv, None))):
                w = 0.5 * r(*conv.weight.shape)
                b = None if conv.bias is None else 0.1 * r(*conv.bias.shape)
                act = conv.activation
                compare(nm, lambda x, w, b, i=i, g=group, a=act: fused.causal_conv1d(part(i)(x), w, b, None, a, g,
                                                                                      impl=impl)[0],
                        lambda x, w, b, i=i, g=group, a=act: fused.naive_causal_conv1d(part(i)(x), w, b, None, a, g)[0],
                        [wide, w, b], [dtype, torch.float32, torch.float32])
                # the forward from a cache (a decode state: lm-eval's carried state, chunked prefill), no gradient
                cache = r(B, conv.kernel_size - 1, widths[i])
                x_lo = wide.to(dtype).to(dev)
                with torch.no_grad():
                    y, c_new = fused.causal_conv1d(part(i)(x_lo), w.float().to(dev), None if b is None else
                                                   b.float().to(dev), cache.to(dtype).to(dev), act, group, impl=impl)
                    y_ref, c_ref = fused.naive_causal_conv1d(part(i)(x_lo.double()), w.float().double().to(dev),
                                                             None if b is None else b.float().double().to(dev),
                                                             cache.to(dtype).double().to(dev), act, group)
                errors[f"{nm}+cache.y"], errors[f"{nm}+cache.cache"] = rel(y, y_ref), rel(c_new, c_ref)
        else:
            for i, nm in ((0, "l2_q"), (1, "l2_k")):
                compare(nm, lambda x, i=i: fused.l2norm(part(i)(x), K, True, impl=impl),
                        lambda x, i=i: fused.naive_l2norm(part(i)(x), K, True), [wide], [dtype])
        o = r(B, T, H, V)
        w = 1 + 0.3 * r(V)
        eps = mixer.o_norm.eps
        if m["use_output_gate"]:
            gi = len(widths) - 1
            compare("o_norm", lambda o, w, x: fused.rms_norm_gated(o, w, part(gi)(x), eps, impl=impl),
                    lambda o, w, x: fused.naive_rms_norm_gated(o, w, part(gi)(x), eps), [o, w, wide],
                    [dtype, torch.float32, dtype])
        else:
            compare("o_norm", lambda o, w: fused.rms_norm_gated(o, w, None, eps, impl=impl),
                    lambda o, w: fused.naive_rms_norm_gated(o, w, None, eps), [o, w], [dtype, torch.float32])
    D = m["hidden_size"]
    compare("block_norm", lambda x, w: fused.rms_norm_gated(x, w, None, m["norm_eps"], impl=impl),
            lambda x, w: fused.naive_rms_norm_gated(x, w, None, m["norm_eps"]),
            [r(B, T, D), 1 + 0.3 * r(D)], [torch.float32, torch.float32])
    return {"errors": errors, "fla_errors": {}}

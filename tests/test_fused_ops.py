"""kernels/fused: each Triton op (under TRITON_INTERPRET=1 on the CPU, float32) against its plain PyTorch form in
float64, forward and gradients; the PyTorch forms against the modules they replace (models/layers.py); and the
delta mixer's fused path against its plain path (outputs, parameter gradients, decoding caches).

Shapes are tiny (the interpreter runs each program in numpy). On a CUDA machine, DPX_TEST_CUDA=1 runs the same
tests on the real compiler (benchmarks/layer_gpu.py also checks the ops on the GPU at training shapes).
"""
import os

if not os.environ.get("DPX_TEST_CUDA"):
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton

import pytest
import torch

from dpx.kernels import fused
from dpx.kernels.delta_product.naive import l2norm as kernel_l2norm
from dpx.models import ModelConfig
from dpx.models.layers import GatedRMSNorm, ShortConv

DEVICE = "cuda" if os.environ.get("DPX_TEST_CUDA") else "cpu"
TOL = 2e-5  # relative RMS error of a float32 op against float64


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    assert torch.isfinite(a).all()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_both(fn_fast, fn_ref, inputs, seed=0):
    """fn(*inputs) for the float32 op (on DEVICE) and the float64 reference (CPU); returns (outs, grads) pairs
    for a random cotangent on the first output."""
    g = torch.Generator().manual_seed(seed)
    res = []
    for f, dt, dev in ((fn_fast, torch.float32, DEVICE), (fn_ref, torch.float64, "cpu")):
        xs = [None if x is None else x.detach().to(dev, dt).requires_grad_(x.requires_grad) for x in inputs]
        out = f(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        res.append((outs, xs))
    dy = torch.randn(res[1][0][0].shape, generator=g, dtype=torch.float64)
    grads = []
    for (outs, xs), dev in zip(res, (DEVICE, "cpu")):
        outs[0].backward(dy.to(dev, outs[0].dtype))
        grads.append([None if x is None or not x.requires_grad else x.grad for x in xs])
    return (res[0][0], res[1][0]), grads


def strided(x, pad=3):
    """x as a column slice of a wider tensor (as the fused path passes slices of one projection), same values."""
    return torch.nn.functional.pad(x, (2, pad))[..., 2:2 + x.shape[-1]]


def _x(*shape, seed=0, grad=True, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_(grad)


@pytest.mark.parametrize("T, C, group, bias, cache, act", [
    (70, 16, 8, False, False, True),   # three forward row blocks, L2 over groups of 8 (q/k)
    (150, 8, 4, True, False, True),    # two backward programs of 8 tiles (partial weight gradients summed)
    (70, 12, 6, True, True, True),     # group not a power of two (head dim 85 at table3), bias, decode cache
    (9, 40, None, False, True, True),  # no norm (v), short sequence with cache
    (5, 8, None, True, False, False),  # no activation
])
def test_conv_triton_vs_reference(T, C, group, bias, cache, act):
    B, W = 2, 4
    x, w = _x(B, T, C, seed=1), _x(C, W, seed=2, scale=0.5)
    b = _x(C, seed=3) if bias else None
    c = _x(B, W - 1, C, seed=4, grad=False) if cache else None

    def fast(x, w, b, c):
        return fused.causal_conv1d(strided(x), w, b, c, act, group, impl="triton")

    def ref(x, w, b, c):
        return fused.naive_causal_conv1d(x, w, b, c, act, group)
    (o, r), (gf, gr) = run_both(fast, ref, [x, w, b, c])
    assert rel(o[0], r[0]) < TOL and rel(o[1], r[1]) < 1e-7  # y, new cache (the inputs)
    for name, a, e in zip(("dx", "dw", "db"), gf, gr):
        if e is not None:
            assert rel(a, e) < TOL, name


def test_conv_reference_is_shortconv_then_l2norm():
    """The PyTorch form equals the modules the fused path replaces, in float64 (values, cache and gradients)."""
    B, T, C, D = 2, 11, 12, 6
    conv = ShortConv(C, 4).double()
    x = _x(B, T, C, seed=5)
    cache = _x(B, 3, C, seed=6, grad=False)
    y0, c0 = conv(x, cache)
    y0 = kernel_l2norm(y0.view(B, T, C // D, D)).view(B, T, C)
    y1, c1 = fused.naive_causal_conv1d(x, conv.weight, None, cache, True, D)
    assert torch.allclose(y0, y1, rtol=1e-12, atol=1e-12) and torch.equal(c0, c1)
    g0 = torch.autograd.grad(y0.sum(), [x, conv.weight])
    g1 = torch.autograd.grad(y1.sum(), [x, conv.weight])
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(g0, g1))


def test_conv_decode_cache_continues_the_sequence():
    B, T, C, W = 2, 10, 8, 4
    x, w = _x(B, T, C, seed=7, grad=False).float().to(DEVICE), _x(C, W, seed=8, grad=False).float().to(DEVICE)
    full, _ = fused.causal_conv1d(x, w, None, None, True, 4, impl="triton")
    y, cache = fused.causal_conv1d(x[:, :6], w, None, None, True, 4, impl="triton")
    outs = [y]
    for t in range(6, T):  # one token at a time from the cache, as a decoder does
        y, cache = fused.causal_conv1d(x[:, t:t + 1], w, None, cache, True, 4, impl="triton")
        outs.append(y)
    assert rel(torch.cat(outs, 1), full) < 1e-6


@pytest.mark.parametrize("C, group, act", [(16, 8, True), (12, 6, False)])
def test_l2norm_triton_vs_reference(C, group, act):
    x = _x(3, 5, C, seed=9)

    def fast(x):
        return fused.l2norm(strided(x), group, act, impl="triton")

    def ref(x):
        return fused.naive_l2norm(x, group, act)
    (o, r), (gf, gr) = run_both(fast, ref, [x])
    assert rel(o[0], r[0]) < TOL and rel(gf[0], gr[0]) < TOL
    y = ref(x.detach())
    a = torch.nn.functional.silu(x.detach()) if act else x.detach()
    assert torch.allclose(y, kernel_l2norm(a.unflatten(-1, (-1, group))).flatten(-2), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("D, gated", [(8, True), (6, False), (12, True)])
def test_rms_norm_gated_triton_vs_reference(D, gated):
    B, T, H = 2, 37, 3
    x = _x(B, T, H, D, seed=10)
    w = _x(D, seed=11, scale=0.3)
    with torch.no_grad():
        w += 1
    gate = _x(B, T, H * D, seed=12) if gated else None

    def fast(x, w, gate):
        return fused.rms_norm_gated(x, w, None if gate is None else strided(gate, 5), 1e-6, impl="triton")

    def ref(x, w, gate):
        return fused.naive_rms_norm_gated(x, w, gate, 1e-6)
    (o, r), (gf, gr) = run_both(fast, ref, [x, w, gate])
    assert rel(o[0], r[0]) < TOL
    for name, a, e in zip(("dx", "dw", "dgate"), gf, gr):
        if e is not None:
            assert rel(a, e) < TOL, name
    norm = GatedRMSNorm(D, 1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(w)
    g4 = None if gate is None else gate.detach().view(B, T, H, D)
    assert torch.allclose(norm(x.detach(), g4), ref(x.detach(), w.detach(), gate), rtol=1e-12, atol=1e-12)


# -- the mixer: fused path vs plain path ------------------------------------------------------------------------

def _mixer(family, n, conv=True, out_gate=False, seed=0):
    from dpx.models.mixers.delta import DeltaProductMixer
    cfg = ModelConfig(family=family, hidden_size=16, num_heads=2, head_dim=8, num_householder=n,
                      allow_neg_eigval=True, use_short_conv=conv, use_output_gate=out_gate)
    torch.manual_seed(seed)
    m = DeltaProductMixer(cfg)
    with torch.no_grad():  # non-trivial norm weights so their gradients are exercised
        m.o_norm.weight.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("family, n, conv, out_gate", [
    ("deltanet", 1, True, False),
    ("gated_deltaproduct", 2, True, True),
    ("deltaproduct", 3, False, False),
    ("gated_deltanet", 1, False, True),
])
def test_mixer_fused_path_matches_plain_path(family, n, conv, out_gate):
    m = _mixer(family, n, conv, out_gate)
    B, T = 2, 9
    x = _x(B, T, 16, seed=13, grad=False)
    ref = m.double()
    ref.fused = False
    xr = x.clone().requires_grad_()
    yr, sr = ref(xr)
    dy = torch.randn(yr.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    yr.backward(dy)
    gref = {k: p.grad.clone() for k, p in ref.named_parameters()}
    gx_ref = xr.grad.clone()
    ref.zero_grad(set_to_none=True)

    fast = m.float().to(DEVICE)
    fast.fused, fast.fused_impl = True, "triton"
    xf = x.float().to(DEVICE).requires_grad_()
    yf, sf = fast(xf)
    yf.backward(dy.float().to(DEVICE))
    assert rel(yf, yr) < 1e-4 and rel(sf["S"], sr["S"]) < 1e-4
    assert rel(xf.grad, gx_ref) < 1e-4
    for k, p in fast.named_parameters():
        assert rel(p.grad, gref[k]) < 1e-4, k
    if conv:
        for k in ("conv_q", "conv_k", "conv_v"):
            assert rel(sf[k], sr[k]) < 1e-6, k
    assert set(sf) == set(sr)


def test_mixer_fused_prefill_then_decode():
    """A fused prefill's state (recurrent S and conv caches) continues with the plain decoding step."""
    m = _mixer("gated_deltaproduct", 2).double()
    x = _x(1, 8, 16, seed=14, grad=False)
    m.fused = False
    full, _ = m(x)
    m.fused, m.fused_impl = True, "torch"
    y, st = m(x[:, :5])
    outs = [y]
    for t in range(5, 8):
        yt, st = m.step(x[:, t], st)
        outs.append(yt[:, None])
    assert rel(torch.cat(outs, 1), full) < 1e-10


def test_plain_path_on_cpu_by_default():
    m = _mixer("deltaproduct", 2)
    x = torch.zeros(1, 3, 16)
    assert not m._use_fused(x, {}, "chunk")
    m.fused = True
    assert m._use_fused(x, {}, "chunk") and not m._use_fused(x, {}, "recurrent")


def test_block_rmsnorm_fused_matches_plain(monkeypatch):
    """models/layers.py:RMSNorm through the fused op (wide rows: a few rows per program; the backward's row-block
    loop with more blocks than programs) against its plain form in float64."""
    from dpx.kernels.fused import fused_norm_gate
    from dpx.models.layers import RMSNorm
    monkeypatch.setattr(fused_norm_gate, "MAX_PROGRAMS_BWD", 3)
    norm = RMSNorm(96, 1e-6).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = _x(4, 50, 96, seed=15)  # 200 rows: 7 blocks of 32 for 3 backward programs
    dy = torch.randn(4, 50, 96, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    norm.fused = False
    y0 = norm(x)
    g0 = torch.autograd.grad(y0, [x, norm.weight], dy)
    nf = norm.float().to(DEVICE)
    nf.fused, nf.fused_impl = True, "triton"
    xf = x.detach().float().to(DEVICE).requires_grad_()
    y1 = nf(xf)
    g1 = torch.autograd.grad(y1, [xf, nf.weight], dy.float().to(DEVICE))
    assert rel(y1, y0) < TOL and all(rel(a, b) < TOL for a, b in zip(g1, g0))
    assert not RMSNorm(8)._use_fused(torch.zeros(1, 8))  # plain on CPU by default


@pytest.mark.parametrize("family, heads, n, d", [("deltaproduct", 6, 3, 16), ("deltanet", 12, 1, 16),
                                                 ("gated_deltaproduct", 8, 2, 16), ("deltaproduct", 4, 2, 21)])
def test_fused_projection_parts_are_16_column_aligned(family, heads, n, d):
    """Every part of the one input GEMM's output starts at a multiple of 16 columns and the width is one (cuBLAS's
    fast Hopper kernels need 16-byte rows: fig4 at n_h = 3 is 5394 columns unpadded; Triton vectorizes the short
    conv's loads of the q/k/v column views only for a row stride divisible by 16 and 16-byte aligned starts). The
    pads are zero rows that are no parameter and get no gradient, and the split gives back each projection."""
    from dpx.models.mixers.delta import DeltaProductMixer
    cfg = ModelConfig(family=family, hidden_size=64, num_heads=heads, head_dim=d, num_householder=n,
                      allow_neg_eigval=True)
    m = DeltaProductMixer(cfg)
    w, sizes = m._in_weight()
    assert w.shape[0] % 16 == 0 and w.shape[0] == sum(sizes) and len(sizes) % 2 == 0
    starts = [sum(sizes[:i]) for i in range(0, len(sizes), 2)]
    assert all(s % 16 == 0 for s in starts), starts
    mods = [m.q_proj, m.k_proj, m.v_proj, m.b_proj] + ([m.a_proj] if cfg.use_forget_gate else [])
    for mod, s0, size, pad in zip(mods, starts, sizes[::2], sizes[1::2], strict=True):
        assert torch.equal(w[s0:s0 + size], mod.weight) and size == mod.out_features
        assert torch.equal(w[s0 + size:s0 + size + pad], torch.zeros_like(w[s0 + size:s0 + size + pad]))
    assert sum(sizes[1::2]) > 0  # some part needed padding (the test would otherwise not see the pads)
    in_params = sum(p.numel() for k, p in m.named_parameters() if k.endswith("_proj.weight") and k != "o_proj.weight")
    assert in_params == sum(sizes[::2]) * 64  # the pads are no parameter

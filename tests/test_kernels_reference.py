"""PyTorch chunkwise DeltaProduct and the decode step against the float64 token loop (values and gradients)."""
import pytest
import torch

from dpx.kernels import gated_delta_product, gated_delta_product_step, resolve_impl
from dpx.kernels.delta_product.naive import naive_recurrent_gated_delta_product as naive
from dpx.kernels.delta_product.torch_chunk import torch_chunk_gated_delta_product as torch_chunk


def poison_empty_tensors(monkeypatch):
    """torch.empty / empty_like / Tensor.new_empty return NaN-filled floating tensors for the rest of the test, so an
    output element a kernel fails to write shows as NaN (fla's style); the kernel tests' autouse fixtures call it."""
    def nan_fill(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t
    e, el, ne = torch.empty, torch.empty_like, torch.Tensor.new_empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: nan_fill(e(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: nan_fill(el(*a, **k)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: nan_fill(ne(self, *a, **k)))


def make_inputs(B, T, H, K, V, n, gate, dtype=torch.float64, N=None, seed=0):
    """Random inputs with beta in [0, 2]; gate is None, "rand", "zero" (exact 0 logs) or "mixed" (0 and -30)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)
    q, k, v = r(B, T, H, K), r(B, T * n, H, K), r(B, T * n, H, V)
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = 2 * torch.rand(B, T * n, H, generator=gen, dtype=torch.float64)
    g = None
    if gate == "rand":
        g = -torch.rand(B, T, H, generator=gen, dtype=torch.float64) * 2
    elif gate == "zero":
        g = torch.zeros(B, T, H, dtype=torch.float64)
    elif gate == "mixed":
        g = torch.where(torch.rand(B, T, H, generator=gen, dtype=torch.float64) < 0.5, 0.0, -30.0)
    h0 = r(N or B, H, K, V)
    return [x if x is None else x.to(dtype) for x in (q, k, v, beta, g, h0)]


def cotangents(o_shape, ht_shape):
    """The float64 (dO, dht) every gradient test uses (fixed seed): grads() and the rounding-model tests."""
    gen = torch.Generator().manual_seed(1)
    return (torch.randn(o_shape, generator=gen, dtype=torch.float64),
            torch.randn(ht_shape, generator=gen, dtype=torch.float64))


def grads(fn, inputs, **kw):
    xs = [x if x is None else x.detach().clone().requires_grad_() for x in inputs]
    q, k, v, beta, g, h0 = xs
    o, ht = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw)
    do, dht = cotangents(o.shape, ht.shape)
    do, dht = do.to(device=o.device, dtype=o.dtype), dht.to(device=ht.device, dtype=ht.dtype)
    ((o * do).sum() + (ht * dht).sum()).backward()
    return [o, ht] + [x.grad if x is not None else None for x in xs]


NAMES = ["o", "ht", "dq", "dk", "dv", "dbeta", "dg", "dh0"]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("gate", [None, "rand", "mixed"])
def test_torch_chunk_matches_naive_float64(n, gate):
    inputs = make_inputs(2, 19, 2, 8, 6, n, gate)
    ref = grads(naive, inputs, num_householder=n, scale=0.7)
    out = grads(torch_chunk, inputs, num_householder=n, scale=0.7, chunk_size=4)
    for name, a, b in zip(NAMES, ref, out):
        if a is None:
            assert b is None, name
            continue
        assert torch.isfinite(b).all(), name
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-9, msg=name)


def test_torch_chunk_varlen_l2norm_zero_gates():
    n, cu = 2, torch.tensor([0, 1, 9, 9, 14])
    inputs = make_inputs(1, 14, 2, 8, 4, n, "zero", N=4)
    kw = dict(num_householder=n, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    ref, out = grads(naive, inputs, **kw), grads(torch_chunk, inputs, chunk_size=3, **kw)
    for name, a, b in zip(NAMES, ref, out):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-9, msg=name)


def test_varlen_equals_separate_sequences():
    # cu_seqlens must not leak state across segments: segment 1 alone from h0[1] must give the same result
    n, cu = 3, torch.tensor([0, 5, 12])
    q, k, v, beta, g, h0 = make_inputs(1, 12, 1, 4, 4, n, "rand", N=2)
    o, ht = torch_chunk(q, k, v, g, beta, num_householder=n, initial_state=h0, output_final_state=True,
                        cu_seqlens=cu)
    o1, h1 = naive(q[:, 5:], k[:, 15:], v[:, 15:], g[:, 5:], beta[:, 15:], num_householder=n, initial_state=h0[1:],
                   output_final_state=True)
    torch.testing.assert_close(o[:, 5:], o1, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ht[1:], h1, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_torch_chunk_low_precision(dtype, tol):
    q, k, v, beta, g, h0 = make_inputs(1, 33, 2, 16, 16, 2, "rand")
    o_ref, h_ref = naive(q, k, v, g, beta, num_householder=2, initial_state=h0, output_final_state=True)
    q, k, v, beta, g, h0 = (x.to(dtype) for x in (q, k, v, beta, g, h0))
    o, h = torch_chunk(q, k, v, g, beta, num_householder=2, initial_state=h0, output_final_state=True)
    assert o.dtype == dtype and h.dtype == torch.float32
    err = (o.double() - o_ref).norm() / o_ref.norm()
    assert err < tol, err


def test_decode_steps_continue_the_sequence():
    # prefill 7 tokens, then decode 3 one at a time and 2 at once: must equal one pass over all 12
    n = 2
    q, k, v, beta, g, h0 = make_inputs(2, 12, 2, 8, 8, n, "rand")
    o_ref, h_ref = naive(q, k, v, g, beta, num_householder=n, initial_state=h0, output_final_state=True)
    _, S = gated_delta_product(q[:, :7], k[:, :14], v[:, :14], g[:, :7], beta[:, :14], num_householder=n,
                               initial_state=h0, output_final_state=True, impl="torch")
    outs = []
    for t0, t1 in [(7, 8), (8, 9), (9, 10), (10, 12)]:
        o_t, S = gated_delta_product_step(q[:, t0:t1], k[:, t0 * n:t1 * n], v[:, t0 * n:t1 * n], g[:, t0:t1],
                                          beta[:, t0 * n:t1 * n], state=S, num_householder=n)
        outs.append(o_t)
    torch.testing.assert_close(torch.cat(outs, 1), o_ref[:, 7:], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, h_ref, rtol=1e-10, atol=1e-10)


def deltanet_loop(q, k, v, g, beta, scale):
    """Gated DeltaNet (n_h = 1) written out here, so that the order test below leans on no kernel's signature."""
    S = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[-1])
    outs = []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[..., None, None]
        err = v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        S = S + beta[:, t, :, None, None] * k[:, t, :, :, None] * err[:, :, None, :]
        outs.append(scale * torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(outs, 1), S


# every CPU entry point of the op, called positionally as (q, k, v, g, beta); the Triton ones: test_kernels_triton.py
ORDER_ENTRIES = {
    "gated_delta_product:torch": lambda *a, **kw: gated_delta_product(*a, output_final_state=True, impl="torch", **kw),
    "gated_delta_product:naive": lambda *a, **kw: gated_delta_product(*a, output_final_state=True, impl="naive", **kw),
    "gated_delta_product_step:torch": lambda *a, **kw: gated_delta_product_step(*a, impl="torch", **kw),
    "gated_delta_product_step:naive": lambda *a, **kw: gated_delta_product_step(*a, impl="naive", **kw),
    "naive_recurrent": lambda *a, **kw: naive(*a, output_final_state=True, **kw),
    "torch_chunk": lambda *a, **kw: torch_chunk(*a, output_final_state=True, chunk_size=4, **kw),
}


def order_case():
    """n_h = 1: g and beta have the same shape [B, T, H], so only the argument order tells them apart."""
    q, k, v, beta, g, _ = make_inputs(2, 9, 2, 4, 3, 1, "rand")
    assert g.shape == beta.shape and not torch.allclose(g, beta)
    return q, k, v, g, beta


@pytest.mark.parametrize("entry", sorted(ORDER_ENTRIES))
def test_positional_order_is_q_k_v_g_beta(entry):
    q, k, v, g, beta = order_case()
    o_ref, S_ref = deltanet_loop(q, k, v, g, beta, 0.5)
    o, S = ORDER_ENTRIES[entry](q, k, v, g, beta, scale=0.5)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)
    o_swapped, _ = ORDER_ENTRIES[entry](q, k, v, beta, g, scale=0.5)  # the wrong order runs, with other numbers
    assert not torch.allclose(o_swapped, o_ref, atol=1e-3)


def test_tails_are_keyword_only():
    q, k, v, g, beta = order_case()
    for fn in (gated_delta_product, gated_delta_product_step, naive, torch_chunk):
        with pytest.raises(TypeError):
            fn(q, k, v, g, beta, 1)  # num_householder (or state) by name only


def test_dispatch_and_errors(monkeypatch):
    assert resolve_impl("auto", torch.device("cpu")) == "torch"
    assert resolve_impl("auto", torch.device("cuda")) == "triton"
    monkeypatch.setenv("DPX_KERNEL_IMPL", "naive")
    assert resolve_impl("auto", torch.device("cuda")) == "naive"
    assert resolve_impl("torch", torch.device("cuda")) == "torch"
    with pytest.raises(ValueError, match="impl"):
        resolve_impl("cuda", torch.device("cpu"))
    q, k, v, beta, g, h0 = make_inputs(1, 4, 1, 4, 4, 2, None)
    with pytest.raises(ValueError, match="k: expected"):
        gated_delta_product(q, k[:, :4], v, None, beta, num_householder=2)
    with pytest.raises(ValueError, match="cu_seqlens"):
        gated_delta_product(q, k, v, None, beta, num_householder=2, cu_seqlens=torch.tensor([0, 3]))


def test_import_is_cheap():
    import subprocess, sys
    # torch-free too: models/config.py validates `model.impl` against dpx.kernels.IMPLS without torch
    code = "import sys, dpx.kernels; assert not {'torch', 'triton'} & set(sys.modules), 'torch/triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)

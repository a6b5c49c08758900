"""The linear recurrence (dpx.kernels.gated_linear_recurrence): the chunkwise form against the float64 token loop,
values
and gradients of every input, for each special case the families use (no / scalar / per-channel decay, RWKV's bonus
read, RWKV-7's rank-one term), and the dispatch (impl, 16-bit upcast)."""
import pytest
import torch

from dpx.kernels import (gated_linear_recurrence, naive_gated_linear_recurrence,
                         torch_chunk_gated_linear_recurrence)

torch.set_num_threads(1)  # tiny float64 shapes on a shared 2-core box: extra intra-op threads only contend

def make_inputs(case, B=2, T=11, H=2, K=4, V=3, seed=0):
    """float64 inputs of one family's special case; decays w <= 0, RWKV-7's a = -(alpha * kappa), b = kappa."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k, v, S0 = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V), r(B, H, K, V)
    rate = lambda *s: -torch.rand(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    w = {"none": torch.zeros(B, T, H, 1, dtype=torch.float64), "scalar": rate(B, T, H, 1),
         "channel": rate(B, T, H, K), "bonus": rate(B, T, H, K), "rank_one": rate(B, T, H, K)}[case]
    a = b = u = None
    if case == "bonus":
        u = r(H, K)
    if case == "rank_one":
        kappa = torch.nn.functional.normalize(r(B, T, H, K), dim=-1)
        a, b = -(2 * torch.rand(B, T, H, K, generator=gen, dtype=torch.float64) * kappa), kappa
    return dict(q=q, k=k, v=v, w=w, a=a, b=b, u=u, initial_state=S0)


def run(fn, inputs, **kw):
    """(o, S) and the gradient of a fixed random functional of both wrt every input given."""
    xs = {n: None if x is None else x.detach().clone().requires_grad_() for n, x in inputs.items()}
    o, S = fn(xs["q"], xs["k"], xs["v"], xs["w"], a=xs["a"], b=xs["b"], u=xs["u"], initial_state=xs["initial_state"],
              scale=0.7, **kw)
    gen = torch.Generator().manual_seed(1)
    ((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum()
     + (S * torch.randn(S.shape, generator=gen, dtype=S.dtype)).sum()).backward()
    return [o, S] + [None if x is None else x.grad for x in xs.values()]


@pytest.mark.parametrize("case", ["none", "scalar", "channel", "bonus", "rank_one"])
@pytest.mark.parametrize("chunk_size", [4, 16])
def test_chunk_matches_the_float64_loop(case, chunk_size):
    inputs = make_inputs(case)
    ref = run(naive_gated_linear_recurrence, inputs)
    out = run(torch_chunk_gated_linear_recurrence, inputs, chunk_size=chunk_size)
    for name, x, y in zip(["o", "S", *inputs], ref, out):
        if x is None:
            assert y is None, name
            continue
        assert torch.isfinite(y).all(), name
        torch.testing.assert_close(y, x, rtol=1e-9, atol=1e-9, msg=name)


def test_dispatch_impls_and_errors():
    inputs = make_inputs("rank_one")
    kw = {n: x for n, x in inputs.items() if n not in "qkvw"}
    q, k, v, w = (inputs[n] for n in "qkvw")
    ref = naive_gated_linear_recurrence(q, k, v, w, **kw)
    for impl in ("naive", "torch", "auto"):
        for got, want in zip(gated_linear_recurrence(q, k, v, w, chunk_size=4, impl=impl, **kw), ref):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="impl"):
        gated_linear_recurrence(q, k, v, w, impl="triton")
    with pytest.raises(TypeError):
        gated_linear_recurrence(q, k, v, w, None)  # everything after w is keyword-only


def test_16bit_inputs_run_in_float32():
    inputs = make_inputs("channel", T=9)
    ref_o, _ = naive_gated_linear_recurrence(**{n: x for n, x in inputs.items()})
    lo = {n: None if x is None else x.to(torch.bfloat16) for n, x in inputs.items()}
    o, S = gated_linear_recurrence(**lo)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert (o.double() - ref_o).norm() / ref_o.norm() < 3e-2

"""Triton DeltaProduct kernels (chunk forward + backward, recurrent decode) under TRITON_INTERPRET=1 on the CPU,
against the float64 token loop: outputs, final states and all gradients.

Every torch.empty* inside the kernels' host code is poisoned with NaN, so an element a kernel fails to write
shows up as NaN, and NaN never passes a comparison. The interpreter runs each program in numpy; shapes are tiny.
On a CUDA machine (DPX_TEST_CUDA=1 without TRITON_INTERPRET) the same tests run on the real compiler.
"""
import os

if not os.environ.get("DPX_TEST_CUDA"):
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton

import pytest
import torch

from test_kernels_reference import NAMES, deltanet_loop, grads, make_inputs, order_case, poison_empty_tensors
from dpx.kernels import chunk_gated_delta_product, fused_recurrent_gated_delta_product, gated_delta_product
from dpx.kernels.delta_product.naive import naive_recurrent_gated_delta_product as naive

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # masked exp overflow in numpy
DEVICE = "cuda" if os.environ.get("DPX_TEST_CUDA") else "cpu"
# relative RMS error; bf16: a correct kernel has ~4.5e-3 on the GPU cases below (the rounding model of
# test_kernels_rounding.py, whose fp16 predictions the interpreter reproduces), so 1e-2 leaves a 2x margin
TOL = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    poison_empty_tensors(monkeypatch)


def check(name, ref, out, tol):
    assert out is not None, name
    out = out.double().cpu()
    assert torch.isfinite(out).all(), f"{name}: non-finite values"
    err = (out - ref).norm() / ref.norm().clamp_min(1e-12)
    assert err < tol, f"{name}: relative error {err:.2e} > {tol:.0e}"


def run_case(B, T, H, K, V, n, gate, dtype, cu=None, l2=False, scale=0.7):
    N = None if cu is None else len(cu) - 1
    inputs = make_inputs(B, T, H, K, V, n, gate, N=N)
    kw = dict(num_householder=n, scale=scale, use_qk_l2norm_in_kernel=l2)
    ref = grads(naive, inputs, cu_seqlens=cu, **kw)
    lo = [None if x is None else x.to(dtype if i < 3 else torch.float32).to(DEVICE) for i, x in enumerate(inputs)]
    out = grads(chunk_gated_delta_product, lo, cu_seqlens=None if cu is None else cu.to(DEVICE), **kw)
    assert out[0].dtype == dtype and out[1].dtype == torch.float32
    failures = []  # every output is checked, so a failure names all that are off, not just the first
    for name, a, b in zip(NAMES, ref, out):
        if a is None:
            assert b is None, name
            continue
        try:
            check(name, a, b, TOL[dtype] * (4 if name == "dg" else 1))
        except AssertionError as e:
            failures.append(str(e).splitlines()[0])
    assert not failures, "; ".join(failures)


@pytest.mark.parametrize("n,gate,T", [(1, None, 70), (1, "mixed", 33), (2, "rand", 37), (2, None, 45),
                                      (3, "mixed", 23), (3, "zero", 17), (4, "rand", 19), (4, None, 9)])
def test_chunk_matches_naive_fp32(n, gate, T):
    run_case(2, T, 2, 16, 16, n, gate, torch.float32)


def test_chunk_odd_head_dims_l2norm():
    run_case(1, 21, 1, 20, 12, 2, "rand", torch.float32, l2=True)


@pytest.mark.parametrize("n", [2, 3])
def test_chunk_varlen_with_length_one_segment(n):
    run_case(1, 31, 2, 16, 16, n, "mixed", torch.float32, cu=torch.tensor([0, 1, 18, 18, 31]))


@pytest.mark.parametrize("n,bwd_fp32", [(2, "0"), (3, ""), (3, "1")])
def test_chunk_fp16(n, bwd_fp32, monkeypatch):
    # the 16-bit backward (pinned, and the default), and the float32 backward behind DPX_KERNEL_BWD_FP32=1
    monkeypatch.setenv("DPX_KERNEL_BWD_FP32", bwd_fp32)
    run_case(1, 40, 2, 32, 32, n, "rand", torch.float16)


@pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter has no bfloat16 arithmetic (numpy)")
@pytest.mark.parametrize("n,gate,dqkwg", [(2, "rand", "fused"), (3, "mixed", "fused"), (2, "mixed", "fused"),
                                          (3, "rand", "fused"), (2, "rand", "split"), (3, "mixed", "split")])
def test_chunk_bf16_real_compiler(n, gate, dqkwg, monkeypatch):
    # (3, mixed) gave dk/dv/dbeta 2.6-4.4e-2 on the H200 (2026-11-29); (2, mixed) and (3, rand) tell n_h from gates.
    # split: the opt-in two-kernel per-chunk gradients (DPX_KERNEL_DQKWG=split); wrong on the H200 with Triton 3.6
    # (2026-12-01), so there it must refuse to run rather than return those gradients
    from dpx.kernels.delta_product.chunk import split_refusal
    monkeypatch.setenv("DPX_KERNEL_BWD_FP32", "0")
    monkeypatch.setenv("DPX_KERNEL_DQKWG", dqkwg)
    if dqkwg == "split" and split_refusal(torch.device(DEVICE)):
        with pytest.raises(RuntimeError, match="DPX_KERNEL_DQKWG=split: its gradients are wrong on Hopper"):
            run_case(2, 150, 2, 64, 64, n, gate, torch.bfloat16)
        return
    # bf16 operands and float32 accumulation in every kernel, forward and backward (what training runs)
    run_case(2, 150, 2, 64, 64, n, gate, torch.bfloat16)


def test_chunk_no_states_value_dim_over_one_slice():
    # no initial state and no final-state gradient (the kernels' other constexpr paths); V = 80 spans two
    # 64-wide V slices, so the per-chunk gradient kernel's loop over V and its masks run
    n, scale = 2, 0.7
    q, k, v, beta, g, _ = make_inputs(1, 13, 1, 16, 80, n, "rand")

    def run(fn, xs, dev):
        xs = [x.detach().to(dev).requires_grad_() for x in xs]
        o, ht = fn(*xs, num_householder=n, scale=scale)
        assert ht is None
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        (o * do.to(o)).sum().backward()
        return [o] + [x.grad for x in xs]

    ref = run(naive, (q, k, v, g, beta), "cpu")
    out = run(chunk_gated_delta_product, [x.float() for x in (q, k, v, g, beta)], DEVICE)
    for name, a, b in zip(["o", "dq", "dk", "dv", "dg", "dbeta"], ref, out):
        check(name, a, b, TOL[torch.float32] * (4 if name == "dg" else 1))


def test_chunk_product_form_inverse(monkeypatch):
    # bf16 inputs invert the 16x16 diagonal blocks as (I-A)(I+A^2)(I+A^4)(I+A^8); the interpreter has no bf16, so
    # force that path for float32 and check it against the loop (forward and every gradient)
    from dpx.kernels.delta_product import wy_fast
    monkeypatch.setattr(wy_fast, "FAST_INV_DTYPES", (torch.bfloat16, torch.float32))
    run_case(1, 35, 2, 16, 16, 2, "rand", torch.float32)


def test_chunk_many_householders():
    run_case(1, 11, 1, 16, 16, 8, "rand", torch.float32)


@pytest.mark.parametrize("dtype,bwd_fp32,path,cu", [(torch.float16, "0", "triton", None),
                                                     (torch.float32, "", "torch_fp32", None),
                                                     (torch.float32, "", "torch_fp32", torch.tensor([0, 1, 13, 20]))])
def test_chunk_largest_head_dims(dtype, bwd_fp32, path, cu, monkeypatch):
    # d_k = d_v = 256, the largest the API accepts: one [*, 256] key tile per program and four 64-wide V slices.
    # 16-bit: the Triton backward; float32: autograd through torch_chunk (its Triton tiles exceed a Hopper SM)
    from dpx.kernels.delta_product.chunk import backward_path
    monkeypatch.setenv("DPX_KERNEL_BWD_FP32", bwd_fp32)
    assert backward_path(dtype, 2, 256) == path
    run_case(1, 20, 1, 256, 256, 2, "rand", dtype, cu=cu)  # ("mixed" gates leave dh0 ~1e-11: fp16 underflows it)


# DPX_KERNEL_DQKWG=split: the per-chunk gradients by chunk_bwd_split's two kernels (K-blocked dq/dk_o/dW, then the
# WY backward) instead of the fused kernel. K = 128 takes two 64-wide K blocks (the gate partials and dk_o summed
# across programs) and V = 80 two V slices; K = 20, V = 12 run zero-padded to 32, 16.
@pytest.mark.parametrize("n,gate,T,K,V,dtype,cu", [
    (1, "rand", 40, 16, 16, torch.float32, None), (1, None, 33, 16, 16, torch.float32, None),
    (2, "mixed", 37, 16, 16, torch.float32, None), (2, None, 45, 16, 16, torch.float32, None),
    (3, "rand", 23, 16, 16, torch.float32, None), (3, "mixed", 17, 16, 16, torch.float32, None),
    (4, "rand", 19, 16, 16, torch.float32, None), (4, None, 9, 16, 16, torch.float32, None),
    (3, "rand", 23, 128, 80, torch.float32, None), (2, "mixed", 21, 20, 12, torch.float32, None),
    (2, "mixed", 31, 16, 16, torch.float32, torch.tensor([0, 1, 18, 18, 31])),
    (3, "rand", 40, 32, 32, torch.float16, None)])
def test_chunk_split_dqkwg(n, gate, T, K, V, dtype, cu, monkeypatch):
    from dpx.kernels.delta_product import chunk_bwd_split
    from dpx.kernels.delta_product.chunk import dqkwg_kernel
    monkeypatch.setenv("DPX_KERNEL_DQKWG", "split")
    monkeypatch.setenv("DPX_KERNEL_BWD_FP32", "0")
    assert dqkwg_kernel() == "split"
    calls = []
    split = chunk_bwd_split.chunk_dp_bwd_dqkwg_split
    monkeypatch.setattr(chunk_bwd_split, "chunk_dp_bwd_dqkwg_split", lambda *a: calls.append(1) or split(*a))
    run_case(1 if cu is not None else 2, T, 2, K, V, n, gate, dtype, cu=cu)
    assert calls, "the split kernels did not run"


@pytest.mark.parametrize("cap,version,force,refused", [((9, 0), "3.6.0", "0", True), ((9, 0), "3.7.0", "0", True),
                                                       ((9, 0), "3.7.1", "0", False), ((8, 0), "3.6.0", "0", False),
                                                       ((9, 0), "3.6.0", "1", False)])
def test_split_refused_on_hopper_before_triton_371(cap, version, force, refused, monkeypatch):
    # the refusal's rule, on a CUDA device object (no GPU needed: only its type and capability are read)
    import triton
    from dpx.kernels.delta_product.chunk import dqkwg_kernel, split_refusal
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    monkeypatch.setattr(triton, "__version__", version)
    monkeypatch.setenv("DPX_KERNEL_DQKWG_FORCE", force)
    monkeypatch.setenv("DPX_KERNEL_DQKWG", "split")
    cuda = torch.device("cuda", 0)
    assert bool(split_refusal(cuda)) == refused
    assert split_refusal(torch.device("cpu")) is None  # the interpreter runs it (the float64 tests above)
    if refused:
        with pytest.raises(RuntimeError, match=f"Triton {version}"):
            dqkwg_kernel(cuda)
    else:
        assert dqkwg_kernel(cuda) == "split"


# DPX_KERNEL_FWD=super: the forward's states and outputs over super-chunks of n chunks (chunk_super.py: one state
# per n chunks, <= 64 query rows against all n * 64 steps). n = 3 has 21-token chunks (63 tokens a super-chunk),
# n = 4 16-token ones; varlen with a length-1 and an empty segment; K = 20 runs zero-padded; the backward is the
# chunk path's, checked here through the same gradients.
@pytest.mark.parametrize("n,gate,T,K,V,dtype,cu", [
    (2, "rand", 37, 16, 16, torch.float32, None), (2, None, 70, 16, 16, torch.float32, None),
    (3, "mixed", 50, 16, 16, torch.float32, None), (3, "zero", 23, 16, 16, torch.float32, None),
    (4, "rand", 19, 16, 16, torch.float32, None), (8, "mixed", 21, 16, 16, torch.float32, None),
    (2, "mixed", 31, 16, 16, torch.float32, torch.tensor([0, 1, 18, 18, 31])),
    (3, "rand", 23, 20, 12, torch.float32, None), (3, "rand", 40, 32, 32, torch.float16, None)])
def test_chunk_super_forward(n, gate, T, K, V, dtype, cu, monkeypatch):
    from dpx.kernels.delta_product import chunk_super
    from dpx.kernels.delta_product.chunk import fwd_kernel
    monkeypatch.setenv("DPX_KERNEL_FWD", "super")
    monkeypatch.setenv("DPX_KERNEL_BWD_FP32", "0")
    assert fwd_kernel() == "super"
    calls = []
    sup = chunk_super.chunk_dp_fwd_h_o_super
    monkeypatch.setattr(chunk_super, "chunk_dp_fwd_h_o_super", lambda *a: calls.append(1) or sup(*a))
    run_case(1 if cu is not None else 2, T, 2, K, V, n, gate, dtype, cu=cu)
    assert calls, "the super-chunk kernels did not run"


@pytest.mark.parametrize("value,want", [("", "tok"), ("tok", "tok"), ("chunk", "chunk"), ("super", "super")])
def test_fwd_kernel_switch(value, want, monkeypatch):
    from dpx.kernels.delta_product.chunk import fwd_kernel
    monkeypatch.setenv("DPX_KERNEL_FWD", value)
    assert fwd_kernel() == want
    monkeypatch.setenv("DPX_KERNEL_FWD", "Super")
    with pytest.raises(ValueError, match="DPX_KERNEL_FWD: expected tok, chunk, super or unset"):
        fwd_kernel()


def _spy_tok(monkeypatch):
    """Record the `per_chunk` of every chunk_dp_fwd_o_tok launch (the default output kernel at n_h > 1)."""
    from dpx.kernels.delta_product import chunk_o
    calls, tok = [], chunk_o.chunk_dp_fwd_o_tok
    monkeypatch.setattr(chunk_o, "chunk_dp_fwd_o_tok", lambda *a, **kw: calls.append(kw["per_chunk"]) or tok(*a, **kw))
    return calls


# The default forward at n_h > 1 (DPX_KERNEL_FWD unset = tok): the output over super-chunks in fla's layout, reading
# one state in n of the walk's per-chunk states when a gradient is wanted (checked through every gradient), and over
# chunk_super's walk (one state per super-chunk) when none is (no_grad: checked against the float64 loop).
@pytest.mark.parametrize("n,gate,T,K,V,dtype,cu", [
    (2, "rand", 37, 16, 16, torch.float32, None), (2, None, 70, 16, 16, torch.float32, None),
    (3, "mixed", 50, 16, 16, torch.float32, None), (3, "zero", 23, 16, 16, torch.float32, None),
    (4, "rand", 19, 16, 16, torch.float32, None), (8, "mixed", 21, 16, 16, torch.float32, None),
    (2, "mixed", 31, 16, 16, torch.float32, torch.tensor([0, 1, 18, 18, 31])),
    (3, "rand", 23, 20, 12, torch.float32, None), (3, "rand", 40, 32, 32, torch.float16, None),
    (3, "neg", 70, 16, 16, torch.float32, None)])
def test_chunk_tok_forward(n, gate, T, K, V, dtype, cu, monkeypatch):
    monkeypatch.delenv("DPX_KERNEL_FWD", raising=False)
    monkeypatch.setenv("DPX_KERNEL_BWD_FP32", "0")
    calls = _spy_tok(monkeypatch)
    B = 1 if cu is not None else 2
    run_case(B, T, 2, K, V, n, gate if gate != "neg" else "rand", dtype, cu=cu)
    assert calls and all(calls), "the training forward did not read the per-chunk states through o_tok"
    calls.clear()
    N = None if cu is None else len(cu) - 1
    inputs = make_inputs(B, T, 2, K, V, n, gate if gate != "neg" else "rand", N=N)
    if gate == "neg":  # very negative log gates (-80..0): exp of large differences, masked in the decay matrix
        inputs[4] = inputs[4] * 40
    kw = dict(num_householder=n, scale=0.7, output_final_state=True)
    with torch.no_grad():
        q, k, v, beta, g, h0 = inputs
        o_r, ht_r = naive(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, **kw)
        q, k, v, beta, g, h0 = [None if x is None else x.to(dtype if i < 3 else torch.float32).to(DEVICE)
                                for i, x in enumerate(inputs)]
        o, ht = chunk_gated_delta_product(q, k, v, g, beta, initial_state=h0,
                                          cu_seqlens=None if cu is None else cu.to(DEVICE), **kw)
    assert calls == [False], "the no-grad forward did not run chunk_super's walk + o_tok"
    check("o (no_grad)", o_r, o, TOL[dtype])
    check("ht (no_grad)", ht_r, ht, TOL[dtype])


@pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter has no bfloat16 arithmetic (numpy)")
@pytest.mark.parametrize("n,gate", [(2, "rand"), (3, "mixed")])
def test_chunk_super_bf16_real_compiler(n, gate, monkeypatch):
    monkeypatch.setenv("DPX_KERNEL_FWD", "super")
    run_case(2, 150, 2, 64, 64, n, gate, torch.bfloat16)


@pytest.mark.parametrize("value", ["fused", ""])
def test_dqkwg_kernel_default_is_fused(value, monkeypatch):
    from dpx.kernels.delta_product.chunk import dqkwg_kernel
    monkeypatch.setenv("DPX_KERNEL_DQKWG", value)
    assert dqkwg_kernel() == "fused"
    monkeypatch.delenv("DPX_KERNEL_DQKWG")
    assert dqkwg_kernel() == "fused"


@pytest.mark.parametrize("K", [16, 256])  # the Triton backward, and the PyTorch one (float32 at head dim 256)
def test_dqkwg_kernel_bad_value_raises(K, monkeypatch):
    monkeypatch.setenv("DPX_KERNEL_DQKWG", "Split")
    q, k, v, beta, g, _ = [x.float().to(DEVICE).requires_grad_() if x is not None else None
                           for x in make_inputs(1, 5, 1, K, 16, 2, "rand")]
    o, _ = chunk_gated_delta_product(q, k, v, g, beta, num_householder=2)
    with pytest.raises(ValueError, match="DPX_KERNEL_DQKWG: expected fused, split or unset, got 'Split'"):
        o.sum().backward()


@pytest.mark.parametrize("n,gate,l2,cu,K,V", [(1, "rand", False, None, 16, 24), (2, "mixed", True, None, 16, 24),
                                              (3, None, False, torch.tensor([0, 1, 5, 5]), 16, 24),
                                              (4, "zero", True, None, 16, 24), (2, "rand", True, None, 256, 256)])
def test_fused_recurrent_matches_naive(n, gate, l2, cu, K, V):
    B, N = (1, 3) if cu is not None else (2, None)
    q, k, v, beta, g, h0 = make_inputs(B, 5, 2, K, V, n, gate, N=N)
    o_ref, h_ref = naive(q, k, v, g, beta, num_householder=n, initial_state=h0, output_final_state=True,
                         use_qk_l2norm_in_kernel=l2, cu_seqlens=cu)
    f = lambda x: None if x is None else x.float().to(DEVICE)
    o, h = fused_recurrent_gated_delta_product(
        f(q), f(k), f(v), f(g), f(beta), num_householder=n, initial_state=f(h0), output_final_state=True,
        use_qk_l2norm_in_kernel=l2, cu_seqlens=None if cu is None else cu.to(DEVICE))
    check("o", o_ref, o, 1e-5)
    check("ht", h_ref, h, 1e-5)


def test_dispatch_triton_equals_torch():
    q, k, v, beta, g, h0 = [x.float().to(DEVICE) for x in make_inputs(1, 9, 1, 16, 16, 2, "rand")]
    a = gated_delta_product(q, k, v, g, beta, num_householder=2, initial_state=h0, output_final_state=True,
                            impl="triton")
    b = gated_delta_product(q, k, v, g, beta, num_householder=2, initial_state=h0, output_final_state=True,
                            impl="torch")
    for x, y in zip(a, b):
        check("dispatch", y.double().cpu(), x, 1e-5)


def test_positional_order_is_q_k_v_g_beta():
    # n_h = 1 (g and beta of one shape): the drop-ins take fla's order; chunk_gated_delta_product keeps fla's
    # positional num_householder and scale, fused_recurrent_gated_delta_product (no fla counterpart) has keyword tails
    f = lambda x: x.float().to(DEVICE)  # noqa: E731
    q, k, v, g, beta = order_case()
    o_ref, S_ref = deltanet_loop(q, k, v, g, beta, 0.5)
    for o, S in (chunk_gated_delta_product(f(q), f(k), f(v), f(g), f(beta), 1, 0.5, output_final_state=True),
                 fused_recurrent_gated_delta_product(f(q), f(k), f(v), f(g), f(beta), scale=0.5,
                                                     output_final_state=True),
                 gated_delta_product(f(q), f(k), f(v), f(g), f(beta), scale=0.5, output_final_state=True,
                                     impl="triton")):
        check("o", o_ref, o, 1e-5)
        check("ht", S_ref, S, 1e-5)
    with pytest.raises(TypeError):
        fused_recurrent_gated_delta_product(f(q), f(k), f(v), f(g), f(beta), 1)



def test_float32_query_tiles_are_at_least_32_rows():
    # the H200 check of 2026-12-01 faulted in every float32 case with 16-row query tiles (n_h = 4, 8: dv_local, dh);
    # 16-bit data keep 16 rows (they passed there), float32 takes the 32 rows it ran with at n_h = 2, 3
    from dpx.kernels.delta_product.index import chunk_table, query_tile
    for n, f32, b16 in [(1, 64, 64), (2, 32, 32), (3, 32, 32), (4, 32, 16), (8, 32, 16), (16, 32, 16)]:
        tab = chunk_table(1, 40, n, "cpu")
        assert (tab.bt_tile(torch.float32), tab.bt_tile(torch.bfloat16), tab.bt_tile(torch.float16)) == (f32, b16, b16)
    assert query_tile(5, torch.float32) == 32 and query_tile(5) == 16


@pytest.mark.parametrize("n,gate,T,cu", [(1, "mixed", 70, None), (2, "rand", 45, None), (3, None, 30, [0, 1, 23, 30])])
def test_saved_states_give_the_same_gradients_bit_for_bit(n, gate, T, cu, monkeypatch):
    # DPX_KERNEL_SAVE_STATES unset or 1 (the default): the backward takes the forward's h and v_new instead of walking the chunks again;
    # the walk is deterministic, so every output and gradient must equal the recomputing backward's exactly
    from dpx.kernels.delta_product.chunk import keeps_states
    cu_t = None if cu is None else torch.tensor(cu)
    N = None if cu is None else len(cu) - 1
    B = 1 if cu else 2
    q, k, v, beta, g, h0 = make_inputs(B, T, 2, 32, 16, n, gate, N=N)
    outs = {}
    for keep in ("0", "1"):
        monkeypatch.setenv("DPX_KERNEL_SAVE_STATES", keep)
        assert keeps_states(torch.float32, n, 32) == (keep == "1")
        xs = [None if x is None else x.float().clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
        o, ht = chunk_gated_delta_product(*xs[:5], n, initial_state=xs[5], output_final_state=True, cu_seqlens=cu_t)
        ((o.sin()).sum() + (ht ** 2).sum()).backward()
        outs[keep] = [o.detach(), ht.detach()] + [None if x is None else x.grad for x in xs]
    for a, b in zip(outs["0"], outs["1"]):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)


def test_save_states_switch(monkeypatch):
    from dpx.kernels.delta_product.chunk import keeps_states, save_states
    monkeypatch.delenv("DPX_KERNEL_SAVE_STATES", raising=False)
    assert save_states()  # on by default (BENCHMARKS.md session 11: faster, the op's peak memory unchanged)
    monkeypatch.setenv("DPX_KERNEL_SAVE_STATES", "0")
    assert not save_states() and not keeps_states(torch.bfloat16, 2, 128)
    monkeypatch.setenv("DPX_KERNEL_SAVE_STATES", "1")
    assert save_states() and keeps_states(torch.bfloat16, 2, 128) and keeps_states(torch.float32, 3, 64)
    monkeypatch.setenv("DPX_KERNEL_BWD_FP32", "1")  # float32 copies of 16-bit inputs recompute everything
    assert not keeps_states(torch.bfloat16, 2, 128) and keeps_states(torch.float32, 2, 128)
    monkeypatch.delenv("DPX_KERNEL_BWD_FP32")
    assert not keeps_states(torch.float32, 2, 256)  # torch_fp32 backward (head dim > 128)
    monkeypatch.setenv("DPX_KERNEL_FWD", "super")
    assert not keeps_states(torch.bfloat16, 2, 128) and keeps_states(torch.bfloat16, 1, 128)
    monkeypatch.setenv("DPX_KERNEL_SAVE_STATES", "yes")
    with pytest.raises(ValueError, match="DPX_KERNEL_SAVE_STATES"):
        save_states()


def test_inv_autotune_prune_keeps_two_warps_for_bf16_up_to_128():
    # the H200 sweep (session 8) had 2 warps fastest for bf16 at d = 128, n_h 1-3; the autotuner still picked 4 warps
    # once (session 13): the pick is fixed there, the rest keep every config, and a single config is never pruned away
    import triton
    from dpx.kernels.delta_product.wy_fast import _inv_prune, chunk_dp_fwd_kernel_inv
    from dpx.kernels.utils import autotuner
    assert autotuner(chunk_dp_fwd_kernel_inv).early_config_prune is _inv_prune
    cs = [triton.Config({}, num_warps=w, num_stages=1) for w in (2, 4, 8)]
    warps = lambda **kw: [c.num_warps for c in _inv_prune(cs, {}, **kw)]
    assert warps(FAST_INV=True, BK=128) == [2] and warps(FAST_INV=True, BK=32) == [2]
    assert warps(FAST_INV=True, BK=256) == [2, 4, 8]
    assert warps(FAST_INV=False, BK=64) == [2, 4, 8]  # float32 / float16: no sweep says otherwise
    one = [triton.Config({}, num_warps=4, num_stages=1)]
    assert _inv_prune(one, {}, FAST_INV=True, BK=64) == one  # DPX_NO_AUTOTUNE's single config stays

"""The chunk kernel under torch.compile: the custom ops dpx::chunk_dp_fwd / dpx::chunk_dp_bwd (the end of
kernels/delta_product/chunk.py) register and pass torch.library.opcheck, and a function that calls
chunk_gated_delta_product compiles into one graph (fullgraph=True: no break at the kernel) with the eager path's
outputs and gradients. TRITON_INTERPRET=1 on the CPU
(the kernels run in the interpreter; aot_eager, so no C++ compiler is needed); DPX_TEST_CUDA=1 runs them on a GPU.
"""
import os

if not os.environ.get("DPX_TEST_CUDA"):
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton

import pytest
import torch

from test_kernels_reference import make_inputs
from dpx.kernels import chunk_gated_delta_product
from dpx.kernels.delta_product.chunk import CUSTOM_OP_ERROR, chunk_dp_bwd_op, chunk_dp_fwd_op

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # masked exp overflow in numpy
DEVICE = "cuda" if os.environ.get("DPX_TEST_CUDA") else "cpu"


def _inputs(B, T, H, K, V, n, gate, N=None):
    q, k, v, beta, g, h0 = make_inputs(B, T, H, K, V, n, gate, N=N)
    return [None if x is None else x.float().to(DEVICE) for x in (q, k, v, g, beta, h0)]


def test_custom_ops_registered():
    assert CUSTOM_OP_ERROR is None and chunk_dp_fwd_op is not None and hasattr(torch.ops.dpx, "chunk_dp_fwd")


@pytest.mark.parametrize("gate,h0,final,keep", [("rand", True, True, "0"), (None, False, False, "0"),
                                                ("rand", True, True, "1")])
def test_custom_ops_pass_opcheck(gate, h0, final, keep, monkeypatch):
    monkeypatch.setenv("DPX_KERNEL_SAVE_STATES", keep)  # 1: the forward also returns h and v_new (keeps_states)
    q, k, v, g, beta, s0 = _inputs(1, 11, 2, 16, 16, 2, gate)
    s0 = s0 if h0 else None
    args = [x.requires_grad_() if x is not None else None for x in (q, k, v, g, beta, s0)]
    # the forward's T output has only its lower block triangle written (the rest is never read), so the check that
    # compares two runs' outputs element by element (test_aot_dispatch_dynamic) is left to the compile test below
    torch.library.opcheck(chunk_dp_fwd_op, (*args, None, 2, 0.5, final),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    o, ht, t, G, gamma, h, v_new = chunk_dp_fwd_op(*[None if x is None else x.detach() for x in args], None, 2, 0.5,
                                                   final)
    assert (h.numel() > 0) == (keep == "1") and (v_new.numel() > 0) == (keep == "1")
    torch.library.opcheck(chunk_dp_bwd_op, (q.detach(), k.detach(), v.detach(), None if g is None else g.detach(),
                                            beta.detach(), None if s0 is None else s0.detach(), t, G, gamma, h, v_new,
                                            torch.randn_like(o), torch.randn_like(ht) if final else None, None, 2,
                                            0.5))


@pytest.mark.parametrize("n,gate,K,cu,keep", [(2, "rand", 16, None, "0"), (3, "mixed", 20, None, "0"),
                                              (2, "rand", 16, [0, 5, 5, 13], "0"), (3, "mixed", 20, None, "1"),
                                              (2, "rand", 16, [0, 5, 5, 13], "1")])
def test_compiled_function_is_one_graph_and_matches_eager(n, gate, K, cu, keep, monkeypatch):
    # K = 20 runs zero-padded to 32 around the op; cu: varlen with an empty segment (an unbacked chunk count);
    # keep = 1: DPX_KERNEL_SAVE_STATES, the op's h and v_new outputs carried to its backward
    monkeypatch.setenv("DPX_KERNEL_SAVE_STATES", keep)
    cu_t = None if cu is None else torch.tensor(cu, device=DEVICE)
    N = None if cu is None else len(cu) - 1
    B, T = (1, cu[-1]) if cu else (2, 9)
    xs = _inputs(B, T, 2, K, 16, n, gate, N=N)

    def f(q, k, v, g, beta, h0):
        # glue on both sides of the kernel, as in a layer: it must land in the same graph
        o, ht = chunk_gated_delta_product(torch.nn.functional.normalize(q, dim=-1), k, v, g, beta, n, scale=0.4,
                                          initial_state=h0, output_final_state=True, cu_seqlens=cu_t)
        return (o.sin() * 2).sum() + (ht ** 2).sum()

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g)(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    ref_x = [None if x is None else x.clone().requires_grad_() for x in xs]
    got_x = [None if x is None else x.clone().requires_grad_() for x in xs]
    ref = f(*ref_x)
    got = compiled(*got_x)
    assert len(graphs) == 1 and any("chunk_dp_fwd" in str(nd.target) for nd in graphs[0].graph.nodes)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5), (got, ref)
    ref.backward()
    got.backward()
    for name, a, b in zip("q k v g beta h0".split(), ref_x, got_x):
        if a is None:
            continue
        assert b.grad is not None and torch.allclose(b.grad, a.grad, rtol=1e-4, atol=1e-5), name


@pytest.mark.parametrize("family,n", [("gated_deltaproduct", 2), ("deltanet", 1)])
def test_compiled_mixer_is_one_graph_and_matches_eager(family, n, monkeypatch):
    # the delta layer's fused path (one projection GEMM, short convs, norms) around the kernel, compiled whole: the
    # glue runs as its PyTorch forms (the compiler fuses them), the kernel as the custom op
    from dpx.models.config import ModelConfig
    from dpx.models.mixers.delta import DeltaProductMixer
    monkeypatch.setenv("DPX_KERNEL_IMPL", "triton")  # the Triton kernel (interpreter on the CPU), not torch_chunk
    cfg = ModelConfig(family=family, hidden_size=16, num_heads=2, head_dim=8, num_householder=n,
                      allow_neg_eigval=True, use_short_conv=True, use_output_gate=family.startswith("gated"))
    torch.manual_seed(0)
    m = DeltaProductMixer(cfg).to(DEVICE)
    m.fused = True
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g)(gm, example_inputs)

    def loss(mod, x):
        y, _ = mod(x)
        return (y * y).sum()

    torch._dynamo.reset()
    xr, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = loss(m, xr)
    ref.backward()
    g_ref = {k: p.grad.clone() for k, p in m.named_parameters()}
    m.zero_grad(set_to_none=True)
    got = torch.compile(loss, backend=backend, fullgraph=True)(m, xc)
    got.backward()
    assert len(graphs) == 1 and any("chunk_dp_fwd" in str(nd.target) for nd in graphs[0].graph.nodes)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-5)
    assert torch.allclose(xc.grad, xr.grad, rtol=1e-4, atol=1e-5)
    for k, p in m.named_parameters():
        assert torch.allclose(p.grad, g_ref[k], rtol=1e-4, atol=1e-5), k


def test_without_custom_ops_compile_breaks_the_graph_and_still_matches(monkeypatch):
    # a torch that cannot register the ops (CUSTOM_OP_ERROR): compiled code calls the eager path behind a graph break
    from dpx.kernels.delta_product import chunk
    monkeypatch.setattr(chunk, "chunk_dp_fwd_op", None)
    xs = _inputs(1, 9, 2, 16, 16, 2, "rand")

    def f(q, k, v, g, beta, h0):
        o, ht = chunk_gated_delta_product(q, k, v, g, beta, 2, initial_state=h0, output_final_state=True)
        return o.sum() + ht.sum()

    torch._dynamo.reset()
    ref_x = [x.clone().requires_grad_() for x in xs]
    got_x = [x.clone().requires_grad_() for x in xs]
    ref, got = f(*ref_x), torch.compile(f, backend="aot_eager")(*got_x)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5)
    ref.backward()
    got.backward()
    for a, b in zip(ref_x, got_x):
        assert torch.allclose(b.grad, a.grad, rtol=1e-4, atol=1e-5)

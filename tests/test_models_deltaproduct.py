"""DeltaProduct's transition, checked through the layer and the kernels it calls (float64):
explicit product g * prod_j (I - beta_j k_j k_j^T) in execution order, spectral norm <= 1 for unit keys and
beta in [0, 2], two reflections making a 120 degree rotation, identical keys collapsing to one factor."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpx import kernels
from dpx.models import ModelConfig
from dpx.kernels.delta_product.naive import state_trajectory, transition
from dpx.models.mixers.delta import DeltaProductMixer

torch.set_num_threads(1)  # tiny float64 shapes on a shared 2-core box: extra intra-op threads only contend

f64 = torch.float64


def run_kernel_state(k, beta, g=None, S0=None, v=None, impl="naive"):
    """Final state after one token, keys [n, K] (unit), v [n, V] (zeros: read the transition), S0 [K, V]."""
    n, K = k.shape
    V = K if S0 is None else S0.shape[-1]
    S0 = torch.eye(K, dtype=f64) if S0 is None else S0
    v = torch.zeros(n, V, dtype=f64) if v is None else v
    q = torch.randn(1, 1, 1, K, dtype=f64)
    gg = None if g is None else torch.tensor(g, dtype=f64).view(1, 1, 1)
    _, S = kernels.gated_delta_product(q, k.view(1, n, 1, K), v.view(1, n, 1, V), gg, beta.view(1, n, 1),
                                       num_householder=n, initial_state=S0.view(1, 1, K, V),
                                       output_final_state=True, impl=impl)
    return S[0, 0]


def explicit(k, beta, g=0.0):
    """Independent product: later steps multiply on the left."""
    K = k.shape[-1]
    A = torch.eye(K, dtype=f64)
    for j in range(k.shape[0]):
        A = (torch.eye(K, dtype=f64) - beta[j] * torch.outer(k[j], k[j])) @ A
    return math.exp(g) * A


@pytest.mark.parametrize("impl", ["naive", "torch"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_kernel_transition_is_product_in_execution_order(impl, n):
    torch.manual_seed(n)
    k = torch.nn.functional.normalize(torch.randn(n, 5, dtype=f64), dim=-1)
    beta = torch.rand(n, dtype=f64) * 2
    A = explicit(k, beta, -0.3)
    assert torch.allclose(run_kernel_state(k, beta, -0.3, impl=impl), A, atol=1e-12)
    assert torch.allclose(transition(k, torch.tensor(-0.3, dtype=f64), beta), A, atol=1e-12)
    if n > 1:  # order matters: the reversed product is a different matrix
        assert not torch.allclose(explicit(k.flip(0), beta.flip(0), -0.3), A, atol=1e-6)


def test_layer_state_follows_the_explicit_recurrence():
    """The mixer's per-token inputs, fed to S_t = A_t S_{t-1} + sum_j P_{>j} beta_j k_j v_j^T (matrix form, not the
    kernel's loop), give the state the layer returns (chunked kernel path)."""
    torch.manual_seed(0)
    cfg = ModelConfig(family="gated_deltaproduct", hidden_size=16, num_heads=2, head_dim=4, n_h=3,
                      beta_range="[-1,1]", chunk_size=2)
    m = DeltaProductMixer(cfg).double()
    x = torch.randn(1, 5, 16, dtype=f64)
    q, k, v, beta, g, _ = m._inputs(x, {})
    _, state = m(x)
    n, H, K = 3, 2, 4
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)  # the in-kernel l2 norm
    k, v, beta = k.view(1, 5, n, H, K), v.view(1, 5, n, H, -1), beta.view(1, 5, n, H)
    for h in range(H):
        S = torch.zeros(K, K, dtype=f64)
        for t in range(5):
            A = explicit(k[0, t, :, h], beta[0, t, :, h], g[0, t, h].item())
            write = torch.zeros(K, K, dtype=f64)
            for j in range(n):
                P = explicit(k[0, t, j + 1:, h], beta[0, t, j + 1:, h])  # the steps after j
                write = write + P @ (beta[0, t, j, h] * torch.outer(k[0, t, j, h], v[0, t, j, h]))
            S = A @ S + write
        assert torch.allclose(state["S"][0, h], S, atol=1e-10)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 4), K=st.integers(2, 6), seed=st.integers(0, 2 ** 16),
       betas=st.lists(st.floats(0.0, 2.0), min_size=4, max_size=4), g=st.floats(-5.0, 0.0))
def test_transition_norm_at_most_one(n, K, seed, betas, g):
    gen = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(n, K, dtype=f64, generator=gen), dim=-1)
    beta = torch.tensor(betas[:n], dtype=f64)
    A = transition(k, torch.tensor(g, dtype=f64), beta)
    assert torch.linalg.matrix_norm(A, ord=2) <= 1 + 1e-12
    assert torch.allclose(run_kernel_state(k, beta, g), A, atol=1e-12)


def test_two_reflections_make_a_120_degree_rotation():
    k = torch.tensor([[1.0, 0.0], [0.5, math.sqrt(3) / 2]], dtype=f64)
    A = run_kernel_state(k, torch.tensor([2.0, 2.0], dtype=f64))
    c, s = math.cos(2 * math.pi / 3), math.sin(2 * math.pi / 3)
    assert torch.allclose(A, torch.tensor([[c, -s], [s, c]], dtype=f64), atol=1e-12)
    assert torch.allclose(torch.linalg.matrix_power(A, 3), torch.eye(2, dtype=f64), atol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_identical_keys_collapse_to_one_factor(n):
    torch.manual_seed(n)
    K, V = 4, 3
    k1 = torch.nn.functional.normalize(torch.randn(K, dtype=f64), dim=0)
    beta = torch.rand(n, dtype=f64) * 2
    beta_eff = 1 - torch.prod(1 - beta)
    kk = k1.expand(n, K)
    A = run_kernel_state(kk, beta)
    assert torch.allclose(A, torch.eye(K, dtype=f64) - beta_eff * torch.outer(k1, k1), atol=1e-12)
    # with identical values too, the whole update is one delta step with beta_eff
    S0, v = torch.randn(K, V, dtype=f64), torch.randn(V, dtype=f64)
    S_n = run_kernel_state(kk, beta, S0=S0, v=v.expand(n, V))
    S_1 = run_kernel_state(k1[None], beta_eff[None], S0=S0, v=v[None])
    assert torch.allclose(S_n, S_1, atol=1e-12)


def test_beta_range_sets_the_layer_beta():
    torch.manual_seed(0)
    x = torch.randn(2, 7, 16, dtype=f64) * 5
    for rng, hi in (("[0,1]", 1.0), ("[-1,1]", 2.0)):
        m = DeltaProductMixer(ModelConfig(family="deltaproduct", hidden_size=16, num_heads=2, n_h=2,
                                          beta_range=rng)).double()
        with torch.no_grad():
            m.b_proj.weight.normal_(0, 3)
        beta = m._inputs(x, {})[3]
        assert beta.min() >= 0 and beta.max() <= hi and beta.max() > 0.9 * hi


@pytest.mark.parametrize("knobs", [dict(use_short_conv=False), dict(use_output_gate=True, expand_v=2.0),
                                   dict(family="gated_deltanet", n_h=None, conv_size=2)])
def test_layer_knobs_keep_forms_equal(knobs):
    torch.manual_seed(1)
    cfg = dict(family="gated_deltaproduct", hidden_size=16, num_heads=2, head_dim=4, n_h=2, chunk_size=3)
    cfg.update(knobs)
    m = DeltaProductMixer(ModelConfig(**cfg)).double()
    x = torch.randn(2, 8, 16, dtype=f64)
    y_c, s_c = m(x, mode="chunk")
    y_r, s_r = m(x, mode="recurrent")
    assert torch.allclose(y_c, y_r, atol=1e-10) and torch.allclose(s_c["S"], s_r["S"], atol=1e-10)
    assert hasattr(m, "g_proj") == bool(knobs.get("use_output_gate"))
    assert hasattr(m, "q_conv") == cfg.get("use_short_conv", True)


def test_state_trajectory_from_recorded_aux_matches_the_layer():
    torch.manual_seed(2)
    m = DeltaProductMixer(ModelConfig(family="gated_deltaproduct", hidden_size=16, num_heads=2, head_dim=4, n_h=3,
                                      beta_range="[-1,1]")).double()
    m.record = True
    x = torch.randn(2, 6, 16, dtype=f64)
    _, state = m(x)
    a = m.aux
    states = list(state_trajectory(a["k"], a["v"], a["g"], a["beta"]))
    subs = list(state_trajectory(a["k"], a["v"], a["g"], a["beta"], every="substep"))
    assert len(states) == 6 and len(subs) == 18
    assert torch.allclose(states[-1], state["S"], atol=1e-6)  # the kernel l2-normalises with eps; aux keys too
    assert torch.allclose(subs[2], states[0]) and torch.allclose(subs[-1], states[-1])

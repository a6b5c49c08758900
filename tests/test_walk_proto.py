"""benchmarks/walk_proto.py's split-state walk under TRITON_INTERPRET=1 on the CPU: equal to dpx's chunk_dp_fwd_h
(kernels/delta_product/chunk_h.py) and to a float64 loop of the recurrence
    v_new_c = U_c - W_c S;   S = gamma_c S + Kd_c^T v_new_c          (h[c] = S at the chunk start)
on small random inputs: K in {32, 64, 85, 128} (1 or 2 tiles of 64, partial tiles masked), n_h 1 and 2, two
sequences of different lengths, with and without h0 / final state, float32 and float16 (bf16 is wrong under the
interpreter). The Kd-in-the-walk variant is checked bit for bit against the kd variant on dpx's own w, u and the
kd dpx's walks form (walk_proto.kd_tensor). dpx's walk forms Kd from k itself, so the random inputs here are keys k
(kd = k gathered per chunk, no gates) rather than an arbitrary kd.
Outputs are allocated NaN-poisoned, so an element the kernel fails to write fails the comparison.
"""
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton

import pytest  # noqa: E402
import torch  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "walk_proto.py"
sys.path.insert(0, str(SCRIPT.parent))
from dpx_checkout import load_script  # noqa: E402  (benchmarks/: a script by path)
TOL = {torch.float32: 2e-5, torch.float16: 5e-3}  # relative RMS error (test_kernels_triton's)


def _load():
    return load_script(SCRIPT, "dpx_walk_proto")


wp = _load()
from dpx.kernels.delta_product.chunk_h import chunk_dp_fwd_h  # noqa: E402
from dpx.kernels.delta_product.index import BL, chunk_table  # noqa: E402
from test_kernels_reference import poison_empty_tensors  # noqa: E402

LENS = (100, 37)  # two sequences: 2 + 1 chunks at n_h = 1, 4 + 2 at n_h = 2, 5 + 2 at n_h = 3 (last ones partial)


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    poison_empty_tensors(monkeypatch)


def _table(n):
    cu = torch.tensor([0, LENS[0], LENS[0] + LENS[1]])
    return chunk_table(1, sum(LENS), n, "cpu", cu_seqlens=cu)


def loop64(w, u, kd, gamma, h0, tab):
    """The recurrence in float64, per sequence: (h [NC,H,K,V], v_new [NC,H,BL,V], ht [N,H,K,V])."""
    NC, H, _, K = w.shape
    V = u.shape[-1]
    w, u, kd, gamma = w.double(), u.double(), kd.double(), gamma.double()
    h = torch.zeros(NC, H, K, V, dtype=torch.float64)
    v_new = torch.zeros(NC, H, BL, V, dtype=torch.float64)
    ht = torch.zeros(tab.N, H, K, V, dtype=torch.float64)
    sc = tab.seq_chunks.tolist()
    for i in range(tab.N):
        S = torch.zeros(H, K, V, dtype=torch.float64) if h0 is None else h0[i].double().clone()
        for c in range(sc[i], sc[i + 1]):
            h[c] = S
            v_new[c] = u[c] - w[c] @ S
            S = gamma[c][:, None, None] * S + kd[c].transpose(-1, -2) @ v_new[c]
        ht[i] = S
    return h, v_new, ht


def rel(ref, out):
    out = out.double()
    assert torch.isfinite(out).all(), "non-finite values (an unwritten element?)"
    return ((out - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def random_inputs(n, K, V, dtype, with_h0, seed=0):
    tab = _table(n)
    g = torch.Generator().manual_seed(seed)
    H = 2
    rnd = lambda *s: torch.randn(*s, generator=g)
    w = (0.5 * rnd(tab.NC, H, BL, K) / K ** 0.5).to(dtype)
    k = (rnd(tab.NTOK * n, H, K) / K ** 0.5).to(dtype)
    G = torch.zeros(tab.NC, H, BL)  # no gates: Kd = k
    kd = wp.kd_tensor(k, G, tab, False)
    u = rnd(tab.NC, H, BL, V).to(dtype)
    gamma = 0.5 + 0.5 * torch.rand(tab.NC, H, generator=g)
    h0 = rnd(tab.N, H, K, V) if with_h0 else None
    return tab, w, u, k, G, kd, gamma, h0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("states", [False, True], ids=["no_states", "h0_ht"])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("K,BV", [(32, 64), (64, 32), (85, 32), (128, 64)])  # BV = 64 > V = 32: masked V tile
def test_split_walk_matches_dpx_and_float64(K, BV, n, states, dtype):
    V = K
    tab, w, u, k, G, kd, gamma, h0 = random_inputs(n, K, V, dtype, states, seed=K + n)
    prec = "tf32x3" if dtype == torch.float32 else "tf32"
    ref = loop64(w, u, kd, gamma, h0, tab)
    want = chunk_dp_fwd_h(w, u, k, G, gamma, h0, tab, states, dtype, prec, False)
    cfg = next(c for c in wp.CONFIGS if c.kwargs["BV"] == BV)
    with wp.pinned(wp.walk_fwd_h_split, cfg):
        got = wp.walk_fwd_h(w, u, kd, gamma, h0, tab, states, dtype, prec)
    assert got[0].dtype == dtype and got[0].shape == (tab.NC, 2, K, V)
    assert got[1].dtype == u.dtype and got[1].shape == u.shape
    assert (got[2] is None) == (not states)
    cfg = next(c for c in wp.PF_CONFIGS if c.kwargs["BV"] == BV)
    with wp.pinned(wp.walk_fwd_h_split_pf, cfg):
        got_pf = wp.walk_fwd_h_pf(w, u, kd, gamma, h0, tab, states, dtype, prec)
    for name, r, a, b, c in zip(("h", "v_new", "ht"), ref, want, got, got_pf):
        if b is None:
            assert c is None
            continue
        assert b.dtype == a.dtype == c.dtype, name
        assert rel(r, b) < TOL[dtype], (name, rel(r, b))
        assert rel(a, b) < TOL[dtype], (name, rel(a, b))  # dpx's kernel rounds the same intermediates
        assert torch.equal(b, c), name  # the prefetching walk does the same arithmetic


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("n,K", [(1, 85), (2, 128), (3, 64)])  # n_h = 3: 63 steps of 64 rows
def test_kd_in_walk_equals_kd_variant(n, K, gated):
    # dpx's own preparation (inv -> wu) on real keys: W, U, Kd, G, gamma; then the walk from kd and from k, G
    from dpx.kernels.delta_product.wy_fast import chunk_dp_fwd_inv, chunk_dp_fwd_wu
    dtype, H, V = torch.float16, 2, 40
    tab = _table(n)
    g = torch.Generator().manual_seed(n * K)
    k = torch.nn.functional.normalize(torch.randn(tab.NTOK * n, H, K, generator=g), dim=-1).to(dtype)
    v = torch.randn(tab.NTOK * n, H, V, generator=g).to(dtype)
    beta = torch.sigmoid(torch.randn(tab.NTOK * n, H, generator=g)).to(dtype)
    gate = torch.nn.functional.logsigmoid(torch.randn(tab.NTOK, H, generator=g) + 2) if gated else None
    t, G, gamma = chunk_dp_fwd_inv(k, beta, gate, tab)
    w, u = chunk_dp_fwd_wu(k, v, beta, G, t, tab, "tf32")
    kd = wp.kd_tensor(k, G, tab, gated)
    h0 = torch.randn(tab.N, H, K, V, generator=g)
    a = wp.walk_fwd_h(w, u, kd, gamma, h0, tab, True, dtype, "tf32")
    b = wp.walk_fwd_h_k(w, u, k, G if gated else None, gamma, h0, tab, True, dtype, "tf32")
    for name, x, y in zip(("h", "v_new", "ht"), a, b):
        assert torch.isfinite(y).all(), name
        assert torch.equal(x, y), (name, (x.float() - y.float()).abs().max().item())
    ref = loop64(w, u, kd, gamma, h0, tab)
    for name, r, y in zip(("h", "v_new", "ht"), ref, b):
        assert rel(r, y) < TOL[dtype], (name, rel(r, y))

"""benchmarks/out_proto.py's output kernel (fla's layout on dpx's super-chunks) under TRITON_INTERPRET=1 on the CPU.

The prototype takes the place of chunk_super's pair in the super-chunk forward (DPX_KERNEL_FWD=super), and the whole
op is checked against the float64 token loop (test_kernels_triton.run_case: output, final state and every gradient;
the backward is the chunk path's): n_h 2, 3, 4 and 8 (the super-chunk path runs at n_h > 1), gated (random, mixed, exactly zero) and not, 21- and 16-token
chunks (63 / 64 tokens a super-chunk), varlen with a length-1 and an empty segment, a zero-padded head dim, float32
and float16. Outputs are NaN-poisoned before the call (test_kernels_triton's fixture), so an unwritten element fails.
"""
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton

import pytest  # noqa: E402
import torch  # noqa: E402

from test_kernels_triton import poison_empty, run_case  # noqa: E402,F401 (the fixture is autouse there and here)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "out_proto.py"
sys.path.insert(0, str(SCRIPT.parent))
from dpx_checkout import load_script  # noqa: E402  (benchmarks/: a script by path)


def _load():
    return load_script(SCRIPT, "dpx_out_proto")


op = _load()


@pytest.mark.parametrize("n,gate,T,K,V,dtype,cu", [
    (2, "rand", 37, 16, 16, torch.float32, None),
    (2, None, 70, 16, 16, torch.float32, None), (3, "mixed", 50, 16, 16, torch.float32, None),
    (3, "zero", 23, 16, 16, torch.float32, None), (3, None, 45, 16, 16, torch.float32, None),
    (4, "rand", 19, 16, 16, torch.float32, None), (8, "mixed", 21, 16, 16, torch.float32, None),
    (2, "mixed", 31, 16, 16, torch.float32, torch.tensor([0, 1, 18, 18, 31])),
    (3, "rand", 23, 20, 12, torch.float32, None), (3, "rand", 40, 32, 32, torch.float16, None)])
def test_out_tok_in_the_super_chunk_forward(n, gate, T, K, V, dtype, cu, monkeypatch):
    from dpx.kernels.delta_product import chunk_super
    monkeypatch.setenv("DPX_KERNEL_FWD", "super")
    monkeypatch.setenv("DPX_KERNEL_BWD_FP32", "0")
    calls = []

    def tok(q, k, w, u, gamma, G, h0, tab, scale, output_final_state, prec, gated):
        calls.append(1)
        assert gated == (gate is not None)
        return op.fwd_h_o_tok(q, k, w, u, gamma, G, h0, tab, scale, output_final_state, prec, gated)

    monkeypatch.setattr(chunk_super, "chunk_dp_fwd_h_o_super", tok)
    run_case(1 if cu is not None else 2, T, 2, K, V, n, gate, dtype, cu=cu)
    assert calls, "the prototype's kernels did not run"


def test_out_tok_matches_the_super_pair_on_the_same_states():
    # the same walk (chunk_super's), two output kernels: equal up to float32 summation order
    from dpx.kernels.delta_product.chunk_super import chunk_dp_fwd_h_o_super
    from dpx.kernels.delta_product.index import chunk_table
    from dpx.kernels.delta_product.wy_fast import chunk_dp_fwd_prepare
    g = torch.Generator().manual_seed(3)
    n, Bs, T, H, K = 3, 2, 50, 2, 16
    tab = chunk_table(Bs, T, n, "cpu")
    q = torch.randn(Bs * T, H, K, generator=g)
    k = torch.nn.functional.normalize(torch.randn(Bs * T * n, H, K, generator=g), dim=-1)
    v = torch.randn(Bs * T * n, H, K, generator=g)
    beta = 2 * torch.rand(Bs * T * n, H, generator=g)
    gl = torch.nn.functional.logsigmoid(torch.randn(Bs * T, H, generator=g))
    w, u, gamma, G = chunk_dp_fwd_prepare(k, v, beta, gl, tab, "ieee")
    ref, ht_ref = chunk_dp_fwd_h_o_super(q, k, w, u, gamma, G, None, tab, 0.5, True, "ieee", True)
    out, ht = op.fwd_h_o_tok(q, k, w, u, gamma, G, None, tab, 0.5, True, "ieee", True)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(ht, ht_ref)  # the same walk


def test_main_dry_run_writes_its_table(tmp_path):
    # the GPU script's own path (inputs, the four walk/output pairs, the comparison, the JSON) on tiny float32 shapes
    import json
    assert op.main(["--out", str(tmp_path), "--ns", "3", "--gated", "0,1", "--dry-run"]) == 0
    got = json.loads((tmp_path / "out_proto.json").read_text())
    assert [(c["n_h"], c["gated"]) for c in got["cases"]] == [(3, False), (3, True)]
    for c in got["cases"]:
        assert c["tok_vs_default"]["rms_rel"] < 1e-5 and c["super_vs_default"]["rms_rel"] < 1e-5, c
        assert set(c["ms"]) >= {"fwd_h (per chunk)", "fwd_o (per chunk)", "h_super", "o_super", "out_tok"}

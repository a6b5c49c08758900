"""The LM wrapper for every family: logits, decoding with O(1) steps == full forward, states continue a
sequence, aux internals, save/load, init. (The lm-eval adapter's tests are in test_tasks_lm_evals.py.)"""
import pytest
import torch

from dpx.models import ModelConfig, build_model, load_pretrained
from dpx.models.config import FAMILIES

torch.set_num_threads(1)  # tiny float64 shapes on a shared 2-core box: extra intra-op threads only contend


def tiny(family, **kw):
    cfg = dict(family=family, vocab_size=23, hidden_size=16, num_heads=2, num_layers=2, chunk_size=4,
               state_size=4, low_rank_dim=4, expand=1 if family == "mamba2" else 2)
    if family in ("deltaproduct", "gated_deltaproduct"):
        cfg["n_h"] = 2
    cfg.update(kw)
    torch.manual_seed(0)
    m = build_model(cfg).double()
    with torch.no_grad():  # bigger weights than the 0.006 init, so that every path matters numerically
        for p in m.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.3)
    return m


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_steps_match_forward(family):
    m = tiny(family)
    ids = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(1))
    logits = m(ids)
    assert logits.shape == (2, 9, 23) and torch.isfinite(logits).all()
    out = m(ids[:, :5], return_states=True)
    rest = m(ids[:, 5:], state=out.states)
    assert torch.allclose(torch.cat([out.logits, rest], 1), logits, atol=1e-9)
    state, steps = None, []
    for t in range(9):
        lt, state = m.step(ids[:, t], state)
        steps.append(lt)
    assert torch.allclose(torch.stack(steps, 1), logits, atol=1e-9)


def test_aux_exposes_keys_and_beta_per_layer():
    m = tiny("gated_deltaproduct", n_h=3, beta_range="[-1,1]")
    ids = torch.randint(0, 23, (2, 7))
    out = m(ids, return_states=True, return_aux=True)
    assert len(out.states) == 2 and out.states[0]["S"].shape == (2, 2, 8, 8)
    aux = out.aux[1]
    assert aux["k"].shape == (2, 7, 3, 2, 8) and aux["beta"].shape == (2, 7, 3, 2) and aux["g"].shape == (2, 7, 2)
    assert torch.allclose(aux["k"].norm(dim=-1), torch.ones(()).double(), atol=1e-3)  # unit keys
    assert aux["beta"].max() <= 2 and aux["beta"].min() >= 0
    assert all(not mx.record and not mx.aux for mx in m.mixers)  # recording is switched off again


def test_save_load_roundtrip(tmp_path):
    m = tiny("deltaproduct", num_classes=5, matching={"mode": "mlp", "reference": {"n_h": 1}})
    assert m.config.matching.mode == "none" and m.config.intermediate_size is not None  # resolved before building
    m.save_pretrained(tmp_path / "ck")
    m2 = load_pretrained(tmp_path / "ck").double()
    ids = torch.randint(0, 23, (2, 6))
    assert m2.config == m.config
    assert torch.equal(m(ids), m2(ids)) and m(ids).shape == (2, 6, 5)


def test_init_and_tied_head():
    cfg = ModelConfig(family="deltaproduct", vocab_size=1000, hidden_size=64, num_heads=4, num_layers=1)
    m = build_model(cfg)
    assert m.lm_head is None and abs(m.embeddings.weight.std().item() - 0.006) < 3e-4
    assert abs(m.layers[0].attn.q_proj.weight.std().item() - 0.006) < 5e-4
    assert build_model(cfg.replace(tie_embeddings=False)).lm_head is not None

"""The LM wrapper for every family: logits, decoding with O(1) steps == full forward, states continue a
sequence, aux internals, save/load, init; and the lm-eval adapter's scores against a direct computation."""
import math

import pytest
import torch
import torch.nn.functional as F

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


# lm-eval adapter ------------------------------------------------------------------------------------------------
class CharTok:
    eot_token_id = 0

    def encode(self, s):
        return [1 + (ord(c) % 22) for c in s]

    def decode(self, ids):
        return "".join(chr(ord("a") + i) for i in ids)


def test_scoring_functions_match_a_direct_computation():
    from dpx.models.hf import greedy_generate, score_continuations, score_rolling
    m = tiny("gated_deltanet")
    pairs = [([3, 4, 5], [6, 7]), ([1], [2, 3, 4, 5]), ([9, 9, 9, 9, 9, 1], [2])]
    got = score_continuations(m, pairs, batch_size=2)
    for (ctx, cont), (lp, greedy) in zip(pairs, got):
        ids = torch.tensor(ctx + cont)[None]
        logp = F.log_softmax(m(ids)[0], -1)
        want = sum(logp[len(ctx) - 1 + j, c].item() for j, c in enumerate(cont))
        assert math.isclose(lp, want, rel_tol=1e-9)
        assert greedy == all(logp[len(ctx) - 1 + j].argmax().item() == c for j, c in enumerate(cont))
    toks = list(torch.randint(0, 23, (13,)).tolist())
    full = score_continuations(m, [([0], toks)])[0][0]
    assert math.isclose(score_rolling(m, toks, 0, max_length=4), full, rel_tol=1e-9)  # windows carry the state
    gen = greedy_generate(m, [3, 4], 5)
    seq = [3, 4]
    for _ in range(5):
        seq.append(int(m(torch.tensor(seq)[None])[0, -1].argmax()))
    assert gen == seq[2:]


def test_lm_eval_class():
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from dpx.models.hf import DpxLM
    m = tiny("deltaproduct").float()
    lm = DpxLM(m, CharTok(), batch_size=2)
    reqs = [Instance("loglikelihood", {}, ("abc", "de"), 0), Instance("loglikelihood", {}, ("", "xy"), 1)]
    res = lm.loglikelihood(reqs)
    assert len(res) == 2 and all(lp < 0 for lp, _ in res)
    # an empty context conditions on the end-of-text token, exactly what the rolling score does
    (roll,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("xy",), 0)])
    assert math.isclose(roll, res[1][0], rel_tol=1e-5)
    direct = torch.log_softmax(m(torch.tensor([[0] + CharTok().encode("xy")]))[0].double(), -1)
    assert math.isclose(roll, direct[0, CharTok().encode("x")[0]].item() + direct[1, CharTok().encode("y")[0]].item(),
                        rel_tol=1e-5)
    (text,) = lm.generate_until([Instance("generate_until", {}, ("abc", {"until": ["zzz"], "max_gen_toks": 4}), 0)])
    assert isinstance(text, str) and len(text) <= 4

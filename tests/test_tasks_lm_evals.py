"""tasks/lm evaluations against independent float64 references: effective rank of the replayed state, the moving
average, per-position loss, and the lm-eval adapter's scoring; plus the adapter end to end on the shipped local
look-alike tasks (the same code path the real benchmarks take)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpx.tasks.context import RunContext
from dpx.tasks.lm.effective_rank import erank_from_svals, state_eranks
from dpx.tasks.lm.extrapolation import moving_average, per_position_loss
from dpx.tasks.lm.tokenizer import load_tokenizer


def tiny_model(vocab=32000, n_h=2, gated=False, seed=0):
    from dpx.models import build_model
    torch.manual_seed(seed)
    fam = "gated_deltaproduct" if gated else "deltaproduct"
    return build_model({"family": fam, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "head_dim": 8,
                        "num_householder": n_h, "vocab_size": vocab, "allow_neg_eigval": True}).eval()


# ---- effective rank -----------------------------------------------------------------------------------------------
def np_erank(S: np.ndarray) -> float:
    s = np.linalg.svd(S.astype(np.float64), compute_uv=False)
    s = s[s > np.finfo(np.float64).eps]
    if len(s) == 0:
        return 0.0
    p = s / s.sum()
    return float(np.exp(-(p * np.log(p)).sum()))


def test_erank_matches_numpy_and_its_bounds():
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((6, 5)), np.outer(rng.standard_normal(6), rng.standard_normal(5)), np.zeros((6, 5)),
            np.eye(6, 5)]
    got = erank_from_svals(torch.linalg.svdvals(torch.tensor(np.stack(mats)))).numpy()
    np.testing.assert_allclose(got, [np_erank(m) for m in mats], rtol=1e-10, atol=1e-12)
    assert got[1] == pytest.approx(1.0) and got[2] == 0.0 and got[3] == pytest.approx(5.0)
    assert 1.0 <= got[0] <= 5.0


@pytest.mark.parametrize("gated", [False, True])
def test_state_replay_matches_a_float64_loop(gated):
    rng = np.random.default_rng(1)
    T, n, H, K, V = 9, 2, 3, 4, 5
    k = rng.standard_normal((T, n, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, n, H, V))
    beta = rng.uniform(0, 2, (T, n, H))
    g = -rng.uniform(0, 1, (T, H)) if gated else None
    ref = np.zeros((T, H))
    S = np.zeros((H, K, V))
    for t in range(T):
        for h in range(H):
            if gated:
                S[h] *= np.exp(g[t, h])
            for j in range(n):
                S[h] = S[h] + beta[t, j, h] * np.outer(k[t, j, h], v[t, j, h] - S[h].T @ k[t, j, h])
            ref[t, h] = np_erank(S[h])
    t_ = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    got = state_eranks(t_(k), t_(v), t_(beta), None if g is None else t_(g), max_block_elems=2 * H * K * V)
    np.testing.assert_allclose(got.numpy(), ref, rtol=2e-4)
    got2 = state_eranks(t_(k), t_(v), t_(beta), None if g is None else t_(g), stride=3)
    np.testing.assert_allclose(got2.numpy(), ref[2::3], rtol=2e-4)


# ---- extrapolation --------------------------------------------------------------------------------------------------
def test_moving_average_is_centred_mean():
    x = np.random.default_rng(2).standard_normal(40)
    xs, ys = moving_average(x, 5)
    assert len(ys) == 36
    np.testing.assert_allclose(ys, [x[i:i + 5].mean() for i in range(36)])
    np.testing.assert_allclose(xs, np.arange(36) + 3)  # window 1..5 is centred on position 3
    assert len(moving_average(x, 501)[1]) == 1  # window clipped to the curve


def test_per_position_loss_matches_float64_cross_entropy():
    model = tiny_model(vocab=300)
    seqs = torch.randint(0, 300, (3, 17), generator=torch.Generator().manual_seed(0))
    got = per_position_loss(model, seqs, batch_size=2, device=torch.device("cpu"))
    with torch.no_grad():
        logp = torch.log_softmax(model(seqs[:, :-1]).double(), -1)
    ref = -logp.gather(-1, seqs[:, 1:, None])[..., 0].mean(0).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5)


# ---- lm-eval adapter ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dpx_lm():
    pytest.importorskip("lm_eval")
    from dpx.tasks.lm.lm_eval_adapter import DpxLM
    return DpxLM(tiny_model(), load_tokenizer("mistral_v1"), batch_size=3, max_length=12, device="cpu")


def _ref_ll(model, ctx_ids, cont_ids, max_length):
    full = (ctx_ids + cont_ids)[-(max_length + 1):]
    x = torch.tensor([full[:-1]])
    with torch.no_grad():
        logp = torch.log_softmax(model(x).double(), -1)[0]
    n = len(cont_ids)
    lp = logp[len(full) - 1 - n:]
    tgt = torch.tensor(full[-n:])
    return lp.gather(-1, tgt[:, None]).sum().item(), bool((lp.argmax(-1) == tgt).all())


def test_loglikelihood_matches_one_by_one_scoring(dpx_lm):
    rng = np.random.default_rng(3)
    reqs = []
    for L in (3, 9, 5, 14, 1, 7):  # batches mix lengths (right padding); 14 + cont exceeds max_length (truncation)
        ctx = rng.integers(3, 32000, L).tolist()
        cont = rng.integers(3, 32000, int(rng.integers(1, 4))).tolist()
        reqs.append((None, ctx, cont))
    got = dpx_lm._loglikelihood_tokens(reqs)
    for (_, c, t), (ll, greedy) in zip(reqs, got):
        ref_ll, ref_greedy = _ref_ll(dpx_lm.model, c, t, dpx_lm.max_length)
        assert ll == pytest.approx(ref_ll, rel=1e-4, abs=1e-3)
        assert greedy == ref_greedy


def test_rolling_loglikelihood_sums_disjoint_windows(dpx_lm):
    from lm_eval.api.instance import Instance
    text = "The quick brown fox jumps over the lazy dog near the river bank at dawn."
    ids = dpx_lm.tok_encode(text, add_special_tokens=False)
    assert len(ids) > dpx_lm.max_length  # several windows
    got = dpx_lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])[0]
    # reference: the harness's disjoint windows with context_len 1: targets seq[s+1:e+1] of seq = <s> + ids, each
    # window reading the M tokens that end just before its last target
    M, ref = dpx_lm.max_length, 0.0
    seq = [dpx_lm.prefix_token_id] + ids
    for s in range(0, len(ids), M):
        e = min(s + M, len(ids))
        ref += _ref_ll(dpx_lm.model, seq[max(0, e - M):s + 1], seq[s + 1:e + 1], M)[0]
    assert got == pytest.approx(ref, rel=1e-4)
    assert got < 0 and math.isfinite(got)


# ---- torch-only scoring helpers (no lm_eval needed), float64 against direct computations ---------------------------
def tiny_double(vocab=23, seed=0):
    from dpx.models import build_model
    torch.manual_seed(seed)
    m = build_model({"family": "gated_deltaproduct", "vocab_size": vocab, "hidden_size": 16, "num_heads": 2,
                     "num_layers": 2, "num_householder": 2, "allow_neg_eigval": True}).double().eval()
    with torch.no_grad():  # larger weights than the 0.006 init, so that every path matters numerically
        for p in m.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.3)
    return m


def _direct(model, ids, n_cont):
    """sum log p of the last n_cont tokens of ids given the rest, one sequence, float64; and greedy."""
    logp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0], -1)
    tgt = torch.tensor(ids[-n_cont:])
    lp = logp[-n_cont:]
    return lp.gather(-1, tgt[:, None]).sum().item(), bool((lp.argmax(-1) == tgt).all())


def test_score_continuations_float64_with_truncation_and_padding():
    from dpx.tasks.lm.lm_eval_adapter import score_continuations
    m = tiny_double()
    rng = np.random.default_rng(4)
    pairs = [(rng.integers(0, 23, L).tolist(), rng.integers(0, 23, c).tolist())
             for L, c in ((3, 2), (1, 4), (9, 1), (6, 3), (12, 2))]  # 12 + 2 > max_length: cut from the left
    got = score_continuations(m, pairs, batch_size=2, max_length=10)
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        ref_ll, ref_greedy = _direct(m, (ctx + cont)[-11:], len(cont))
        assert ll == pytest.approx(ref_ll, rel=1e-9)
        assert greedy == ref_greedy
    with pytest.raises(ValueError, match="at least one token"):
        score_continuations(m, [([], [1, 2])])
    with pytest.raises(ValueError, match="does not fit max_length 2"):
        score_continuations(m, [([1], [1, 2, 3])], max_length=2)


def test_rolling_windows_are_the_harness_windows():
    pytest.importorskip("lm_eval")
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    from dpx.tasks.lm.lm_eval_adapter import rolling_windows
    for n in (1, 5, 8, 9, 17, 24):
        toks = list(range(10, 10 + n))
        for M in (1, 4, 8):
            ref = [make_disjoint_window(w) for w in get_rolling_token_windows(toks, 1, M, 1)]
            assert rolling_windows(toks, 1, M) == [(list(a), list(b)) for a, b in ref], (n, M)


def test_score_rolling_windows_and_carried_state():
    from dpx.tasks.lm.lm_eval_adapter import score_rolling
    m = tiny_double()
    toks = np.random.default_rng(5).integers(0, 23, 13).tolist()
    seq = [0] + toks
    exact = _direct(m, seq, len(toks))[0]  # the whole document in one pass
    # carried state over windows of 4 == one pass (the recurrence does not care where a window ends)
    assert score_rolling(m, toks, 0, max_length=4, carry_state=True) == pytest.approx(exact, rel=1e-9)
    # disjoint windows: each window of <= 4 read tokens starts from a zero state
    M, ref = 4, 0.0
    for s in range(0, len(toks), M):
        e = min(s + M, len(toks))
        ref += _direct(m, seq[max(0, e - M):e + 1], e - s)[0]
    got = score_rolling(m, toks, 0, max_length=M, batch_size=3)
    assert got == pytest.approx(ref, rel=1e-9)
    assert abs(got - exact) > 1e-6  # the cut context matters, so the two modes are really different
    assert score_rolling(m, toks, 0, max_length=64) == pytest.approx(exact, rel=1e-9)  # one window = exact


def test_greedy_generate_matches_argmax_loop():
    from dpx.tasks.lm.lm_eval_adapter import greedy_generate
    m = tiny_double()
    seq = [3, 4]
    for _ in range(6):
        seq.append(int(m(torch.tensor([seq]))[0, -1].argmax()))
    assert greedy_generate(m, [3, 4], 6) == seq[2:]
    assert greedy_generate(m, [3, 4], 6, stop=lambda ids: len(ids) >= 2) == seq[2:4]


def test_registered_dpx_model_from_a_saved_folder(tmp_path):
    """The harness's own route: `--model dpx --model_args pretrained=DIR,tokenizer=byte,...` builds the adapter
    from a saved model; empty contexts condition on <s>, as the rolling score does; generation stops at `until`."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    from dpx.tasks.lm.lm_eval_adapter import lm_eval_class
    lm_eval_class()
    m = tiny_double(vocab=259)
    m.float().save_pretrained(tmp_path / "ck")
    lm = get_model("dpx").create_from_arg_string(
        f"pretrained={tmp_path / 'ck'},tokenizer=byte,max_length=6,carry_state=true,max_gen_toks=5",
        {"batch_size": 2, "device": "cpu"})
    assert lm.batch_size == 2 and lm.max_length == 6 and lm.carry_state is True and lm.prefix_token_id == 1
    ll = lm.loglikelihood([Instance("loglikelihood", {}, ("ab", "cd"), 0),
                           Instance("loglikelihood", {}, ("", "hello"), 1)])
    ref = m.float()
    tgt = [b + 3 for b in b"hello world"]
    with torch.no_grad():
        direct = torch.log_softmax(ref(torch.tensor([[1] + tgt[:-1]]))[0].double(), -1)
    per_tok = [direct[i, t].item() for i, t in enumerate(tgt)]
    assert ll[1][0] == pytest.approx(sum(per_tok[:5]), rel=1e-5)
    # carried state: the 11-token document over windows of 6 scores like the one pass above
    (roll,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("hello world",), 0)])
    assert roll == pytest.approx(sum(per_tok), rel=1e-5)
    assert ll[0][0] < 0
    (text,) = lm.generate_until([Instance("generate_until", {}, ("abc", {"until": ["zzz"]}), 0)])
    seq = [b + 3 for b in b"abc"]  # greedy by hand: 5 new tokens at most, ending at </s> (2)
    with torch.no_grad():
        while len(seq) < 8 and seq[-1] != 2:
            seq.append(int(ref(torch.tensor([seq]))[0, -1].argmax()))
    assert text == lm.tok.decode([i for i in seq[3:] if i != 2])


def test_adapter_runs_the_table3_tasks_offline(tmp_path):
    pytest.importorskip("lm_eval")
    from dpx.tasks.lm.config import LMEvalOptions
    from dpx.rundir import SIX_TASKS as SIX
    from dpx.tasks.lm.lm_eval_adapter import evaluate
    ctx = RunContext(tmp_path / "run", {"trial_id": "t"}, device="cpu")
    out = evaluate(tiny_model(), load_tokenizer("mistral_v1"), LMEvalOptions(local=True, limit=3, batch_size=8),
                   ctx, context_len=32)
    for k in ("wikitext_ppl", "lambada_ppl", *SIX, "avg_acc"):
        assert k in out and math.isfinite(out[k]), k
    assert out["avg_acc"] == pytest.approx(sum(out[k] for k in SIX) / 6)
    assert all(0.0 <= out[k] <= 1.0 for k in SIX)
    assert out["wikitext_ppl"] > 1000  # an untrained 32k-vocab model is close to uniform
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("lm_eval/avg_acc") == 1


def test_adapter_offline_on_hub_tasks_fails_with_one_line(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from dpx.tasks.lm.config import LMEvalOptions
    from dpx.tasks.lm.lm_eval_adapter import evaluate
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    ctx = RunContext(tmp_path / "run", {"trial_id": "t"}, device="cpu")
    with pytest.raises(RuntimeError) as e:
        evaluate(tiny_model(), load_tokenizer("mistral_v1"), LMEvalOptions(tasks=["piqa"], limit=2), ctx)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("task.lm_eval: ") and "data_dir" in msg

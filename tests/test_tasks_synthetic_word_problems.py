"""Word problems: group enumeration and composition against independent references, sequence format, metrics
against brute force, config validation, and the task end to end (training, curves, figure, resume)."""
from __future__ import annotations

import functools
import itertools
import json

import numpy as np
import pytest
import torch

from dpx.tasks import TASKS
from dpx.tasks.context import Preempted, RunContext
from dpx.tasks.word_problems import groups
from dpx.tasks.word_problems.config import WordProblemConfig
from dpx.tasks.word_problems.data import WordProblemData, encode
from dpx.tasks.word_problems.metrics import PrefixAccuracy, evaluate, max_len_at
from dpx.tasks.word_problems.probe import beta_per_element, cumulative_explained_variance


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models on a shared 2-core box


def perm_matrix(p):
    """M(p) v = v[p] as a matrix: M[i, p[i]] = 1. Then (a*b) with (a*b)[i] = a[b[i]] has M(a*b) = M(b) @ M(a)."""
    m = np.zeros((len(p), len(p)), dtype=int)
    m[np.arange(len(p)), p] = 1
    return m


@pytest.mark.parametrize("name,order", [("S3", 6), ("S4", 24), ("A5", 60), ("S5", 120)])
def test_group_elements_and_table(name, order):
    els = groups.elements(name)
    n = int(name[1])
    assert len(els) == order == len(set(els))
    assert els[0] == tuple(range(n))  # identity first
    s_n = list(itertools.permutations(range(n)))
    idx = [s_n.index(p) for p in els]
    assert idx == sorted(idx)  # in S_n's lexicographic order (A5: the even ones, in S5 order)
    if name == "A5":
        assert all(np.linalg.det(perm_matrix(p)) > 0 for p in els)
    t = groups.table(name)
    for i, j in itertools.product(range(order), repeat=2):
        if (i * 7 + j) % 5 and order > 24:  # subsample the big tables
            continue
        assert (perm_matrix(els[t[i, j]]) == perm_matrix(els[j]) @ perm_matrix(els[i])).all()
    for row in t:  # closure with inverses: every row (and column) is a permutation of the group
        assert sorted(row) == list(range(order))
    assert sorted(t[:, 5]) == list(range(order))


def test_s3_convention_by_hand():
    # elements of S3 in the authors' order; (a*b)[i] = a[b[i]]
    assert groups.elements("S3") == ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))
    t = groups.table("S3")
    a, b = (0, 2, 1), (1, 2, 0)
    assert groups.elements("S3")[t[1, 3]] == (a[b[0]], a[b[1]], a[b[2]]) == (2, 1, 0)
    assert t[1, 3] != t[3, 1]  # non-abelian


def test_running_products_and_encoding():
    cfg = WordProblemConfig(group="A5", train_len=10, test_len=12)
    rng = np.random.default_rng(0)
    words = rng.integers(0, 60, size=(5, 10))
    x, y = encode(cfg, words)
    els = groups.elements("A5")
    assert x.shape == y.shape == (5, 11)
    assert (x[:, 0] == cfg.bos_id).all() and (y[:, 0] == cfg.bos_id).all() and cfg.bos_id == 61
    assert (x[:, 1:] == words).all()
    for b in range(5):
        for t in range(1, 11):
            prod = functools.reduce(lambda p, q: tuple(p[q[i]] for i in range(5)), [els[w] for w in words[b, :t]])
            assert els[y[b, t]] == prod


def test_data_is_a_function_of_seed_and_position(tmp_path):
    cfg = WordProblemConfig(group="S4", train_len=6, test_len=9)
    d1, d2 = WordProblemData(cfg, 3, 4, 2), WordProblemData(cfg, 3, 4, 2)
    assert (d1.train_batch(5, 1)[0] == d2.train_batch(5, 1)[0]).all()
    assert not (d1.train_batch(5, 1)[0] == d1.train_batch(5, 0)[0]).all()
    assert not (d1.train_batch(5, 1)[0] == WordProblemData(cfg, 4, 4, 2).train_batch(5, 1)[0]).all()
    # eval sets do not depend on the trial seed
    assert (d1.eval_set("test", 7)[0] == WordProblemData(cfg, 99, 4, 2).eval_set("test", 7)[0]).all()
    assert d1.eval_set("test", 7)[0].shape == (7, 10) and d1.eval_set("val", 7)[0].shape == (7, 7)


def test_fixed_pool_visits_every_word_once_per_epoch(tmp_path):
    cfg = WordProblemConfig(group="S3", train_len=12, test_len=12, num_train_samples=24, cache_dir=str(tmp_path))
    d = WordProblemData(cfg, 0, micro_batch=4, grad_accum=2)  # 8 words per step, 3 steps per epoch
    pool = {tuple(w) for w in d.pool}
    for epoch in range(2):
        seen = [tuple(row[1:]) for s in range(3 * epoch, 3 * epoch + 3) for m in range(2)
                for row in d.train_batch(s, m)[0]]
        assert sorted(seen) == sorted(tuple(w) for w in d.pool.astype(np.int64)) and set(seen) == pool
    assert list(tmp_path.glob("*.npy"))  # cached
    d2 = WordProblemData(cfg, 0, micro_batch=4, grad_accum=2)
    assert (d2.pool == d.pool).all()


def test_prefix_accuracy_against_brute_force():
    rng = np.random.default_rng(1)
    acc = PrefixAccuracy()
    preds_all, labels_all = [], []
    for B in (5, 3):
        labels = torch.from_numpy(rng.integers(0, 4, size=(B, 9)))
        preds = labels.clone()
        flip = torch.from_numpy(rng.random((B, 9)) < 0.15)
        preds[flip] = (preds[flip] + 1) % 4
        logits = torch.nn.functional.one_hot(preds, 4).float()
        acc.update(logits, labels)
        preds_all += preds.tolist()
        labels_all += labels.tolist()
    ref = [np.mean([all(p[s] == l[s] for s in range(t + 1)) for p, l in zip(preds_all, labels_all)])
           for t in range(9)]
    assert np.allclose(acc.acc_at_pos(), ref)
    assert (np.diff(acc.acc_at_pos()) <= 0).all()
    tok = np.mean([p[s] == l[s] for p, l in zip(preds_all, labels_all) for s in range(1, 9)])
    assert acc.token_acc() == pytest.approx(tok)
    curve = np.array([1.0, 0.99, 0.95, 0.9, 0.85, 0.2])
    assert max_len_at(curve) == 3 and max_len_at(curve, 0.99) == 1 and max_len_at(np.array([1.0, 0.5])) == 0


def test_evaluate_splits_a_batch_that_runs_out_of_memory():
    # a model that "runs out of GPU memory" above 3 sequences a batch: same counts as one pass, in smaller batches
    rng = np.random.default_rng(2)
    x = rng.integers(0, 5, size=(23, 7))
    y = np.where(rng.random((23, 7)) < 0.8, x, (x + 1) % 5)
    sizes = []

    def model(xb):
        sizes.append(len(xb))
        if len(xb) > 3:
            raise torch.OutOfMemoryError("CUDA out of memory (test)")
        return torch.nn.functional.one_hot(xb, 5).float()  # predicts its input

    got = evaluate(model, x, y, batch_size=16, device="cpu")
    ref = PrefixAccuracy()
    ref.update(torch.nn.functional.one_hot(torch.from_numpy(x), 5).float(), torch.from_numpy(y))
    assert got.n == 23 and np.array_equal(got.acc_at_pos(), ref.acc_at_pos()) and got.token_acc() == ref.token_acc()
    assert sizes[:3] == [16, 8, 4] and max(sizes[3:]) <= 2  # halved until it fit, then kept there

    def never_fits(xb):
        raise torch.OutOfMemoryError("CUDA out of memory (test)")
    with pytest.raises(torch.OutOfMemoryError):
        evaluate(never_fits, x, y, batch_size=4, device="cpu")


@pytest.mark.parametrize("bad,key", [
    (dict(group="S6"), "group"), (dict(group="s4"), "group"), (dict(train_len=0), "train_len"),
    (dict(test_len=-3), "test_len"), (dict(train_len=128, test_len=64), "test_len"),
    (dict(num_train_samples=-1), "num_train_samples"),
])
def test_bad_task_config(bad, key):
    with pytest.raises(ValueError, match=rf"^{key}: "):
        WordProblemConfig(**bad)


def test_did_you_mean_and_vocab_check():
    with pytest.raises(ValueError, match=r"did you mean 'S4'"):
        WordProblemConfig(group="S44")
    cfg = WordProblemConfig(group="S5")
    assert cfg.vocab_size == 127 and cfg.bos_id == 121
    with pytest.raises(ValueError, match=r"^model\.vocab_size: 100 cannot hold"):
        cfg.check_model({"vocab_size": 100})
    cfg.check_model({"vocab_size": 122})
    assert TASKS["word_problem"].config_cls() is WordProblemConfig


def tiny_config(**train):
    return {
        "seed": 0,
        "model": {"family": "deltaproduct", "vocab_size": 13, "hidden_size": 32, "num_heads": 2, "num_layers": 1,
                  "num_householder": 2, "allow_neg_eigval": True, "use_short_conv": False},
        "task": {"name": "word_problem", "group": "S3", "train_len": 6, "test_len": 10, "val_samples": 64},
        "train": {"steps": 8, "batch_size": 16, "lr": 3e-3, "eval_every": 4, "log_every": 2,
                  "checkpoint_every": 4, **train},
        "eval": {"num_samples": 48, "batch_size": 32, "probe": False},
    }


def test_probe_pieces_against_references():
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.normal(size=(8, 3)))[0]  # points in a 3-D subspace of R^8
    pts = rng.normal(size=(200, 3)) @ basis.T + 5.0
    cv = cumulative_explained_variance(pts)
    assert cv[2] == pytest.approx(1.0) and cv[1] < 0.99 and (np.diff(cv) >= -1e-12).all()
    iso = cumulative_explained_variance(rng.normal(size=(20000, 4)))
    assert np.allclose(iso, [0.25, 0.5, 0.75, 1.0], atol=0.02)
    tokens = rng.integers(0, 5, 300)
    beta = rng.random((300, 2)) * 2
    b = beta_per_element(tokens, beta, 6)
    for e in range(5):
        assert np.allclose(b[e], beta[tokens == e].mean(0))
    assert np.isnan(b[5]).all()


def test_task_end_to_end_writes_curve_figure_and_summary(tmp_path):
    cfg = tiny_config()
    cfg["eval"]["probe"] = True
    ctx = RunContext(tmp_path, cfg)
    out = TASKS["word_problem"].run_fn()(cfg, ctx)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["value"]) for r in rows if r["key"] == "acc_at_pos"]
    assert [s for s, _ in curve] == list(range(1, 11))
    vals = [v for _, v in curve]
    assert all(a >= b for a, b in zip(vals, vals[1:]))
    assert out["acc_at_train_len"] == pytest.approx(vals[5])
    assert out["seq_acc"] == pytest.approx(vals[-1])
    assert out["max_len_acc90"] == max_len_at(np.array([1.0] + vals))
    assert 0 <= out["token_acc"] <= 1 and out["tokens_per_s"] > 0 and out["num_params"] > 0
    assert out["train/steps"] == 8 and "val/seq_acc" in out
    assert (tmp_path / "figures" / "acc_vs_position.png").stat().st_size > 1000
    assert any(r["key"] == "val/seq_acc" and r["step"] == 4 for r in rows)
    # the Fig. 7 probe: per head betas in [0, 2] per element and step, PCA curves ending at 1
    for h in range(2):
        assert 0 <= out[f"probe/l0/h{h}/beta_mean"] <= 2 and 0 < out[f"probe/l0/h{h}/pca3"] <= 1 + 1e-9
        betas = [r for r in rows if r["key"] == f"probe/beta/l0/h{h}/j1"]
        assert [r["step"] for r in betas] == list(range(6))
        pca = [r["value"] for r in rows if r["key"] == f"probe/pca_cumvar/l0/h{h}"]
        assert len(pca) == 16 and pca[-1] == pytest.approx(1.0)
    assert "probe/rotation_heads" in out and (tmp_path / "figures" / "probe_layer0.png").exists()


def test_task_preempt_and_resume_matches_uninterrupted(tmp_path):
    ref = TASKS["word_problem"].run_fn()(tiny_config(), RunContext(tmp_path / "ref", {}))
    cfg = tiny_config()

    class StopAt5(RunContext):  # SIGTERM arriving during step 5 (polled before each step)
        calls = 0

        def should_stop(self):
            self.calls += 1
            return self.calls > 5

    with pytest.raises(Preempted, match="step 5"):
        TASKS["word_problem"].run_fn()(cfg, StopAt5(tmp_path / "cut", cfg))
    out = TASKS["word_problem"].run_fn()(cfg, RunContext(tmp_path / "cut", cfg, attempt=2))
    assert out["acc_at_train_len"] == ref["acc_at_train_len"] and out["token_acc"] == ref["token_acc"]

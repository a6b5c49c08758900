"""Formal languages: generators checked by decoding each sample and evaluating it with Python's own arithmetic,
the next-token framing, scaled accuracy, config validation, and the task end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dpx.tasks import TASKS
from dpx.tasks.context import RunContext
from dpx.tasks.formal_languages.config import FormalLanguageConfig
from dpx.tasks.formal_languages.languages import frame, generate
from dpx.tasks.formal_languages.task import Scorer, scaled


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models on a shared 2-core box


@pytest.mark.parametrize("lo,hi", [(3, 40), (40, 256)])
def test_parity(lo, hi):
    seq, pos, ans = generate("parity", np.random.default_rng(0), 300, lo, hi)
    assert pos.min() + 1 >= lo and pos.max() + 1 <= hi and len(set(pos.tolist())) > 10
    for s, p, a in zip(seq, pos, ans):
        bits = s[:p]
        assert set(bits.tolist()) <= {1, 2} and (s[p + 1:] == 0).all()
        assert s[p] == a == 1 + (bits == 2).sum() % 2


MOD_ARITH = {1: "+", 2: "-", 3: "*", 4: "="}


@pytest.mark.parametrize("lo,hi", [(3, 40), (40, 256)])
def test_mod_arith_against_python_eval(lo, hi):
    seq, pos, ans = generate("mod_arith", np.random.default_rng(1), 300, lo, hi)
    S = pos + 1
    assert (S % 2 == 1).all() and S.min() >= lo - 1 and S.max() <= hi
    assert S.min() == (3 if lo == 3 else 39) and S.max() >= hi - 20
    ops = set()
    for s, p, a in zip(seq, pos, ans):
        text = "".join(MOD_ARITH.get(int(t), str(int(t) - 5)) for t in s[:p])
        assert text.endswith("=") and text.count("=") == 1
        ops |= set(text) & set("+-*")
        assert a == s[p] == 5 + eval(text[:-1]) % 5  # Python: * before + and -, left to right
    assert ops == {"+", "-", "*"}


@pytest.mark.parametrize("mult", [False, True])
def test_mod_arith_brackets_against_python_eval(mult):
    seq, pos, ans = generate("mod_arith_brackets", np.random.default_rng(2), 300, 3, 60, mult=mult)
    sym = {5: "+", 6: "-", 7: "*", 8: "(", 9: ")", 10: "="}
    ops = set()
    for s, p, a in zip(seq, pos, ans):
        S = p + 2  # ... = r [PAD]
        assert 5 <= S <= 60 and s[p] == a and s[p + 1] == 11 and (s[p + 1:] == 11).all()
        text = "".join(sym.get(int(t), str(int(t))) for t in s[:p])
        assert text.endswith("=") and len(text) == S - 2
        ops |= set(text) & set("+*")
        assert a == eval(text[:-1]) % 5
        assert text.count("(") == text.count(")")
    assert ("*" in ops) == mult


def test_framing_masks_and_targets_one_position():
    seq, pos, ans = generate("parity", np.random.default_rng(3), 50, 3, 20)
    x, y = frame(seq, pos, ans)
    assert x.shape == y.shape == (50, pos.max())
    for b in range(50):
        tgt = np.nonzero(y[b] >= 0)[0]
        assert tgt.tolist() == [pos[b] - 1] and y[b, pos[b] - 1] == ans[b]
        assert (x[b, : pos[b]] == seq[b, : pos[b]]).all()  # the prompt is intact
        if pos[b] < x.shape[1]:
            assert x[b, pos[b]] == 0  # the answer itself is masked


def test_scorer_and_scaled_accuracy():
    y = torch.tensor([[-1, 2, -1], [-1, -1, 1], [1, -1, -1], [-1, -1, 2]])
    pred = torch.tensor([[0, 2, 0], [0, 0, 2], [1, 0, 0], [2, 2, 2]])
    sc = Scorer()
    sc.update(torch.nn.functional.one_hot(pred, 3).float(), y, np.array([3, 4, 2, 4]))
    assert sc.acc == 0.75 and sc.by_len == {3: [1, 1], 4: [1, 2], 2: [1, 1]}
    assert scaled(0.75, 0.5) == 0.5 and scaled(0.2, 0.2) == 0.0 and scaled(1.0, 0.2) == 1.0
    assert FormalLanguageConfig(language="parity").chance == 0.5
    assert FormalLanguageConfig(language="mod_arith").chance == pytest.approx(0.2)
    assert [FormalLanguageConfig(language=lang).vocab_size for lang in ("parity", "mod_arith",
                                                                          "mod_arith_brackets")] == [3, 10, 12]


@pytest.mark.parametrize("bad,key", [
    (dict(language="parityy"), "language"), (dict(train_min_len=0), "train_min_len"),
    (dict(test_max_len=-1), "test_max_len"), (dict(train_max_len=100, test_max_len=50, test_min_len=40), "test_max_len"),
    (dict(train_min_len=30, train_max_len=20), "train_max_len"), (dict(modulus=1), "modulus"),
])
def test_bad_config(bad, key):
    with pytest.raises(ValueError, match=rf"^{key}: "):
        FormalLanguageConfig(**bad)
    with pytest.raises(ValueError, match="did you mean 'parity'"):
        FormalLanguageConfig(language="parityy")
    with pytest.raises(ValueError, match=r"^model\.vocab_size: 10 cannot hold"):
        FormalLanguageConfig(language="mod_arith_brackets").check_model({"vocab_size": 10})


def test_task_end_to_end(tmp_path):
    cfg = {
        "seed": 1,
        "model": {"family": "deltanet", "vocab_size": 3, "hidden_size": 32, "num_heads": 2, "num_layers": 1,
                  "allow_neg_eigval": True},
        "task": {"name": "formal_language", "language": "parity", "train_max_len": 12, "test_min_len": 12,
                 "test_max_len": 24, "val_samples": 32},
        "train": {"steps": 6, "batch_size": 16, "lr": 3e-3, "eval_every": 3, "log_every": 3},
        "eval": {"num_samples": 64, "batch_size": 32},
    }
    out = TASKS["formal_language"].run_fn()(cfg, RunContext(tmp_path, cfg))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    curve = {r["step"]: r["value"] for r in rows if r["key"] == "acc_at_len"}
    assert curve and min(curve) >= 12 and max(curve) <= 24
    assert out["scaled_acc"] == pytest.approx((out["acc"] - 0.5) / 0.5)
    assert -1 <= out["scaled_acc"] <= 1 and out["train/steps"] == 6 and "val/scaled_acc" in out
    assert (tmp_path / "figures" / "acc_vs_length.png").exists()

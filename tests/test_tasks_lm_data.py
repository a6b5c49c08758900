"""tasks/lm data path: tokenizers, text sources (shipped, local files, hub offline), packing and exact resume,
config validation. Fast, CPU, no model."""
from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import pytest

from dpx.tasks.lm import sources
from dpx.tasks.lm.config import LMConfig, check_vocab
from dpx.tasks.lm.packing import PackedStream, Prefetcher, take_sequences
from dpx.tasks.lm.sources import DatasetUnavailable, ListSource, format_row, open_source
from dpx.tasks.lm.tokenizer import ByteTokenizer, encode_document, load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("mistral_v1")


# ---- tokenizers ------------------------------------------------------------------------------------------------------
def test_mistral_v1_is_the_papers_vocabulary(tok):
    assert (tok.vocab_size, tok.unk_id, tok.bos_id, tok.eos_id) == (32000, 0, 1, 2)
    text = "Hello world, this is a test.\n  def f(x): return x ü 😀"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < 32000 for i in ids)
    # byte fallback: an emoji becomes <0x..> pieces, not <unk>
    assert tok.unk_id not in ids
    assert tok.sp.id_to_piece(tok.encode("world")[0]) == "▁world"


def test_byte_tokenizer_round_trip_and_ids():
    bt = ByteTokenizer()
    text = "naïve — 漢字 ok"
    ids = bt.encode(text)
    assert ids == [b + 3 for b in text.encode("utf-8")]
    assert bt.decode(ids) == text and max(ids) < bt.vocab_size == 259
    assert encode_document(bt, "ab") == [1, ord("a") + 3, ord("b") + 3]


# ---- sources ----------------------------------------------------------------------------------------------------------
def test_authors_formatting():
    assert format_row({"query": "Who?", "answer": "Me"}, "trivia") == "Question: Who?, Answer: Me"
    assert format_row({"problem": "1+1", "solution": "2"}, "math") == "Problem: 1+1, Solution: 2"
    assert format_row({"content": "x = 1", "repo": "r"}, "auto") == "x = 1"
    with pytest.raises(ValueError, match="text_format"):
        format_row({"foo": 1}, "auto")


@pytest.mark.parametrize("name", ["botchan", "pystdlib", "chatterbot_qa", "math_synth"])
def test_offline_corpora_are_real_text_and_split_disjointly(name):
    tr = open_source(name, "train", seed=0, val_fraction=0.05)
    va = open_source(name, "validation", seed=0, val_fraction=0.05)
    docs_tr, docs_va = list(tr.iter_docs()), list(va.iter_docs())
    assert len(docs_va) >= 1 and len(docs_tr) > len(docs_va)
    assert not set(docs_va) & set(docs_tr) or name == "chatterbot_qa"  # the source repeats a few Q/A pairs
    assert sum(len(d) for d in docs_tr) > 10_000
    # the split depends on val_seed only; the training order on seed and epoch
    assert list(open_source(name, "validation", seed=5, val_fraction=0.05).iter_docs()) == docs_va
    assert sorted(open_source(name, "train", seed=1, val_fraction=0.05).iter_docs()) == sorted(docs_tr)
    if name == "botchan":
        assert "Gutenberg" not in "".join(docs_tr + docs_va)  # licence wrapper stripped
        assert list(tr.iter_docs(epoch=1)) != docs_tr


def test_local_jsonl_parquet_and_text_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [{"query": f"q{i}", "answer": f"a{i}"} for i in range(30)]
    with gzip.open(tmp_path / "t.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows[:20]) + "\n")
    pq.write_table(pa.Table.from_pylist(rows[20:]), tmp_path / "t.parquet")
    # a hub name with local files keeps the hub's formatting (trivia_qa -> "Question: .., Answer: ..")
    kw = dict(data_files=[str(tmp_path / "t.jsonl.gz"), str(tmp_path / "*.parquet")], val_fraction=0.1)
    docs = list(open_source("trivia_qa", "train", **kw).iter_docs()) + \
        list(open_source("trivia_qa", "validation", **kw).iter_docs())
    assert sorted(docs) == sorted(f"Question: q{i}, Answer: a{i}" for i in range(30))
    (tmp_path / "a.txt").write_text("plain text file")
    assert list(open_source("local", "train", data_files=[str(tmp_path / "a.txt")], val_fraction=0).iter_docs()) \
        == ["plain text file"]
    with pytest.raises(FileNotFoundError, match="data_files"):
        open_source("local", "train", data_files=[str(tmp_path / "missing*.jsonl")])


def test_hub_dataset_offline_fails_with_one_clear_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DatasetUnavailable) as e:
        open_source("fineweb", "train")
    msg = str(e.value)
    assert "\n" not in msg
    assert "HuggingFaceFW/fineweb (sample-10BT)" in msg and "task.data_files" in msg and "botchan" in msg


# ---- packing ----------------------------------------------------------------------------------------------------------
def _docs(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{int(x)}" for x in rng.integers(0, 50, rng.integers(1, 30))) for _ in range(n)]


def test_packing_matches_a_plain_concatenation():
    bt = ByteTokenizer()
    docs = _docs()
    flat = np.concatenate([encode_document(bt, d) for d in docs])
    L, stride = 33, 32
    seqs = take_sequences(ListSource("t", docs, 0, shuffle=False), bt, L, 10_000, stride=stride)
    n = (len(flat) - L) // stride + 1
    ref = np.stack([flat[i * stride:i * stride + L] for i in range(n)])
    np.testing.assert_array_equal(seqs, ref)
    assert (seqs[:, 1:] != 0).all()


def test_shuffle_buffer_permutes_the_same_sequences():
    bt = ByteTokenizer()
    src = ListSource("t", _docs(60), 0, shuffle=False)
    plain = PackedStream(src, bt, 17, seed=3, loop=False).next_batch(10_000)
    shuf = PackedStream(src, bt, 17, seed=3, shuffle_buffer=8, loop=False).next_batch(10_000)
    assert Counter(map(bytes, plain)) == Counter(map(bytes, shuf))
    assert not np.array_equal(plain, shuf)
    again = PackedStream(src, bt, 17, seed=3, shuffle_buffer=8, loop=False).next_batch(10_000)
    np.testing.assert_array_equal(shuf, again)  # deterministic by seed


@pytest.mark.parametrize("shuffle_buffer", [0, 16])
def test_stream_resumes_exactly_across_epochs(shuffle_buffer):
    bt = ByteTokenizer()

    def make():
        return PackedStream(ListSource("t", _docs(25), seed=7), bt, 41, stride=40, seed=11,
                            shuffle_buffer=shuffle_buffer)

    a = make()
    a.next_batch(7)
    state = a.state_dict()
    rest = a.next_batch(150)  # runs over several passes of the 25 documents
    assert a.epoch >= 2
    b = make()
    b.load_state_dict(state)
    np.testing.assert_array_equal(b.next_batch(150), rest)
    with pytest.raises(ValueError, match="context_len"):
        PackedStream(ListSource("t", _docs(3), 0), bt, 9).load_state_dict(state)


def test_prefetcher_hands_out_the_stream_and_its_exact_state():
    bt = ByteTokenizer()

    def make():
        return PackedStream(ListSource("t", _docs(25), seed=1), bt, 21, stride=20, seed=2, shuffle_buffer=8)

    plain = make()
    ref = [plain.next_batch(3) for _ in range(40)]
    pre = Prefetcher(make(), 3, depth=5)
    got = [pre.next_batch() for _ in range(10)]
    state = pre.state_dict()  # the producer is ahead by up to 5 batches; the state is that of batch 10
    got += [pre.next_batch() for _ in range(30)]
    pre.close()
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(a, b)
    again = Prefetcher(make(), 3)
    again.load_state_dict(state)
    for a in ref[10:20]:
        np.testing.assert_array_equal(again.next_batch(), a)
    again.close()


def test_prefetcher_raises_the_producers_error():
    pre = Prefetcher(PackedStream(ListSource("empty", [], 0), ByteTokenizer(), 8), 2)
    with pytest.raises(ValueError, match="no documents"):
        pre.next_batch()


def test_empty_split_is_an_error():
    with pytest.raises(ValueError, match="no documents"):
        PackedStream(ListSource("empty", [], 0), ByteTokenizer(), 8).next_batch(1)


# ---- config -----------------------------------------------------------------------------------------------------------
def test_config_validation_names_the_key():
    with pytest.raises(ValueError, match=r"^dataset: .*did you mean 'fineweb'"):
        LMConfig(dataset="finewebb")
    with pytest.raises(ValueError, match=r"^tokens_per_step: "):
        LMConfig(context_len=1000, tokens_per_step=4096)
    with pytest.raises(ValueError, match=r"^lm_eval.tasks: "):
        LMConfig(lm_eval={"tasks": ["mmlu"]})
    with pytest.raises(ValueError, match=r"^data_files: "):
        LMConfig(dataset="local")
    assert LMConfig(name="lm_eval").evals == ["lm_eval"]


def test_tokenizer_vocab_mismatch_is_a_validation_error():
    check_vocab({"tokenizer": "mistral_v1"}, {"vocab_size": 32000})
    check_vocab({"tokenizer": "byte"}, {"vocab_size": 259})
    with pytest.raises(ValueError, match=r"^model.vocab_size: 32000 does not match tokenizer byte \(259 ids\)"):
        check_vocab({"tokenizer": "byte"}, {"vocab_size": 32000})
    with pytest.raises(ValueError, match=r"^model.vocab_size: "):
        check_vocab({"tokenizer": "mistral_v1"}, {"vocab_size": 50257})


def test_shipped_tokenizer_is_mistral_commons_file():
    import hashlib
    from dpx.tasks.lm.tokenizer import MISTRAL_V1
    digest = hashlib.sha256(MISTRAL_V1.read_bytes()).hexdigest()
    assert digest == "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055"  # data/NOTICE.md
    assert digest in (MISTRAL_V1.parent / "NOTICE.md").read_text()


def test_shipped_files_are_small():
    total = sum(p.stat().st_size for p in sources.DATA_DIR.iterdir())
    assert total < 5 * 2**20

"""Tokenizers: the Mistral v1 SentencePiece model (the paper's vocabulary) and a byte-level fallback.

`mistral_v1` is `tokenizer.model.v1` of the mistral-common wheel (32,000 pieces, <unk>=0, <s>=1, </s>=2, byte
fallback), shipped in tasks/lm/data/ so nothing is fetched at run time. `byte` maps each UTF-8 byte b to b + 3
behind the same three specials: any text, no file, no sentencepiece, 259 ids. Documents are encoded with <s> and
without </s> (the authors' `add_bos_token=True, add_eos_token=False`).
"""
from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
MISTRAL_V1 = DATA_DIR / "mistral_v1.model"


class ByteTokenizer:
    name = "byte"
    vocab_size = 259
    unk_id, bos_id, eos_id = 0, 1, 2
    OFFSET = 3

    def encode(self, text: str) -> list[int]:
        return [b + self.OFFSET for b in text.encode("utf-8")]

    def decode(self, ids) -> str:
        return bytes(i - self.OFFSET for i in ids if i >= self.OFFSET).decode("utf-8", errors="replace")

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]


class SentencePieceTokenizer:
    def __init__(self, path: str | Path, name: str | None = None):
        try:
            import sentencepiece as spm
        except ImportError as e:  # a bare node without sentencepiece can still run `tokenizer: byte`
            raise RuntimeError("task.tokenizer: the sentencepiece package is not installed "
                               "(pip install sentencepiece, or use tokenizer: byte)") from e
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"task.tokenizer: no SentencePiece model at {path}")
        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        self.name = name or path.name
        self.vocab_size = self.sp.vocab_size()
        self.unk_id, self.bos_id, self.eos_id = self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts)  # C++ loop over the batch

    def decode(self, ids) -> str:
        return self.sp.decode([int(i) for i in ids])


def load_tokenizer(spec: str = "mistral_v1"):
    """'mistral_v1' | 'byte' | path to a SentencePiece .model file."""
    if spec == "byte":
        return ByteTokenizer()
    if spec == "mistral_v1":
        return SentencePieceTokenizer(MISTRAL_V1, "mistral_v1")
    return SentencePieceTokenizer(spec)


def encode_document(tok, text: str) -> list[int]:
    """One document: <s> + its tokens (no </s>), as the paper's pre-processing."""
    return [tok.bos_id] + tok.encode(text)


def encode_documents(tok, texts: list[str]) -> list[list[int]]:
    """encode_document for a batch (SentencePiece encodes a list in one call)."""
    return [[tok.bos_id] + ids for ids in tok.encode_batch(texts)]

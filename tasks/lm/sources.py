"""Text sources behind one interface: `open_source(...) -> DocSource`, whose `iter_docs(epoch, start)` yields the
documents (strings) of one split in a fixed order, from document `start` of pass `epoch` (exact resume).

Three kinds:
- hub data sets of the paper, read lazily with `datasets` (streaming), formatted as the authors did;
- local Parquet / JSONL / text files (`data_files`), with the same formatting (this is how a machine without the
  hub points a recipe at its own copy of FineWeb, CodeParrot, ...);
- offline corpora that ship with dpx or that it makes: `botchan` (a public-domain novel), `pystdlib` (the running
  interpreter's standard library source, the CodeParrot stand-in), `chatterbot_qa` (question/answer pairs, the
  TriviaQA stand-in), `math_synth` (generated "Problem: ..., Solution: ..." arithmetic and algebra, the
  OpenThoughts-math stand-in), and `mixed` (all four).

Finite sources split documents into train / validation with a permutation seeded by `val_seed` (the authors'
2357) and reorder the training documents every pass with `seed + epoch`. Hub streams keep their order; the
chunk-level shuffle buffer in packing.py mixes them (as flame's streaming loader does).
"""
from __future__ import annotations

import glob
import gzip
import itertools
import json
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .tokenizer import DATA_DIR


class DatasetUnavailable(RuntimeError):
    """A hub data set could not be opened (offline, missing package, gated). The message is one line."""


@dataclass(frozen=True)
class HubSpec:
    path: str
    config: str | None
    split: str
    fmt: str
    val_path: str | None = None  # a separate data set that is the validation split (CodeParrot)
    val_split: str | None = None  # a validation split of the same data set


HUB = {
    "fineweb": HubSpec("HuggingFaceFW/fineweb", "sample-10BT", "train", "text"),
    "fineweb_100bt": HubSpec("HuggingFaceFW/fineweb", "sample-100BT", "train", "text"),
    "codeparrot": HubSpec("codeparrot/codeparrot-train-v2-near-dedup", None, "train", "content",
                          val_path="codeparrot/codeparrot-valid-v2-near-dedup"),
    "trivia_qa": HubSpec("sentence-transformers/trivia-qa", None, "train", "trivia"),
    "openthoughts_math": HubSpec("open-r1/openthoughts-114k-math", None, "train", "math"),
    "slimpajama": HubSpec("DKYoon/SlimPajama-6B", None, "train", "text", val_split="validation"),
}
BUILTIN_FMT = {"botchan": "text", "pystdlib": "content", "chatterbot_qa": "trivia", "math_synth": "math",
               "mixed": "text"}


# ---- formatting: a row of the data set -> one document string ---------------------------------------------------
def format_row(row: dict, fmt: str) -> str:
    """The authors' text formatting (ssmworkbench/text_datamodule.py)."""
    if fmt == "auto":
        fmt = guess_format(row)
    if fmt == "text":
        return row["text"]
    if fmt == "content":
        return row["content"]
    if fmt == "trivia":
        return f"Question: {row['query']}, Answer: {row['answer']}"
    if fmt == "math":
        return f"Problem: {row['problem']}, Solution: {row['solution']}"
    raise ValueError(f"text_format: unknown format {fmt!r}")


def guess_format(row: dict) -> str:
    for fmt, keys in (("text", ("text",)), ("content", ("content",)), ("trivia", ("query", "answer")),
                      ("math", ("problem", "solution"))):
        if all(k in row for k in keys):
            return fmt
    raise ValueError(f"text_format: cannot tell which field holds the text among {sorted(row)}; "
                     "set task.text_format")


# ---- local files ----------------------------------------------------------------------------------------------------
def expand_files(patterns: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in patterns:
        hits = sorted(glob.glob(str(Path(p).expanduser())))
        if not hits:
            raise FileNotFoundError(f"task.data_files: no file matches {p!r}")
        out += [Path(h) for h in hits]
    return out


def read_rows(path: Path) -> Iterator[dict]:
    """Rows of a .parquet / .jsonl / .json / .txt file (optionally .gz); a text file is one row {"text": ...}."""
    name = path.name.removesuffix(".gz")
    opener = gzip.open if path.name.endswith(".gz") else open
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq  # pyarrow: only Parquet files need it
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=1024):
            yield from batch.to_pylist()
    elif name.endswith((".jsonl", ".json")):
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)
    elif name.endswith((".txt", ".py", ".md")):
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            yield {"text": f.read(), "content": None}
    else:
        raise ValueError(f"task.data_files: unsupported file type {path.name!r} (parquet, jsonl, json, txt)")


# ---- sources ----------------------------------------------------------------------------------------------------------
class DocSource:
    """Documents of one split. `finite` sources know their length and are reshuffled every pass."""
    finite = True
    name = ""

    def iter_docs(self, epoch: int = 0, start: int = 0) -> Iterator[str]:
        raise NotImplementedError


class ListSource(DocSource):
    """A finite list of documents; items are strings or zero-argument callables (read lazily)."""

    def __init__(self, name: str, docs: list, seed: int, shuffle: bool = True):
        self.name, self.docs, self.seed, self.shuffle = name, docs, seed, shuffle

    def __len__(self) -> int:
        return len(self.docs)

    def order(self, epoch: int) -> list[int]:
        idx = list(range(len(self.docs)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(idx)
        return idx

    def iter_docs(self, epoch: int = 0, start: int = 0) -> Iterator[str]:
        for i in self.order(epoch)[start:]:
            d = self.docs[i]
            yield d() if callable(d) else d


class StreamSource(DocSource):
    """A hub data set read with `datasets` streaming; one pass is the whole stream (epochs repeat it)."""
    finite = False

    def __init__(self, name: str, open_fn: Callable[[], object], fmt: str, skip: int = 0, take: int = 0):
        self.name, self.open_fn, self.fmt, self.skip, self.take = name, open_fn, fmt, skip, take

    def iter_docs(self, epoch: int = 0, start: int = 0) -> Iterator[str]:
        rows = iter(self.open_fn())
        stop = self.skip + self.take if self.take else None
        for row in itertools.islice(rows, self.skip + start, stop):
            yield format_row(row, self.fmt)


def _split(name: str, docs: list, split: str, seed: int, val_fraction: float, val_seed: int) -> ListSource:
    idx = list(range(len(docs)))
    random.Random(val_seed).shuffle(idx)
    n_val = max(1, round(val_fraction * len(docs))) if val_fraction > 0 and len(docs) > 1 else 0
    keep = sorted(idx[:n_val]) if split == "validation" else sorted(idx[n_val:])
    return ListSource(name, [docs[i] for i in keep], seed, shuffle=split == "train")


def open_source(dataset: str, split: str = "train", *, data_files: list[str] | None = None, text_format: str = "auto",
                seed: int = 0, val_fraction: float = 0.01, val_seed: int = 2357, val_docs: int = 200,
                max_docs: int = 0) -> DocSource:
    """The documents of `split` ('train' | 'validation') of a named data set or of local files."""
    if split not in ("train", "validation"):
        raise ValueError(f"split: must be train or validation, got {split!r}")
    if data_files:
        fmt = text_format if text_format != "auto" else (HUB[dataset].fmt if dataset in HUB else
                                                          BUILTIN_FMT.get(dataset, "auto"))
        docs = [format_row(r, fmt) for p in expand_files(data_files) for r in read_rows(p)]
        docs = docs[:max_docs] if max_docs else docs
        return _split(dataset, docs, split, seed, val_fraction, val_seed)
    if dataset in BUILTIN_FMT:
        docs = builtin_documents(dataset)
        docs = docs[:max_docs] if max_docs else docs
        return _split(dataset, docs, split, seed, val_fraction, val_seed)
    if dataset in HUB:
        return _hub_source(dataset, split, text_format, val_docs, max_docs)
    raise ValueError(f"dataset: {dataset!r} needs task.data_files (local files)")


def _hub_source(dataset: str, split: str, text_format: str, val_docs: int, max_docs: int) -> StreamSource:
    spec = HUB[dataset]
    fmt = spec.fmt if text_format == "auto" else text_format
    path, hub_split, skip, take = spec.path, spec.split, 0, max_docs
    if split == "validation":
        if spec.val_path:
            path = spec.val_path
        elif spec.val_split:
            hub_split = spec.val_split
        else:
            take = min(val_docs, max_docs) if max_docs else val_docs  # the head of the stream
    elif not (spec.val_path or spec.val_split):
        skip = val_docs

    def open_fn():
        return load_hub(dataset, path, spec.config, hub_split)

    src = StreamSource(dataset, open_fn, fmt, skip=skip, take=take)
    # fail now, with one line, rather than deep inside training: open the stream and read one row
    try:
        next(iter(open_fn()))
    except DatasetUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - whatever `datasets` raises offline (ConnectionError, HfHubHTTPError, ...)
        raise _unavailable(dataset, path, spec.config, e) from None
    return src


def load_hub(dataset: str, path: str, config: str | None, split: str):
    try:
        import datasets  # datasets: only hub sources need it (heavy, and absent on bare nodes)
    except ImportError as e:
        raise _unavailable(dataset, path, config, e) from None
    try:
        return datasets.load_dataset(path, config, split=split, streaming=True)
    except Exception as e:  # noqa: BLE001
        raise _unavailable(dataset, path, config, e) from None


def _unavailable(dataset: str, path: str, config: str | None, e: BaseException) -> DatasetUnavailable:
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
    name = path + (f" ({config})" if config else "")
    return DatasetUnavailable(
        f"task.dataset: cannot load {dataset} = {name} from the Hugging Face hub ({type(e).__name__}: {reason}); "
        f"offline, point the recipe at local files with task.data_files: [/path/*.parquet or *.jsonl] "
        f"(same fields, formatting kept) or use an offline data set ({', '.join(BUILTIN_FMT)})")


# ---- offline corpora ----------------------------------------------------------------------------------------------
def builtin_documents(name: str) -> list:
    if name == "botchan":
        return botchan_documents()
    if name == "pystdlib":
        return pystdlib_documents()
    if name == "chatterbot_qa":
        return chatterbot_documents()
    if name == "math_synth":
        return math_synth_documents()
    if name == "mixed":
        return botchan_documents() + chatterbot_documents() + math_synth_documents(4000) + pystdlib_documents()
    raise ValueError(f"dataset: unknown offline data set {name!r}")


def botchan_documents(lines_per_doc: int = 40) -> list[str]:
    """The novel's text (Project Gutenberg header and licence removed) in passages of `lines_per_doc` lines: the
    shipped file has no paragraph breaks, so passages of fixed size stand in for documents."""
    with gzip.open(DATA_DIR / "botchan.txt.gz", "rt", encoding="utf-8-sig") as f:
        lines = f.read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("*** START OF")) + 1
    end = next(i for i, l in enumerate(lines) if l.startswith(("*** END OF", "End of Project Gutenberg")))
    body = [l for l in lines[start:end]]
    return ["\n".join(body[i:i + lines_per_doc]) for i in range(0, len(body), lines_per_doc)]


def pystdlib_documents(max_bytes: int = 256_000) -> list:
    """Every .py file of this interpreter's standard library (tests, idlelib and site-packages excluded), one
    document each, read lazily, ordered by relative path. Differs between Python versions (3.11 here)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "turtledemo"}
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)  # prune: never walk site-packages
        for fn in filenames:
            p = Path(dirpath) / fn
            if fn.endswith(".py") and p.stat().st_size <= max_bytes:
                files.append(p)
    files.sort(key=lambda p: p.relative_to(root).parts)

    def reader(p: Path):
        return lambda: p.read_text(encoding="utf-8", errors="replace")

    return [reader(p) for p in files]


def chatterbot_documents() -> list[str]:
    with gzip.open(DATA_DIR / "chatterbot_qa.jsonl.gz", "rt", encoding="utf-8") as f:
        return [format_row(json.loads(l), "trivia") for l in f if l.strip()]


def math_synth_documents(n: int = 20000, seed: int = 0) -> list[str]:
    """Generated problems with worked solutions, formatted "Problem: ..., Solution: ..." like OpenThoughts-math.
    Fixed by `seed` (the same corpus on every machine)."""
    rng = random.Random(seed)
    seen: dict[str, None] = {}  # unique problems, in generation order, so a split never repeats one
    while len(seen) < n:
        seen.setdefault(format_row(_math_problem(rng), "math"))
    return list(seen)


def _math_problem(rng: random.Random) -> dict:
    kind = rng.randrange(4)
    if kind == 0:  # multi-step arithmetic with the steps written out
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
        ab = a * b
        return {"problem": f"Compute {a} * {b} - {c}.",
                "solution": f"First {a} * {b} = {ab}. Then {ab} - {c} = {ab - c}. The answer is {ab - c}."}
    if kind == 1:  # a linear equation
        x, a, b = rng.randint(-20, 20), rng.randint(2, 12), rng.randint(-50, 50)
        c = a * x + b
        sb = f"+ {b}" if b >= 0 else f"- {-b}"
        return {"problem": f"Solve {a}x {sb} = {c} for x.",
                "solution": (f"Subtract {b} from both sides" if b >= 0 else f"Add {-b} to both sides")
                + f": {a}x = {c - b}. Divide by {a}: x = {x}. The answer is {x}."}
    if kind == 2:  # remainders
        a, m = rng.randint(10, 9999), rng.randint(2, 13)
        q, r = divmod(a, m)
        return {"problem": f"What is the remainder when {a} is divided by {m}?",
                "solution": f"{a} = {m} * {q} + {r}, so the remainder is {r}. The answer is {r}."}
    n = rng.randint(3, 40)  # sums of an arithmetic sequence
    return {"problem": f"Find the sum of the integers from 1 to {n}.",
            "solution": f"The sum 1 + 2 + ... + n equals n(n + 1)/2. With n = {n} this is {n} * {n + 1} / 2 = "
                        f"{n * (n + 1) // 2}. The answer is {n * (n + 1) // 2}."}

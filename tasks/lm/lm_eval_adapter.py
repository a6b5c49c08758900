"""Our LM inside lm-evaluation-harness (Table 3: wikitext, lambada_openai, piqa, hellaswag, winogrande, arc_easy,
arc_challenge; zero-shot) and the six-task average. The one lm-eval adapter of dpx.

`DpxLM` is a `TemplateLM`, registered with the harness as "dpx" on first use:

    lm_eval --model dpx --model_args pretrained=RUN_DIR,tokenizer=mistral_v1 --tasks lambada_openai
    DpxLM(model, tok, ...) in Python; `evaluate(model, tok, LMEvalOptions, ctx)` is what the `lm` task runs

The harness does the prompts, the context/continuation split and the metrics; we score token sequences.
Scoring follows HFLM: the input is (context + continuation)[-(max_length + 1):][:-1] and the log-probabilities
of the last len(continuation) logits are summed; `is_greedy` says every continuation token is the argmax.
Rolling log-likelihood (wikitext) uses the harness's disjoint windows of `max_length` tokens with <s> as the prefix
token; with `carry_state` the recurrent state flows from window to window instead, which scores the whole document
exactly (a recurrent model reads any length in O(max_length) memory; not the paper's protocol). Sequences are
right-padded within a batch, which a causal model never sees. `generate_until` decodes greedily with O(1) steps.

The scoring functions need only torch; lm_eval is imported when the class or `evaluate` is first used.

Offline: `local=True` runs each task on the look-alike JSONL shipped in tasks/lm/data/ (`data_dir` on local copies
of the real files): a generated task YAML `include`s the harness's own YAML (same prompts, same metrics) and only
swaps the dataset for `dataset_path: json|parquet` with `data_files`.
"""
from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from dpx.rundir import (ARC_C_ACC_NORM, ARC_E_ACC, AVG_ACC, HELLASWAG_ACC_NORM, LAMBADA_ACC, LAMBADA_PPL, PIQA_ACC,
                        SIX_TASKS, WIKITEXT_PPL, WINOGRANDE_ACC)
from dpx.tasks.training.loop import autocast

from .config import LMEvalOptions
from .saved import load_model
from .tokenizer import DATA_DIR, load_tokenizer

# harness metric -> our summary key (dpx.rundir; the extra keys beside the paper's columns are ours alone)
METRICS = {
    "wikitext": {"word_perplexity": WIKITEXT_PPL, "bits_per_byte": "wikitext_bpb"},
    "lambada_openai": {"perplexity": LAMBADA_PPL, "acc": LAMBADA_ACC},
    "piqa": {"acc": PIQA_ACC, "acc_norm": "piqa_acc_norm"},
    "hellaswag": {"acc_norm": HELLASWAG_ACC_NORM, "acc": "hellaswag_acc"},
    "winogrande": {"acc": WINOGRANDE_ACC},
    "arc_easy": {"acc": ARC_E_ACC, "acc_norm": "arc_e_acc_norm"},
    "arc_challenge": {"acc_norm": ARC_C_ACC_NORM, "acc": "arc_c_acc"},
}
HARNESS_YAML = {"wikitext": "wikitext/wikitext.yaml", "lambada_openai": "lambada/lambada_openai.yaml",
                "piqa": "piqa/piqa.yaml", "hellaswag": "hellaswag/hellaswag.yaml",
                "winogrande": "winogrande/default.yaml", "arc_easy": "arc/arc_easy.yaml",
                "arc_challenge": "arc/arc_challenge.yaml"}


# ---- scoring (torch only) -----------------------------------------------------------------------------------------
def _logp(logits: torch.Tensor) -> torch.Tensor:
    # at least float32 (bf16 autocast logits), float64 stays float64 (the tests' references)
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


@torch.no_grad()
def score_continuations(model, pairs, batch_size: int = 16, max_length: int = 2048,
                        device: str | torch.device = "cpu") -> list[tuple[float, bool]]:
    """(context ids, continuation ids) pairs -> (sum of log p(continuation | context), continuation is greedy).

    HFLM's truncation: the model reads (context + continuation)[-(max_length + 1):][:-1]. Long inputs first, so
    equal lengths batch together and an out-of-memory shows up at once."""
    device = torch.device(device)
    items = []
    for i, (ctx_ids, cont_ids) in enumerate(pairs):
        if not ctx_ids or not cont_ids:
            raise ValueError("score_continuations: context and continuation need at least one token each (the "
                             "harness puts the prefix token in an empty context)")
        if len(cont_ids) > max_length:
            raise ValueError(f"score_continuations: a continuation of {len(cont_ids)} tokens does not fit "
                             f"max_length {max_length}; raise task.lm_eval.max_length")
        full = (list(ctx_ids) + list(cont_ids))[-(max_length + 1):]
        items.append((i, full[:-1], len(cont_ids), full[-len(cont_ids):]))
    out: list = [None] * len(items)
    items.sort(key=lambda it: -len(it[1]))
    for s in range(0, len(items), batch_size):
        chunk = items[s:s + batch_size]
        inp = torch.zeros(len(chunk), max(len(it[1]) for it in chunk), dtype=torch.long)
        for r, (_, x, _, _) in enumerate(chunk):
            inp[r, :len(x)] = torch.tensor(x)
        with autocast(device):
            logits = model(inp.to(device))
        logp = _logp(logits)
        for r, (i, x, n, cont) in enumerate(chunk):
            lp = logp[r, len(x) - n:len(x)]
            tgt = torch.tensor(cont, device=lp.device)
            out[i] = (lp.gather(-1, tgt[:, None]).sum().item(), bool((lp.argmax(-1) == tgt).all()))
    return out


def rolling_windows(tokens: list[int], prefix_id: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """The harness's get_rolling_token_windows(context_len=1) + make_disjoint_window, without lm_eval: windows of
    at most max_length predicted tokens; the first conditions on the prefix token, each later one on the tokens
    before it, up to max_length read in all."""
    out, M, n = [], max_length, len(tokens)
    seq = [prefix_id] + list(tokens)  # seq[i] predicts tokens[i]
    for s in range(0, n, M):
        e = min(s + M, n)
        out.append((seq[max(0, e - M):s + 1], tokens[s:e]))
    return out


@torch.no_grad()
def score_rolling(model, tokens: list[int], prefix_id: int, max_length: int = 2048, batch_size: int = 16,
                  device: str | torch.device = "cpu", carry_state: bool = False) -> float:
    """log p(tokens | prefix) of a whole document. Default: the harness's disjoint windows (each reads at most
    max_length tokens, the context before a window is cut). carry_state: the recurrent state crosses windows, so
    the result is the exact full-document log-likelihood."""
    if not tokens:
        return 0.0
    if not carry_state:
        return sum(ll for ll, _ in score_continuations(model, rolling_windows(tokens, prefix_id, max_length),
                                                       batch_size, max_length, device))
    device = torch.device(device)
    seq = [prefix_id] + list(tokens)
    total, state = 0.0, None
    for s in range(0, len(seq) - 1, max_length):
        inp = torch.tensor(seq[s:s + max_length])[None].to(device)
        tgt = torch.tensor(seq[s + 1:s + 1 + max_length], device=device)
        with autocast(device):
            res = model(inp, state=state, return_states=True)
        state = res.states
        total += _logp(res.logits[0, :len(tgt)]).gather(-1, tgt[:, None]).sum().item()
    return total


@torch.no_grad()
def greedy_generate(model, context: list[int], max_new_tokens: int, stop=None,
                    device: str | torch.device = "cpu") -> list[int]:
    """Greedy decoding: prefill with the full-sequence form, then one O(1) `step` per token.
    stop(new ids) -> True ends early."""
    device = torch.device(device)
    with autocast(device):
        res = model(torch.tensor(context)[None].to(device), return_states=True)
    nxt = int(res.logits[0, -1].argmax())
    state, new = res.states, [nxt]
    while len(new) < max_new_tokens and not (stop and stop(new)):
        with autocast(device):
            logits, state = model.step(torch.tensor([nxt], device=device), state)
        nxt = int(logits[0].argmax())
        new.append(nxt)
    return new


# ---- the lm_eval class (created on first use) -----------------------------------------------------------------------
def _tokenizer(tok):
    """A dpx tokenizer, its spec ('mistral_v1' | 'byte' | path to a .model file), or any encode/decode object."""
    return load_tokenizer(tok) if isinstance(tok, (str, Path)) else tok


def _flag(v) -> bool:
    return v if isinstance(v, bool) else str(v).strip().lower() in ("1", "true", "yes")


@functools.cache
def lm_eval_class():
    try:
        from lm_eval.api.model import TemplateLM  # lm_eval: heavy and optional, loaded on first use
        from lm_eval.api.registry import register_model
    except ImportError as e:
        raise RuntimeError("task.lm_eval: lm-evaluation-harness is not installed (pip install lm-eval)") from e

    @register_model("dpx")
    class DpxLM(TemplateLM):
        """pretrained: a LanguageModel, a save_pretrained folder or an lm trial's run dir; tokenizer: a dpx
        tokenizer, its spec, or any object with encode/decode (eos_id / eot_token_id, bos_id if it has one)."""

        def __init__(self, pretrained, tokenizer="mistral_v1", batch_size: int | str = 16,
                     max_length: int | str = 2048, device=None, add_bos: bool | str = False,
                     carry_state: bool | str = False, max_gen_toks: int | str = 256, dtype: str | None = None,
                     eot_token_id: int | None = None, **_):
            super().__init__()
            if isinstance(pretrained, (str, Path)):
                pretrained = load_model(str(pretrained), device or "cpu")
            self._device = torch.device(device) if device is not None else next(pretrained.parameters()).device
            self.model = pretrained.to(self._device)
            if dtype:
                self.model = self.model.to(getattr(torch, dtype))
            self.model.eval()
            self.tok = _tokenizer(tokenizer)
            # "auto" (the harness's batch-size search) is not supported: a fixed default instead
            self.batch_size = 16 if str(batch_size).startswith("auto") else int(batch_size)
            self.max_length, self.max_gen_toks = int(max_length), int(max_gen_toks)
            self.add_bos, self.carry_state = _flag(add_bos), _flag(carry_state)
            eot = eot_token_id if eot_token_id is not None else getattr(self.tok, "eos_id",
                                                                        getattr(self.tok, "eot_token_id", 0))
            self._eot = int(eot() if callable(eot) else eot)

        # ---- tokenisation ------------------------------------------------------------------------------------
        @property
        def eot_token_id(self) -> int:
            return self._eot

        @property
        def prefix_token_id(self) -> int:
            bos = getattr(self.tok, "bos_id", None)  # what HFLM uses for a tokenizer with a BOS token
            return self._eot if bos is None else int(bos)

        def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
            ids = list(self.tok.encode(string))
            if add_special_tokens if add_special_tokens is not None else self.add_bos:
                ids = [self.prefix_token_id] + ids
            return ids

        def tok_decode(self, ids) -> str:
            return self.tok.decode(list(ids))

        @property
        def device(self):
            return self._device

        # ---- scoring -----------------------------------------------------------------------------------------
        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
            """requests: [(cache_key, context_ids, continuation_ids)] -> [(sum logprob, is_greedy)]."""
            return score_continuations(self.model, [(c, t) for _, c, t in requests], self.batch_size,
                                       self.max_length, self._device)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
            return [score_rolling(self.model, self.tok_encode(r.args[0], add_special_tokens=False),
                                  self.prefix_token_id, self.max_length, self.batch_size, self._device,
                                  self.carry_state) for r in requests]

        def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
            outs = []
            for r in requests:
                context, kw = r.args
                until = kw.get("until", [])
                until = [until] if isinstance(until, str) else list(until)
                n = int(kw.get("max_gen_toks", self.max_gen_toks))

                def stop(ids):
                    return ids[-1] == self.eot_token_id or any(u in self.tok_decode(ids) for u in until)
                ctx_ids = self.tok_encode(context)[-self.max_length:] or [self.prefix_token_id]
                ids = greedy_generate(self.model, ctx_ids, n, stop, self._device)
                text = self.tok_decode([i for i in ids if i != self.eot_token_id])
                for u in until:
                    text = text.split(u)[0]
                outs.append(text)
            return outs

    return DpxLM


def __getattr__(name: str):
    if name == "DpxLM":
        return lm_eval_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- local task files -----------------------------------------------------------------------------------------
def task_dir(tasks: list[str], local: bool = False, data_dir: str | Path | None = None) -> tuple[Path, dict[str, str]]:
    """One YAML per task that `include`s the harness's own YAML (same prompts, metrics, splits), so a TaskManager
    need not index the harness's thousands of tasks. With `local` or `data_dir` the data set is swapped for
    `<task>.jsonl|parquet` from data_dir (default: the shipped look-alikes). Returns the folder and
    {our task: harness task name}."""
    import lm_eval.tasks as lt  # lm_eval: heavy and optional, loaded on first use
    root = Path(lt.__file__).resolve().parent
    out = Path(tempfile.mkdtemp(prefix="dpx_lm_eval_"))
    names = {}
    for t in tasks:
        text = f"include: {root / HARNESS_YAML[t]}\ntag: []\n"
        name = t
        if local or data_dir:
            if data_dir:
                hits = [Path(data_dir) / f"{t}{ext}" for ext in (".jsonl", ".json", ".parquet")]
                hits = [h for h in hits if h.exists()]
                if not hits:
                    raise FileNotFoundError(f"task.lm_eval.data_dir: no {t}.jsonl or {t}.parquet in {data_dir}")
                f = hits[0]
            else:
                f = DATA_DIR / f"lm_eval_{t}.jsonl"
            name = f"{t}_dpx_local"
            # every split the harness may ask for points at the one file
            splits = {s: str(f.resolve()) for s in ("train", "validation", "test")}
            text += (f"dataset_path: {'parquet' if f.suffix == '.parquet' else 'json'}\ndataset_name: null\n"
                     f"dataset_kwargs:\n  data_files: {json.dumps(splits)}\n")
        (out / f"{name}.yaml").write_text(text + f"task: {name}\n")
        names[t] = name
    return out, names


def evaluate(model, tok, opts: LMEvalOptions, ctx, context_len: int = 2048) -> dict:
    """Run the harness; summary keys as in dpx.rundir (wikitext_ppl, lambada_ppl, ..., avg_acc)."""
    DpxLM = lm_eval_class()  # noqa: N806 - the class, made on first use
    import lm_eval  # lm_eval: heavy and optional, loaded on first use
    from lm_eval.tasks import TaskManager

    if opts.local or opts.data_dir:
        # the json/parquet builders need no hub; keep `datasets` from trying it
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    inc, names = task_dir(opts.tasks, opts.local, opts.data_dir or None)
    tm = TaskManager(include_path=str(inc), include_defaults=False)  # indexing every harness task takes a minute
    lm = DpxLM(model, tok, batch_size=opts.batch_size, max_length=opts.max_length or context_len,
               device=ctx.device, add_bos=opts.add_bos, carry_state=opts.carry_state)
    model.eval()
    try:
        res = lm_eval.simple_evaluate(model=lm, tasks=list(names.values()), task_manager=tm, num_fewshot=0,
                                      limit=opts.limit or None, bootstrap_iters=0, log_samples=False,
                                      random_seed=42, numpy_random_seed=42, torch_random_seed=42,
                                      fewshot_random_seed=42)
    except Exception as e:  # noqa: BLE001 - a hub task offline: say which and how to go local, in one line
        if opts.local or opts.data_dir:
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise RuntimeError(f"task.lm_eval: the harness could not load its data sets ({type(e).__name__}: {first}); "
                           "offline, set task.lm_eval.data_dir to a folder with <task>.jsonl|parquet copies or "
                           "task.lm_eval.local: true for the pipeline check") from None
    summary = summarize(res["results"], names)
    ctx.log_metrics({f"lm_eval/{k}": v for k, v in summary.items()}, step=0)
    return summary


def summarize(results: dict, names: dict[str, str]) -> dict:
    """Harness results -> {wikitext_ppl, lambada_ppl, lambada_acc, ..., avg_acc (when all six are there)}."""
    out = {}
    for ours, theirs in names.items():
        r = results.get(theirs, {})
        for metric, key in METRICS[ours].items():
            v = r.get(f"{metric},none", r.get(metric))
            if isinstance(v, (int, float)):
                out[key] = float(v)
    if all(k in out for k in SIX_TASKS):
        out[AVG_ACC] = sum(out[k] for k in SIX_TASKS) / len(SIX_TASKS)
    return out

"""Our LM inside lm-evaluation-harness (Table 3: wikitext, lambada_openai, piqa, hellaswag, winogrande, arc_easy,
arc_challenge; zero-shot) and the six-task average.

`DpxLM` is a `TemplateLM`: the harness does the prompts, the context/continuation split and the metrics; we score
token sequences. Scoring follows HFLM: the input is (context + continuation)[-(max_length + 1):][:-1] and the
log-probabilities of the last len(continuation) logits are summed; `is_greedy` says every continuation token is
the argmax. Rolling log-likelihood (wikitext) uses the harness's disjoint windows of `max_length` tokens with <s>
as the prefix token. Sequences are right-padded within a batch, which a causal model never sees.

Offline: `local=True` runs each task on the look-alike JSONL shipped in tasks/lm/data/ (`data_dir` on local copies
of the real files): a generated task YAML `include`s the harness's own YAML (same prompts, same metrics) and only
swaps the dataset for `dataset_path: json|parquet` with `data_files`.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from dpx.tasks.training.loop import autocast

from .config import LMEvalOptions
from .tokenizer import DATA_DIR

# harness metric -> our summary key (dpx.registry.keys)
METRICS = {
    "wikitext": {"word_perplexity": "wikitext_ppl", "bits_per_byte": "wikitext_bpb"},
    "lambada_openai": {"perplexity": "lambada_ppl", "acc": "lambada_acc"},
    "piqa": {"acc": "piqa_acc", "acc_norm": "piqa_acc_norm"},
    "hellaswag": {"acc_norm": "hellaswag_acc_norm", "acc": "hellaswag_acc"},
    "winogrande": {"acc": "winogrande_acc"},
    "arc_easy": {"acc": "arc_e_acc", "acc_norm": "arc_e_acc_norm"},
    "arc_challenge": {"acc_norm": "arc_c_acc_norm", "acc": "arc_c_acc"},
}
SIX = ("lambada_acc", "piqa_acc", "hellaswag_acc_norm", "winogrande_acc", "arc_e_acc", "arc_c_acc_norm")
HARNESS_YAML = {"wikitext": "wikitext/wikitext.yaml", "lambada_openai": "lambada/lambada_openai.yaml",
                "piqa": "piqa/piqa.yaml", "hellaswag": "hellaswag/hellaswag.yaml",
                "winogrande": "winogrande/default.yaml", "arc_easy": "arc/arc_easy.yaml",
                "arc_challenge": "arc/arc_challenge.yaml"}


def _template_lm():
    try:
        from lm_eval.api.model import TemplateLM
    except ImportError as e:
        raise RuntimeError("task.lm_eval: lm-evaluation-harness is not installed (pip install lm-eval)") from e
    return TemplateLM


class DpxLM(_template_lm()):
    def __init__(self, model, tok, *, batch_size: int = 16, max_length: int = 2048, device=None,
                 add_bos: bool = False):
        super().__init__()
        self.model, self.tok = model, tok
        self.batch_size, self.max_length, self.add_bos = batch_size, max_length, add_bos
        self._device = torch.device(device) if device is not None else next(model.parameters()).device

    # ---- tokenisation ----------------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.tok.bos_id  # what HFLM uses for a tokenizer with a BOS token

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        ids = self.tok.encode(string)
        if add_special_tokens if add_special_tokens is not None else self.add_bos:
            ids = [self.tok.bos_id] + ids
        return ids

    def tok_decode(self, ids) -> str:
        return self.tok.decode(ids)

    @property
    def device(self):
        return self._device

    # ---- scoring ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        """requests: [(cache_key, context_ids, continuation_ids)] -> [(sum logprob, is_greedy)]."""
        items = []
        for i, (_, ctx_ids, cont_ids) in enumerate(requests):
            full = (list(ctx_ids) + list(cont_ids))[-(self.max_length + 1):]
            items.append((i, full[:-1], len(cont_ids), full[-len(cont_ids):]))
        out: list = [None] * len(items)
        items.sort(key=lambda it: -len(it[1]))  # long first: equal lengths batch together, OOM shows up early
        for s in range(0, len(items), self.batch_size):
            chunk = items[s:s + self.batch_size]
            T = max(len(it[1]) for it in chunk)
            inp = torch.zeros(len(chunk), T, dtype=torch.long)
            for r, (_, x, _, _) in enumerate(chunk):
                inp[r, :len(x)] = torch.tensor(x)
            with autocast(self._device):
                logits = self.model(inp.to(self._device))
            logp = F.log_softmax(logits.float(), dim=-1)
            for r, (i, x, n, cont) in enumerate(chunk):
                lp = logp[r, len(x) - n:len(x)]
                tgt = torch.tensor(cont, device=lp.device)
                ll = lp.gather(-1, tgt[:, None]).sum().item()
                greedy = bool((lp.argmax(-1) == tgt).all())
                out[i] = (ll, greedy)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
        results = []
        for req in requests:
            (text,) = req.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text, add_special_tokens=False), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            scores = self._loglikelihood_tokens([(None, c, t) for c, t in windows])
            results.append(sum(ll for ll, _ in scores))
        return results

    def generate_until(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("dpx's lm-eval adapter scores log-likelihoods only (the Table 3 tasks need no "
                                  "generation)")


# ---- local task files -----------------------------------------------------------------------------------------
def task_dir(tasks: list[str], local: bool = False, data_dir: str | Path | None = None) -> tuple[Path, dict[str, str]]:
    """One YAML per task that `include`s the harness's own YAML (same prompts, metrics, splits), so a TaskManager
    need not index the harness's thousands of tasks. With `local` or `data_dir` the data set is swapped for
    `<task>.jsonl|parquet` from data_dir (default: the shipped look-alikes). Returns the folder and
    {our task: harness task name}."""
    import lm_eval.tasks as lt
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
    """Run the harness; summary keys as in dpx.registry.keys (wikitext_ppl, lambada_ppl, ..., avg_acc)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    if opts.local or opts.data_dir:
        # the json/parquet builders need no hub; keep `datasets` from trying it
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    inc, names = task_dir(opts.tasks, opts.local, opts.data_dir or None)
    tm = TaskManager(include_path=str(inc), include_defaults=False)  # indexing every harness task takes a minute
    lm = DpxLM(model, tok, batch_size=opts.batch_size, max_length=opts.max_length or context_len,
               device=ctx.device, add_bos=opts.add_bos)
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
    if all(k in out for k in SIX):
        out["avg_acc"] = sum(out[k] for k in SIX) / len(SIX)
    return out

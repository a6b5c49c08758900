"""lm-evaluation-harness adapter: `DpxLM`, an `lm_eval` TemplateLM over a dpx LanguageModel, registered as "dpx".

    lm_eval --model dpx --model_args pretrained=RUN/checkpoints/hf,tokenizer=mistral.model --tasks lambada_openai
    or in Python: lm_eval.simple_evaluate(model=DpxLM(model, tokenizer), tasks=[...])

lm_eval is imported lazily (the LM-task engineer installs it on demand), so this module imports without it; the
scoring functions below need only torch and are what the class calls. Recurrent models score a document of any
length in one pass by carrying the state across windows of `max_length` tokens (exact, no re-reading of context).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


# scoring (torch only) ----------------------------------------------------------------------------------------------
@torch.no_grad()
def score_continuations(model, pairs: list[tuple[list[int], list[int]]], batch_size: int = 8,
                        device: str | torch.device = "cpu") -> list[tuple[float, bool]]:
    """(context ids, continuation ids) -> (sum of log p(continuation | context), continuation is the greedy one).
    Batches are right-padded: causal models never look right, so padding does not change earlier logits."""
    out = [None] * len(pairs)
    order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))  # similar lengths together
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        seqs = [(pairs[i][0] + pairs[i][1])[:-1] for i in idx]
        L = max(len(x) for x in seqs)
        ids = torch.zeros(len(idx), L, dtype=torch.long)
        for r, x in enumerate(seqs):
            ids[r, :len(x)] = torch.tensor(x)
        logp = F.log_softmax(model(ids.to(device)).double(), -1).cpu()
        for r, i in enumerate(idx):
            ctx, cont = pairs[i]
            rows = logp[r, len(ctx) - 1: len(ctx) - 1 + len(cont)]
            tgt = torch.tensor(cont)
            out[i] = (float(rows.gather(-1, tgt[:, None]).sum()), bool((rows.argmax(-1) == tgt).all()))
    return out


@torch.no_grad()
def score_rolling(model, tokens: list[int], prefix_id: int, max_length: int = 2048,
                  device: str | torch.device = "cpu") -> float:
    """log p(tokens | prefix) of a whole document, windows of max_length carrying the recurrent state."""
    seq = [prefix_id] + list(tokens)
    total, state = 0.0, None
    for s in range(0, len(seq) - 1, max_length):
        inp = torch.tensor(seq[s:s + max_length])[None].to(device)
        tgt = torch.tensor(seq[s + 1:s + 1 + max_length])
        res = model(inp, state=state, return_states=True)
        state = res.states
        logp = F.log_softmax(res.logits[0, :len(tgt)].double(), -1).cpu()
        total += float(logp.gather(-1, tgt[:, None]).sum())
    return total


@torch.no_grad()
def greedy_generate(model, context: list[int], max_new_tokens: int, stop=None, device="cpu") -> list[int]:
    """Greedy decoding: prefill with the full-sequence form, then one O(1) `step` per token.
    stop(list of new ids) -> bool ends early."""
    res = model(torch.tensor(context)[None].to(device), return_states=True)
    nxt = int(res.logits[0, -1].argmax())
    state, new = res.states, [nxt]
    while len(new) < max_new_tokens and not (stop and stop(new)):
        logits, state = model.step(torch.tensor([nxt], device=device), state)
        nxt = int(logits[0].argmax())
        new.append(nxt)
    return new


# the lm_eval class (created on first use) --------------------------------------------------------------------------
class _Tokenizer:
    """A SentencePiece model path, or any object with encode(str) -> ids and decode(ids) -> str."""

    def __init__(self, tok, eot_token_id: int | None = None):
        if isinstance(tok, str):
            import sentencepiece as spm
            sp = spm.SentencePieceProcessor(model_file=tok)
            self.encode, self.decode = (lambda s: sp.encode(s)), (lambda ids: sp.decode(ids))
            self.eot = sp.eos_id() if eot_token_id is None else eot_token_id
        else:
            self.encode, self.decode = tok.encode, tok.decode
            self.eot = eot_token_id if eot_token_id is not None else getattr(tok, "eot_token_id", getattr(tok, "eos_id", 0))
            self.eot = self.eot() if callable(self.eot) else self.eot


@functools.cache
def lm_eval_class():
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model

    @register_model("dpx")
    class DpxLM(TemplateLM):
        """pretrained: a save_pretrained dir or a LanguageModel; tokenizer: SentencePiece path or encode/decode object."""

        def __init__(self, pretrained, tokenizer, batch_size: int | str = 8, device: str = "cpu",
                     max_length: int | str = 2048, max_gen_toks: int | str = 256, eot_token_id: int | None = None,
                     dtype: str = "float32", **_):
            super().__init__()
            from .lm import load_pretrained
            model = load_pretrained(pretrained) if isinstance(pretrained, str) else pretrained
            self.model = model.to(device=device, dtype=getattr(torch, dtype)).eval()
            self.tok = _Tokenizer(tokenizer, None if eot_token_id is None else int(eot_token_id))
            self.batch_size = 8 if str(batch_size).startswith("auto") else int(batch_size)
            self._device, self.max_length, self.max_gen_toks = device, int(max_length), int(max_gen_toks)

        @property
        def eot_token_id(self) -> int:
            return self.tok.eot

        def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
            return list(self.tok.encode(string))

        def _loglikelihood_tokens(self, requests, **kwargs):
            pairs = [(ctx[-self.max_length:], cont) for _, ctx, cont in requests]
            return score_continuations(self.model, pairs, self.batch_size, self._device)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
            return [score_rolling(self.model, self.tok_encode(r.args[0]), self.prefix_token_id, self.max_length,
                                  self._device) for r in requests]

        def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
            outs = []
            for r in requests:
                context, kw = r.args
                until = kw.get("until", [])
                until = [until] if isinstance(until, str) else list(until)
                n = int(kw.get("max_gen_toks", self.max_gen_toks))
                stop = lambda ids: any(u in self.tok.decode(ids) for u in until) or ids[-1] == self.eot_token_id  # noqa: E731
                ids = greedy_generate(self.model, self.tok_encode(context)[-self.max_length:], n, stop, self._device)
                text = self.tok.decode([i for i in ids if i != self.eot_token_id])
                for u in until:
                    text = text.split(u)[0]
                outs.append(text)
            return outs

    return DpxLM


def __getattr__(name: str):
    if name == "DpxLM":
        return lm_eval_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The LM wrapper around any token mixer (fla's block layout, the authors' init).

    embedding -> N x [x + mixer(RMSNorm(x)); x + SwiGLU(RMSNorm(x))] -> RMSNorm -> head (tied to the embedding)

`model(ids)` returns logits [B, T, V]. `model(ids, state=..., return_states=True)` returns an `LMOutput` with the
final recurrent state of every layer (pass it back in to continue a sequence), and with `return_aux=True` the
per-layer, per-token mixer internals (keys, beta, gates; see Mixer.record). `model.step(ids_t, states)` decodes one
token. `save_pretrained(dir)` writes model.safetensors + config.json; `load_pretrained(dir)` reads them back.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from .block import Block
from .config import ModelConfig
from .layers import RMSNorm, ShortConv
from .matching import num_params, resolve


class LMOutput(NamedTuple):
    logits: torch.Tensor
    states: list[dict] | None = None
    aux: list[dict] | None = None


class LanguageModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Block(cfg, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.tied = cfg.tie_embeddings and cfg.num_classes is None
        self.lm_head = None if self.tied else nn.Linear(cfg.hidden_size, cfg.output_size, bias=False)
        self.apply(self._init_weights)

    def _init_weights(self, m: nn.Module):
        # fla's _init_weights with initializer_range = init_std; mixer-specific parameters (A_log, dt_bias, decays)
        # keep the values their layers set. init "authors" adds what fla 0.2.2 does besides (ModelConfig.init):
        # convs drawn like the linears, o_proj / down_proj rescaled. apply() visits children before their parent,
        # so the rescale overwrites the plain draw of o_proj / down_proj, as in fla.
        authors = self.config.init == "authors"
        if isinstance(m, (nn.Linear, nn.Embedding)) or (authors and isinstance(m, ShortConv)):
            nn.init.normal_(m.weight, mean=0.0, std=self.config.init_std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        if authors:
            proj = getattr(m, "o_proj", None) or getattr(m, "down_proj", None)
            if isinstance(proj, nn.Linear):
                nn.init.kaiming_uniform_(proj.weight, a=math.sqrt(5))
                with torch.no_grad():
                    proj.weight /= math.sqrt(2 * self.config.num_layers)

    @property
    def mixers(self) -> list:
        return [b.attn for b in self.layers]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        h = self.norm(h)
        return h @ self.embeddings.weight.t() if self.tied else self.lm_head(h)

    def forward(self, input_ids: torch.Tensor, state: list[dict] | None = None, return_states: bool = False,
                return_aux: bool = False, mode: str | None = None):
        for m in self.mixers:
            m.record = return_aux
        h = self.embeddings(input_ids)
        states = []
        for i, block in enumerate(self.layers):
            h, s = block(h, None if state is None else state[i], mode=mode)
            states.append(s)
        logits = self.head(h)
        if not (return_states or return_aux):
            return logits
        aux = [dict(m.aux) for m in self.mixers] if return_aux else None
        for m in self.mixers:
            m.record, m.aux = False, {}
        return LMOutput(logits, states if return_states else None, aux)

    @torch.no_grad()
    def step(self, input_ids_t: torch.Tensor, state: list[dict] | None = None):
        """One decoding step: ids [B] -> (logits [B, V], states)."""
        h = self.embeddings(input_ids_t)
        states = []
        for i, block in enumerate(self.layers):
            h, s = block.step(h, None if state is None else state[i])
            states.append(s)
        return self.head(h), states

    def num_params(self, exclude_embeddings: bool = False) -> int:
        n = num_params(self)
        return n - self.embeddings.weight.numel() if exclude_embeddings else n

    def save_pretrained(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        sd = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(sd, str(path / "model.safetensors"))
        (path / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2, sort_keys=True))


def build_model(cfg: ModelConfig | dict) -> LanguageModel:
    """ModelConfig (or its dict) -> LanguageModel, after parameter matching resolves the free dimension."""
    cfg = ModelConfig.from_dict(cfg) if isinstance(cfg, dict) else cfg
    return LanguageModel(resolve(cfg))


def load_pretrained(path: str | Path, map_location: str | torch.device = "cpu") -> LanguageModel:
    path = Path(path)
    cfg = ModelConfig.from_dict(json.loads((path / "config.json").read_text()))
    sd = load_file(str(path / "model.safetensors"), device=str(map_location))
    model = LanguageModel(cfg).to(next(iter(sd.values())).dtype)  # the saved precision, not float32
    model.load_state_dict(sd)
    return model

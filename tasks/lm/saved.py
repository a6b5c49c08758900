"""Loading a trained LM back: what the `lm` task evaluates given `task.checkpoint`, and what `lm_eval --model dpx
--model_args pretrained=...` reads. A module of its own so that task.py and lm_eval_adapter.py both import it."""
from __future__ import annotations

from pathlib import Path

from dpx.models import load_pretrained
from dpx.rundir import CHECKPOINTS

MODEL_DIR = "model"
"""the folder of checkpoints/ where the `lm` task saves its trained model (save_pretrained: safetensors + config)"""
WEIGHTS = "model.safetensors"


def load_model(path: str | Path, device):
    """A save_pretrained folder, or an lm trial's run dir (its checkpoints/model/)."""
    p = Path(path).expanduser()
    for cand in (p, p / CHECKPOINTS / MODEL_DIR):
        if (cand / WEIGHTS).exists():
            return load_pretrained(cand, map_location=device)
    raise FileNotFoundError(f"task.checkpoint: no {WEIGHTS} in {p} or {p / CHECKPOINTS / MODEL_DIR}")

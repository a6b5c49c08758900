"""The run-dir contract, at the bottom of dpx: every process that writes or reads a trial's run dir (the runner,
the task through RunContext, the driver, MLflow tracking, `dpx repair`, the registry) names its files and keys
from here, reads JSON with `read_json` and writes it with `atomic_write_json`.

Standard library only and no dpx import: `dpx.kernels`-free, torch-free, importable by every layer (the registry
included, which imports no other dpx package). A run dir (`.dpx/runs/<recipe>/<trial_id>/`) holds:

    config.json, config.yaml   the resolved trial config (+ trial_id)             written by the driver
    metrics.jsonl              {"key", "value", "step", "time", "kind"} a line     the task (RunContext)
    result.json                {"trial_id", "status": "completed", "metrics", …}   the runner (atomic)
    error.json                 {"trial_id", "status": "failed", "error", …}        the runner (atomic)
    worker.json                {"attempt", "pid", "pgid", "host", "proc_start",   the runner, before task code
                                "cuda_visible_devices"}
    progress.json              {"fraction", "message", "time"}                    the task (RunContext)
    log.txt, attempts/<n>/     stdout+stderr of the trial (per attempt)           the backend
    checkpoints/, figures/     resumable state (last.pt), plots (*.png)           the task
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

# ---- file names ------------------------------------------------------------------------------------------------
CONFIG_JSON = "config.json"
CONFIG_YAML = "config.yaml"
METRICS = "metrics.jsonl"
RESULT = "result.json"
ERROR = "error.json"
WORKER = "worker.json"
PROGRESS = "progress.json"
LOG = "log.txt"
ATTEMPTS = "attempts"
CHECKPOINTS = "checkpoints"
FIGURES = "figures"

# the line a backend writes into log.txt before each attempt:
#   "===== attempt N YYYY-mm-dd HH:MM:SS[ on HOST (...)] ====="
ATTEMPT_HEADER = "===== attempt "
HEADER_TIME = "%Y-%m-%d %H:%M:%S"  # local time, to the second

# ---- summary metric keys (result.json "metrics"); the paper columns they feed: registry/keys.py -----------------
# Word problems (Fig. 5, Fig. 12): prefix-exact-match accuracy.
MAX_LEN_ACC90 = "max_len_acc90"  # longest prefix length t with acc_at_pos[t] >= 0.9 (int)
ACC_AT_TRAIN_LEN = "acc_at_train_len"  # prefix accuracy at the training length (fraction)
TOKEN_ACC = "token_acc"  # fraction of correct positions
SEQ_ACC = "seq_acc"  # fraction of fully correct test sequences
# Formal languages (Table 2): scaled accuracy (a - c) / (1 - c) on test lengths 40-256, 0 = chance, 1 = perfect.
SCALED_ACC = "scaled_acc"
# Language modelling (Tables 3, 4; lm-evaluation-harness, zero-shot).
WIKITEXT_PPL = "wikitext_ppl"  # wikitext word_perplexity
LAMBADA_PPL = "lambada_ppl"  # lambada_openai perplexity
LAMBADA_ACC = "lambada_acc"
PIQA_ACC = "piqa_acc"
HELLASWAG_ACC_NORM = "hellaswag_acc_norm"
WINOGRANDE_ACC = "winogrande_acc"
ARC_E_ACC = "arc_e_acc"
ARC_C_ACC_NORM = "arc_c_acc_norm"
AVG_ACC = "avg_acc"  # mean of the six accuracies above (LAMBADA, PIQA, Hella, Wino, ARC-e, ARC-c)
SIX_TASKS = (LAMBADA_ACC, PIQA_ACC, HELLASWAG_ACC_NORM, WINOGRANDE_ACC, ARC_E_ACC, ARC_C_ACC_NORM)
# Throughput (Fig. 4) and model size.
TOKENS_PER_S = "tokens_per_s"  # training tokens per second (forward + backward + optimizer step)
NUM_PARAMS = "num_params"  # total parameter count (int); used to place LM trials in the paper's size rows
# Training (every training task): the last validation loss.
VAL_LOSS = "val_loss"
# Length extrapolation (Fig. 8) and effective rank (Fig. 9): optional summaries; the registry derives them from the
# curves when absent (see the fig8/fig9 views in registry/views.py).
LOSS_IN_CTX = "loss_in_ctx"  # mean per-position loss at positions <= training context
LOSS_BEYOND_CTX = "loss_beyond_ctx"  # mean per-position loss at positions > training context
# Word-problem probe (Fig. 7, eval.probe: true; added with the tasks' keys: registry/comparison.py's fig7 reads them).
PROBE_ROTATION_HEADS = "probe/rotation_heads"  # heads showing a rotation (n_h >= 2, mean beta > 1.5, pca3 >= 0.95)
PROBE_HEAD = "probe"  # "probe/l<layer>/h<head>/beta_mean" and ".../pca3": per-head summaries

# ---- curve keys (metrics.jsonl kind="curve", step = position) ---------------------------------------------------
CURVE_ACC_AT_POS = "acc_at_pos"  # Fig. 5: prefix accuracy at position t (t = 1..test length)
CURVE_LOSS_AT_POS = "loss_at_pos"  # Fig. 8: "loss_at_pos/<dataset>" (e.g. loss_at_pos/codeparrot), raw, unsmoothed
CURVE_ERANK = "erank"  # Fig. 9: "erank/l<layer>/h<head>" (e.g. erank/l20/h3): effective rank of the state at t
CURVE_PROBE_BETA = "probe/beta"  # Fig. 7: "probe/beta/l<layer>/h<head>/j<step>": mean beta per group element
CURVE_PROBE_PCA = "probe/pca_cumvar"  # Fig. 7: "probe/pca_cumvar/l<layer>/h<head>": cumulative PCA variance of keys

# The summary keys a results table shows first, in this order (`dpx status`/`watch` tables, six at most).
PREFERRED = (MAX_LEN_ACC90, ACC_AT_TRAIN_LEN, SCALED_ACC, VAL_LOSS, WIKITEXT_PPL, AVG_ACC, TOKENS_PER_S, "score")


def attempt_header(attempt: int, where: str = "") -> bytes:
    """The header line of `attempt` as a backend appends it to log.txt right before the attempt starts."""
    return f"\n{ATTEMPT_HEADER}{attempt} {time.strftime(HEADER_TIME)}{' ' + where if where else ''} =====\n".encode()


# ---- JSON ---------------------------------------------------------------------------------------------------------
def read_json(path: str | Path, warnings: list[str] | None = None) -> dict | None:
    """The JSON object at `path`, or None when it is missing, unreadable, garbled or not an object.

    `warnings`: where a reader that reports damage (the registry) collects one line per bad file; a missing file
    is not damage and adds nothing."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        if warnings is not None:
            warnings.append(f"{path}: unreadable JSON ({type(e).__name__}: {str(e)[:80]}); ignored")
        return None
    if not isinstance(obj, dict):
        if warnings is not None:
            warnings.append(f"{path}: expected a JSON object, got {type(obj).__name__}; ignored")
        return None
    return obj


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write JSON so that readers never see a half-written file (write to a temp file, fsync, rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, default=_json_default)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")

"""Language modelling and its evaluations (paper Tables 3-4, Figs. 4, 8, 9).

Tasks (registered in dpx.tasks): `lm` trains a model with the paper's protocol and runs `task.evals`;
`lm_eval`, `extrapolation`, `effective_rank` are `lm` with that evaluation on (and, given `task.checkpoint`, no
training); `throughput` times training steps at one (seq_len x batch) shape, ours or fla's layer.

Modules, one job each:
    config.py          recipe section `task:` (torch-free), vocab check
    tokenizer.py       Mistral v1 SentencePiece (shipped in data/), byte-level fallback
    sources.py         text sources: hub data sets (lazy `datasets` streaming), local Parquet/JSONL/txt, offline corpora
    packing.py         documents -> <s>-prefixed, packed, shuffled, resumable token sequences; background prefetch
    task.py            the `lm` run: train through dpx.tasks.training.loop.fit, then evaluations
    lm_eval_adapter.py lm-evaluation-harness TemplateLM over our model (registered as "dpx"), torch-only scoring
                       helpers; shipped look-alike tasks for offline runs
    extrapolation.py   per-position loss to 32K, 501-token moving average
    effective_rank.py  effective rank of every head's state, replayed on the device with batched SVD
    throughput.py      Fig. 4 tokens/s; fla's GatedDeltaProduct in our LM wrapper as the comparison
    saved.py           a trained model loaded back (task.checkpoint, lm_eval's pretrained=)
    budget.py          FLOPs per token (MFU) and the memory estimate that refuses oversize shapes

Offline use: a hub data set name plus `task.data_files: [/data/fineweb/*.parquet]` reads local copies with the same
formatting; `task.lm_eval.data_dir` does the same for the benchmarks; `dataset: botchan | pystdlib |
chatterbot_qa | math_synth | mixed` need nothing at all (data/NOTICE.md lists what ships and its licence).

On a GPU, benchmarks/lm_tasks_gpu.py runs resolved lm / throughput trials in one process and reports them.
"""

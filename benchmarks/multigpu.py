"""Multi-GPU measurements on one node (issue 10), in one call on a 2-GPU machine:

(b) LM training tokens/s, one GPU vs data-parallel over two (`hardware.gpus_per_trial: 2`: the runner re-runs
    itself under torchrun, DDP over NCCL), the same trial and global batch, steady-state windows of the loop's
    logged `train/tokens_per_s` (warm-up windows dropped);
(a) a grid of `gpus_per_trial: 1` LM trials through `dpx submit --wait`, on Ray with 2 GPUs vs Ray restricted to
    1 GPU (`hardware.ray.num_gpus`), wall time and speed-up; without Ray, the local backend (it hands GPUs out
    through CUDA_VISIBLE_DEVICES) with CUDA_VISIBLE_DEVICES=0,1 vs 0, and the output says which ran.

    python3 benchmarks/multigpu.py --out $OUT [--budget-s 230]
    python3 benchmarks/multigpu.py --out /tmp/x --cpu-dry-run   # the plumbing on CPU: tiny model, gloo, fake GPUs

(b) runs first, so (a)'s trials find the Triton kernels compiled. Every phase has a time limit taken from the
budget; a phase that would not fit is skipped and said so. Results: OUT/multigpu.json and a table on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODEL = {"family": "deltaproduct", "num_layers": 8, "hidden_size": 1024, "num_heads": 8, "head_dim": 128,
         "num_householder": 2, "beta_range": [-1, 1], "vocab_size": 32000, "tie_embeddings": True}
TASK = {"name": "lm", "dataset": "mixed", "tokenizer": "mistral_v1", "context_len": 1024, "val_fraction": 0.005,
        "val_sequences": 32, "evals": [], "save_model": False}
SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


DRY = False  # --cpu-dry-run: tiny model on CPU, DDP over gloo, stand-in GPU ids


def lm_config(run_id: str, gpus: int, steps: int, tokens_per_step: int, micro: int, seed: int = 0) -> dict:
    hw = {"device": "cpu", "nproc_per_trial": gpus} if DRY else {"device": "cuda", "gpus_per_trial": gpus}
    return {"recipe": "multigpu", "version": 1, "seed": seed, "trial_id": run_id, "model": dict(MODEL),
            "task": {**TASK, "tokens_per_step": tokens_per_step, "micro_batch_size": micro},
            "train": {"steps": steps, "lr": 1e-3, "warmup_steps": 5, "log_every": 2, "eval_every": 0,
                      "checkpoint_every": 0},
            "eval": {}, "hardware": hw}


def windows(run_dir: Path, key: str = "train/tokens_per_s") -> list[tuple[int, float]]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["key"] == key and r["value"] is not None:
            out.append((r["step"], r["value"]))
    return out


def ddp_phase(root: Path, gpus: int, steps: int, limit: float) -> dict:
    d = root / f"ddp_g{gpus}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(lm_config(d.name, gpus, steps, TASK["context_len"] * 32, 32)))
    env = {**os.environ, **SAFE, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus))}
    t0 = time.time()
    with open(d / "log.txt", "wb") as log:
        try:
            code = subprocess.run([sys.executable, "-m", "dpx.orchestrator.trial.runner", str(d)], env=env, cwd=d,
                                  stdout=log, stderr=subprocess.STDOUT, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    row = {"phase": "ddp", "gpus": gpus, "exit": code, "wall_s": round(time.time() - t0, 1)}
    if (d / "metrics.jsonl").exists():
        w = windows(d)
        steady = [v for s, v in w if s > 10] or [v for _, v in w]
        row.update(windows=[[s, round(v)] for s, v in w], tokens_per_s=round(statistics.median(steady)) if steady
                   else None, loss=[[s, round(v, 4)] for s, v in windows(d, "train/loss")])
    if (d / "result.json").exists():
        m = json.loads((d / "result.json").read_text())["metrics"]
        row.update(result_tokens_per_s=round(m.get("tokens_per_s", 0)), num_params=m.get("num_params"),
                   train_tokens=m.get("train_tokens"), val_loss=m.get("val_loss"))
    if code != 0:
        row["log_tail"] = (d / "log.txt").read_text(errors="replace")[-2500:]
    return row


RECIPE = """name: {name}
version: 1
model: {model}
task: {task}
train: {{steps: {steps}, lr: 1.0e-3, warmup_steps: 2, log_every: 5, eval_every: 0, checkpoint_every: 0}}
hardware: {hardware}
tracking: {{enabled: false}}
seeds: [0, 1, 2, 3]
"""


def grid_phase(root: Path, backend: str, gpus: int, steps: int, limit: float) -> dict:
    name = f"grid_{backend}_g{gpus}"
    hw = {"backend": backend, "gpus_per_trial": 1, "device": "cpu" if DRY else "cuda"}
    env = {**os.environ, **SAFE, "DPX_WORKSPACE": str(root / f"ws_{name}"), "RAY_AUTH_MODE": "disabled"}
    if backend == "ray":
        hw["ray"] = {"num_gpus": gpus, "num_cpus": 16}
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    task = {**TASK, "tokens_per_step": TASK["context_len"] * 32, "micro_batch_size": 32}
    recipe = root / f"{name}.yaml"
    model = {**MODEL, "num_layers": 2}  # short trials; same heads/head dim, so the same compiled kernels as (b)
    recipe.write_text(RECIPE.format(name=name, model=json.dumps(model), task=json.dumps(task), steps=steps,
                                    hardware=json.dumps(hw)))
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "dpx.orchestrator.cli", "submit", str(recipe), "--wait"], env=env,
                           capture_output=True, text=True, timeout=limit)
        code, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        code, out = "timeout", str(e.stdout or "")[-2000:]
    row = {"phase": "grid", "backend": backend, "gpus": gpus, "exit": code, "wall_s": round(time.time() - t0, 1)}
    res = [json.loads(p.read_text()) for p in (root / f"ws_{name}" / "runs" / name).glob("*/result.json")]
    if res:
        row.update(trials_done=len(res), trials_span_s=round(max(r["ended_at"] for r in res)
                                                            - min(r["started_at"] for r in res), 1),
                   gpus_seen=sorted({str(r.get("cuda_visible_devices")) for r in res}),
                   trial_s=[round(r["ended_at"] - r["started_at"], 1) for r in res])
    if code != 0:
        row["out_tail"] = out[-2500:]
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=230)
    ap.add_argument("--ddp-steps", type=int, default=20)
    ap.add_argument("--grid-steps", type=int, default=12)
    ap.add_argument("--cpu-dry-run", action="store_true")
    a = ap.parse_args()
    if a.cpu_dry_run:
        global DRY
        DRY = True
        MODEL.update(num_layers=1, hidden_size=32, num_heads=2, head_dim=16)
        TASK.update(context_len=16, dataset="botchan")
    out, root = Path(a.out), Path("/tmp/dpx_multigpu")
    out.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    t_end = time.time() + a.budget_s
    rows: list[dict] = []

    def left() -> float:
        return t_end - time.time()

    def save(row: dict) -> None:
        rows.append(row)
        (out / "multigpu.json").write_text(json.dumps(rows, indent=1))
        print(json.dumps({k: v for k, v in row.items() if k not in ("windows", "loss", "log_tail", "out_tail")}),
              flush=True)

    try:
        import ray  # noqa: F401
        backend = "ray"
    except ImportError as e:
        backend = "local"
        save({"phase": "note", "msg": f"ray not importable ({e}); grid on the local backend"})
    # (b) then (a); each phase gets what is left, the 1-GPU runs (longer) first within each part
    for gpus, share in ((1, 0.3), (2, 0.2)):
        if left() > 30:
            save(ddp_phase(root, gpus, a.ddp_steps, min(left(), a.budget_s * share + 40)))
    for gpus in (2, 1):
        if left() < 30:
            save({"phase": "grid", "gpus": gpus, "skipped": "budget spent"})
            continue
        row = grid_phase(root, backend, gpus, a.grid_steps, left())
        if backend == "ray" and row["exit"] != 0 and "trials_done" not in row and left() > 30:
            save(row)  # Ray did not come up here: the local backend's GPU assignment instead
            backend = "local"
            row = grid_phase(root, backend, gpus, a.grid_steps, left())
        save(row)
    ddp = {r["gpus"]: r.get("tokens_per_s") for r in rows if r["phase"] == "ddp"}
    grid = {(r["backend"], r["gpus"]): r for r in rows if r["phase"] == "grid" and "backend" in r}
    print("\n== summary ==")
    if ddp.get(1) and ddp.get(2):
        print(f"LM tokens/s: 1 GPU {ddp[1]:,}  2 GPUs (DDP) {ddp[2]:,}  scaling {ddp[2] / ddp[1]:.2f}x")
    for b in ("ray", "local"):
        g1, g2 = grid.get((b, 1)), grid.get((b, 2))
        if g1 and g2 and g1["exit"] == 0 and g2["exit"] == 0:
            print(f"grid of 4 trials ({b}): 1 GPU {g1['wall_s']} s (span {g1.get('trials_span_s')}), 2 GPUs "
                  f"{g2['wall_s']} s (span {g2.get('trials_span_s')}); speed-up {g1['wall_s'] / g2['wall_s']:.2f}x "
                  f"wall, {g1.get('trials_span_s', 0) / max(g2.get('trials_span_s', 1), 1e-9):.2f}x span")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

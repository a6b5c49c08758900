"""The `lm` and `throughput` tasks on a GPU: run resolved trials in one process and write a compact report (the GPU
proof of tasks/lm: tokens/s, MFU, loss curves, dpx vs fla at each Fig. 4 shape).

    python benchmarks/lm_tasks_gpu.py TRIALS.json OUT_DIR [--budget-s 150]

TRIALS.json is a list of resolved trial configs (what `dpx expand` produces, e.g. from
`recipes/fig4_throughput.yaml scale=gpu_small` and `recipes/table3.yaml scale=gpu_small`). Each trial runs through
its task's `run(config, ctx)` exactly as the runner would, in a run dir under /tmp; no new trial starts once
`--budget-s` seconds have passed. OUT_DIR gets results.json (summary or error per trial), curves.json (train and
validation loss per step) and a table on stdout: few files, because the device returns few.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path

from dpx.rundir import METRICS, NUM_PARAMS, TOKENS_PER_S, VAL_LOSS
from dpx.tasks import TASKS
from dpx.tasks.context import RunContext


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("trials")
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=150.0)
    args = ap.parse_args(argv)
    trials = json.loads(Path(args.trials).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = Path(tempfile.mkdtemp(prefix="dpx_runs_"))
    t0, results, curves = time.time(), [], {}
    for cfg in trials:
        tid, task = cfg.get("trial_id", "?"), cfg["task"]["name"]
        row = {"trial_id": tid, "recipe": cfg.get("recipe"), "task": task, "model": cfg.get("model"),
               "task_config": cfg["task"]}
        if time.time() - t0 > args.budget_s:
            row["status"] = "skipped (budget)"
            results.append(row)
            continue
        run_dir = runs / str(cfg.get("recipe")) / tid
        ctx = RunContext(run_dir, cfg)
        start = time.time()
        try:
            row["metrics"] = TASKS[task].run_fn()(cfg, ctx)
            row["status"] = "completed"
        except Exception as e:  # noqa: BLE001 - a failed trial is a result too
            row["status"] = "failed"
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
            row["traceback"] = traceback.format_exc()[-2000:]
        finally:
            ctx.close()
        row["wall_s"] = round(time.time() - start, 1)
        results.append(row)
        mpath = run_dir / METRICS
        if mpath.exists():
            c: dict = {}
            for line in mpath.read_text().splitlines():
                r = json.loads(line)
                if r["key"] in ("train/loss", "val/loss", "train/tokens_per_s", "train/mfu"):
                    c.setdefault(r["key"], []).append([r["step"], r["value"]])
            if c:
                curves[tid] = c
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "curves.json").write_text(json.dumps(curves))
        print(f"[bench] {task} {tid} {row['status']} {row['wall_s']}s {row.get('error', '')}", flush=True)
    print(table(results))
    (out / "report.md").write_text(markdown(results, curves))
    print(markdown(results, curves))
    return 0


def markdown(results: list[dict], curves: dict) -> str:
    """Throughput ours vs fla at each shape, and the training runs with their loss curves, as Markdown tables."""
    done = [r for r in results if r["status"] == "completed"]
    tp = [r for r in done if r["task"] == "throughput"]
    lines = []
    if tp:
        lines += ["| n_h | heads x d_k | seq x batch | dpx tokens/s | fla tokens/s | dpx / fla | dpx MFU | dpx peak GiB (est.) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        keyf = lambda r: (r["model"]["num_householder"], r["task_config"]["seq_len"], r["task_config"]["batch_size"])  # noqa: E731
        for key in sorted({keyf(r) for r in tp}):
            by = {r["task_config"].get("impl", "dpx"): r["metrics"] for r in tp if keyf(r) == key}
            d, f = by.get("dpx"), by.get("fla")
            ref = d or f
            ratio = f"{d[TOKENS_PER_S] / f[TOKENS_PER_S]:.2f}" if d and f else "-"
            lines.append(f"| {key[0]} | {ref['num_heads']} x {ref['head_dim']} | {key[1]} x {key[2]} | "
                         f"{_fmt(d and d[TOKENS_PER_S], ',.0f')} | {_fmt(f and f[TOKENS_PER_S], ',.0f')} | {ratio} | "
                         f"{_fmt(d and d.get('mfu'), '.3f')} | {_fmt(d and d.get('peak_mem_gib'), '.1f')} "
                         f"({_fmt(d and d.get('mem_estimate_gib'), '.1f')}) |")
    lm = [r for r in done if r["task"] != "throughput"]
    if lm:
        lines += ["", "| n_h | heads x d_k | params | steps | tokens | tokens/s | MFU | train loss (step) | val loss |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in lm:
            m, c = r["metrics"], curves.get(r["trial_id"], {})
            pts = c.get("train/loss", [])
            picks = [p for i, p in enumerate(pts) if i in {0, len(pts) // 4, len(pts) // 2, 3 * len(pts) // 4, len(pts) - 1}]
            curve = ", ".join(f"{v:.2f} ({s})" for s, v in picks)
            lines.append(f"| {r['model']['num_householder']} | {m.get('num_heads')} x {m.get('head_dim')} | "
                         f"{m[NUM_PARAMS] / 1e6:.1f}M | {m.get('train_steps')} | {m.get('train_tokens', 0) / 1e6:.1f}M | "
                         f"{_fmt(m.get(TOKENS_PER_S), ',.0f')} | {_fmt(m.get('mfu'), '.3f')} | {curve} | "
                         f"{_fmt(m.get(VAL_LOSS), '.3f')} |")
    bad = [r for r in results if r["status"] != "completed"]
    for r in bad:
        lines.append(f"\n- {r['task']} {r['trial_id']}: {r['status']} {r.get('error', '')}")
    return "\n".join(lines) + "\n"


def table(results: list[dict]) -> str:
    lines = [f"{'recipe':18} {'task':10} {'n_h':>3} {'H':>3} {'dk':>4} {'impl':5} {'shape':>10} {'tokens/s':>12} "
             f"{'mfu':>6} {'loss':>7} status"]
    for r in results:
        m, t = r.get("metrics") or {}, r["task_config"]
        mo = {**(r.get("model") or {}), **{k: m[k] for k in ("num_heads", "head_dim") if k in m}}
        shape = f"{t.get('seq_len', t.get('context_len', ''))}x{t.get('batch_size', '')}" if r["task"] == "throughput" \
            else f"ctx{t.get('context_len', '')}"
        tps = m.get(TOKENS_PER_S)
        lines.append(f"{str(r.get('recipe')):18} {r['task']:10} {mo.get('num_householder', ''):>3} "
                     f"{mo.get('num_heads', ''):>3} {str(mo.get('head_dim', '')):>4} {t.get('impl', 'dpx'):5} "
                     f"{shape:>10} {f'{tps:,.0f}' if tps else '-':>12} "
                     f"{_fmt(m.get('mfu'), '.3f'):>6} {_fmt(m.get(VAL_LOSS), '.3f'):>7} {r['status']}")
    return "\n".join(lines)


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


if __name__ == "__main__":
    raise SystemExit(main())

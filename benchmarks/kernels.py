"""DeltaProduct kernel benchmark on one GPU: dpx Triton vs fla-core (optional) vs the naive loop, with floors.

    python benchmarks/kernels.py [--out DIR] [--ns 1,2,3,4] [--bwd-ns ...] [--fla-ns ...] [--fla-bwd]

Shape (issue 4): B=4, T=4096, H=16, d_k=d_v=128, bf16; n_h 1-4, gated and not; forward and forward+backward.
Floors: bytes moved / measured device-to-device copy bandwidth, FLOPs of the chunkwise algorithm / measured bf16
matmul rate (both measured in this run). Decode: batch 64, H=16, d=128, float32 state, one token per step.
fla-core is used when importable (carried as a wheel); it is never required. To carry it to a GPU machine:
    pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl fla-core==0.6.0 einops==0.8.2
fla autotunes on first use (minutes for all rows): use --fla-ns to limit it. Results and the command go to
BENCHMARKS.md ("kernels" section).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
try:
    from dpx.kernels import chunk_gated_delta_product, fused_recurrent_gated_delta_product, gated_delta_product
    from dpx.kernels.delta_product.naive import naive_recurrent_gated_delta_product
except ImportError:  # repo checkout without `pip install -e .`: expose the folders as dpx.*
    import importlib, types
    root = os.path.join(os.path.dirname(__file__), "..")
    dpx = types.ModuleType("dpx")
    dpx.__path__ = []
    sys.modules["dpx"] = dpx
    spec = importlib.util.spec_from_file_location("dpx.kernels", os.path.join(root, "kernels", "__init__.py"),
                                                  submodule_search_locations=[os.path.join(root, "kernels")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dpx.kernels"] = mod
    spec.loader.exec_module(mod)
    from dpx.kernels import chunk_gated_delta_product, fused_recurrent_gated_delta_product, gated_delta_product
    from dpx.kernels.delta_product.naive import naive_recurrent_gated_delta_product

try:
    from fla.ops.gated_delta_product import chunk_gated_delta_product as fla_chunk
except Exception as e:  # noqa: BLE001 - fla is optional
    fla_chunk, FLA_ERR = None, repr(e)


def bench(fn, warmup=25, rep=100):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5])


def measured_rates(dev):
    x = torch.empty(1 << 29, dtype=torch.bfloat16, device=dev)  # 1 GiB
    t_copy = bench(lambda: x.clone())
    bw = 2 * x.numel() * 2 / (t_copy * 1e-3)  # bytes read + written per second
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    t_mm = bench(lambda: a @ a)
    return bw, 2 * 8192 ** 3 / (t_mm * 1e-3)


def inputs(B, T, H, K, V, n, gated, dtype, dev, requires_grad=False):
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, T, H, K, device=dev, generator=gen).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T * n, H, K, device=dev, generator=gen), dim=-1).to(dtype)
    v = torch.randn(B, T * n, H, V, device=dev, generator=gen).to(dtype)
    beta = (2 * torch.rand(B, T * n, H, device=dev, generator=gen)).to(dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=dev, generator=gen)).float() if gated else None
    xs = [q, k, v, g, beta]
    if requires_grad:
        for x in xs:
            if x is not None:
                x.requires_grad_()
    return xs


def flops_fwd(B, T, H, K, V, n):
    """Chunkwise FLOPs with 64-step chunks: kk^T, W, U, W h, state update, q h, q k^T, P v_new."""
    L, BT = 64, max(1, 64 // n)
    NC = B * H * T / BT
    per_chunk = L * L * K + L * L * K + L * L * V + 4 * L * K * V + 2 * BT * K * V + 2 * BT * L * K + 2 * BT * L * V
    return NC * per_chunk


def bytes_fwd(B, T, H, K, V, n, gated, es=2):
    return es * B * T * H * (K + n * K + n * V + V + n) + (4 * B * T * H if gated else 0)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ns", default="1,2,3,4", help="n_h values for our kernel")
    ap.add_argument("--bwd-ns", default="1,2,3,4", help="n_h values timed forward+backward")
    ap.add_argument("--fla-ns", default="1,2,3,4", help="n_h values timed with fla (its autotuning takes minutes)")
    ap.add_argument("--no-check", action="store_true", help="skip the bf16-vs-fp32 correctness check")
    ap.add_argument("--fla-bwd", action="store_true", help="also time fla's forward+backward")
    args = ap.parse_args()
    dev = "cuda"
    B, T, H, K, V = (4, 4096, 16, 128, 128)
    dtype = torch.bfloat16
    bw, mm = measured_rates(dev)
    rows, log = [], []
    t_start = time.time()
    say = lambda *a: (print(f"[{time.time() - t_start:6.1f}s]", *a, flush=True), log.append(" ".join(map(str, a))))
    parse = lambda x: [int(i) for i in x.split(",") if i]
    say(f"device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
        f"fla {'yes' if fla_chunk else 'no: ' + FLA_ERR}")
    say(f"copy bandwidth {bw / 1e12:.2f} TB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s")

    # correctness at a moderate shape against the float32 PyTorch chunk path on the same GPU
    for n, gated in [] if args.no_check else [(2, True), (3, False)]:
        xs = inputs(1, 1000, 4, K, V, n, gated, dtype, dev, requires_grad=True)
        h0 = torch.randn(1, 4, K, V, device=dev, requires_grad=True)
        o, ht = chunk_gated_delta_product(*xs, n, initial_state=h0, output_final_state=True)
        do, dht = torch.randn_like(o), torch.randn_like(ht)
        gr = torch.autograd.grad([o, ht], [x for x in xs if x is not None] + [h0], [do, dht])
        ys = [None if x is None else x.detach().float().requires_grad_() for x in xs]
        h1 = h0.detach().clone().requires_grad_()
        q, k, v, g, beta = ys
        o2, ht2 = gated_delta_product(q, k, v, beta, g, n, initial_state=h1, output_final_state=True, impl="torch")
        gr2 = torch.autograd.grad([o2, ht2], [y for y in ys if y is not None] + [h1], [do.float(), dht])
        names = ["dq", "dk", "dv"] + (["dg"] if gated else []) + ["dbeta", "dh0"]
        errs = {"o": rel(o, o2), "ht": rel(ht, ht2), **{nm: rel(a, b) for nm, a, b in zip(names, gr, gr2)}}
        say(f"check n={n} gated={gated} bf16 vs fp32 torch-chunk rel err: " +
            ", ".join(f"{kk} {vv:.1e}" for kk, vv in errs.items()))
        if fla_chunk is not None:
            o3, _ = fla_chunk(*[None if x is None else x.detach() for x in xs], n, initial_state=h0.detach())
            say(f"check n={n} gated={gated} fla vs fp32 torch-chunk rel err o {rel(o3, o2):.1e}")

    # naive loop, once (a single timed call; it is a Python loop over T*n steps)
    xs = inputs(1, 1024, H, K, V, 2, True, dtype, dev)
    q, k, v, g, beta = xs
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    naive_recurrent_gated_delta_product(q, k, v, beta, g, 2)
    torch.cuda.synchronize()
    t_naive = (time.perf_counter() - t0) * 1e3
    with torch.no_grad():
        t_ours_small = bench(lambda: chunk_gated_delta_product(q, k, v, g, beta, 2))
    say(f"naive loop B=1 T=1024 H=16 n=2 gated fwd: {t_naive:.1f} ms (ours {t_ours_small:.3f} ms)")

    # decode: batch 64, H=16, d=128, fp32 state, one token per step
    dec = []
    for n in (1, 2, 3):
        Bd = 64
        q, k, v, g, beta = inputs(Bd, 1, H, K, V, n, True, torch.bfloat16, dev)
        S = torch.randn(Bd, H, K, V, device=dev)
        t = bench(lambda: fused_recurrent_gated_delta_product(q, k, v, g, beta, n, initial_state=S,
                                                              output_final_state=True))
        floor = 2 * S.numel() * 4 / bw * 1e3
        dec.append(dict(n=n, ms=t, floor_ms=floor))
        say(f"decode n={n}: {t * 1e3:.1f} us/step (floor {floor * 1e3:.1f} us)")

    for n in parse(args.ns):
        for gated in (False, True):
            fb = bytes_fwd(B, T, H, K, V, n, gated) / bw * 1e3
            ff = flops_fwd(B, T, H, K, V, n) / mm * 1e3
            row = dict(n=n, gated=gated, floor_bytes_ms=fb, floor_flops_ms=ff)
            xs = inputs(B, T, H, K, V, n, gated, dtype, dev)
            with torch.no_grad():
                row["ours_fwd"] = bench(lambda: chunk_gated_delta_product(*xs, n))
                if fla_chunk is not None and n in parse(args.fla_ns):
                    try:
                        row["fla_fwd"] = bench(lambda: fla_chunk(*xs, n))
                    except Exception as e:  # noqa: BLE001
                        row["fla_fwd"] = f"error: {type(e).__name__}"
            xg = inputs(B, T, H, K, V, n, gated, dtype, dev, requires_grad=True)
            do = torch.randn(B, T, H, V, device=dev, dtype=dtype)

            def fb_ours():
                o, _ = chunk_gated_delta_product(*xg, n)
                o.backward(do)
            if n in parse(args.bwd_ns):
                row["ours_fwdbwd"] = bench(fb_ours, warmup=5, rep=50)
            if fla_chunk is not None and args.fla_bwd and n in parse(args.fla_ns):
                def fb_fla():
                    o, _ = fla_chunk(*xg, n)
                    o.backward(do)
                try:
                    row["fla_fwdbwd"] = bench(fb_fla, warmup=5, rep=50)
                except Exception as e:  # noqa: BLE001
                    row["fla_fwdbwd"] = f"error: {type(e).__name__}: {str(e)[:80]}"
            rows.append(row)
            say(json.dumps(row))
            with open(os.path.join(args.out, "kernels_rows.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")
            del xs, xg
            torch.cuda.empty_cache()

    with open(os.path.join(args.out, "kernels_bench.json"), "w") as f:
        json.dump(dict(rows=rows, decode=dec, bw=bw, mm=mm, log=log), f, indent=1)

    def fmt(x):
        return f"{x:.3f}" if isinstance(x, float) else ("—" if x is None else str(x))
    lines = ["| n_h | gated | ours fwd | fla fwd | fla/ours | ours fwd+bwd | fla fwd+bwd | floor fwd (bytes / FLOPs) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["fla_fwd"] / r["ours_fwd"] if isinstance(r.get("fla_fwd"), float) else None
        lines.append(f"| {r['n']} | {r['gated']} | {fmt(r['ours_fwd'])} | {fmt(r.get('fla_fwd'))} | "
                     f"{fmt(ratio)} | {fmt(r.get('ours_fwdbwd'))} | {fmt(r.get('fla_fwdbwd'))} | "
                     f"{r['floor_bytes_ms']:.3f} / {r['floor_flops_ms']:.3f} |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.out, "kernels_bench.md"), "w") as f:
        f.write("\n".join(log) + "\n\n" + table + "\n")


if __name__ == "__main__":
    main()

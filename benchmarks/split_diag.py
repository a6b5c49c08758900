"""Which autotune configs of the split backward fault on the H200, and how fast each passing one is.
   python3 benchmarks/split_diag.py check   (env DPX_AUTOTUNE_PIN=... DPX_KERNEL_SYNC=1)  -> one JSON line
   python3 benchmarks/split_diag.py time    (env pins)                                     -> one JSON line"""
import json, os, sys, time
import torch, triton
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from dpx.kernels.delta_product.chunk_bwd import chunk_dp_bwd_dqkwg, chunk_dp_bwd_dv_local
from dpx.kernels.delta_product.chunk_bwd_split import chunk_dp_bwd_dqkwg_split
from dpx.kernels.delta_product.chunk_h import chunk_dp_bwd_dh, chunk_dp_fwd_h
from dpx.kernels.delta_product.index import chunk_table
from dpx.kernels.delta_product.wy_fast import chunk_dp_fwd_prepare

def setup(B, T, H, K, V, n, gated, seed=0):
    dev, dt = os.environ.get("DIAG_DEV", "cuda"), (torch.bfloat16 if not os.environ.get("DIAG_DEV") else torch.float16)
    gen = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(B * T, H, K, device=dev, generator=gen).to(dt)
    k = torch.nn.functional.normalize(torch.randn(B * T * n, H, K, device=dev, generator=gen), dim=-1).to(dt)
    v = torch.randn(B * T * n, H, V, device=dev, generator=gen).to(dt)
    beta = (2 * torch.rand(B * T * n, H, device=dev, generator=gen)).to(dt)
    g = torch.nn.functional.logsigmoid(torch.randn(B * T, H, device=dev, generator=gen)).float() if gated else None
    do = torch.randn(B * T, H, V, device=dev, generator=gen).to(dt)
    tab = chunk_table(B, T, n, dev)
    sc, p = K ** -0.5, "tf32"
    w, u, gamma, G, t = chunk_dp_fwd_prepare(k, v, beta, g, tab, p, store_t=True)
    h, vn, _ = chunk_dp_fwd_h(w, u, k, G, gamma, None, tab, False, dt, p, g is not None)
    dvl = chunk_dp_bwd_dv_local(q, k, G, do, tab, sc, p)
    dh, dvn, _ = chunk_dp_bwd_dh(q, do, w, k, gamma, G, dvl, None, tab, sc, False, p, g is not None)
    return (q, k, v, beta, G, t, h, dh, vn, dvn, do, tab, sc, g is not None, p)

def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()

mode = sys.argv[1]
out = {"pin": os.environ.get("DPX_AUTOTUNE_PIN", "")}
if mode == "check":
    shapes = [(1, 100, 2, 128, 128, 2, True)] if os.environ.get("DIAG_DEV") else [(1, 1000, 4, 128, 128, n, gd) for n in (1, 2, 3) for gd in (False, True)] + \
             [(1, 1000, 4, 64, 64, 2, True), (2, 300, 4, 32, 32, 2, True), (1, 500, 4, 128, 128, 4, True)]
    errs = {}
    for s in shapes:
        try:
            a = setup(*s)
            ref = chunk_dp_bwd_dqkwg(*a)
            got = chunk_dp_bwd_dqkwg_split(*a)
            torch.cuda.synchronize() if torch.cuda.is_available() else None
            errs[str(s)] = max(rel(x, y) for x, y in zip(got, ref) if x is not None)
        except Exception as e:
            errs[str(s)] = "FAULT " + str(e)[:160]
            break
    out["errs"] = errs
else:
    from dpx.kernels.delta_product import chunk_bwd_split as sp
    from dpx.kernels.utils import autotuner
    combos = [tuple(map(int, c.split("."))) for c in sys.argv[2].split(",") if c]
    at_k, at_w = autotuner(sp.chunk_dp_bwd_kernel_dqkw), autotuner(sp.chunk_dp_bwd_kernel_wy)
    all_k, all_w = list(at_k.configs), list(at_w.configs)
    out["configs"] = {"dqkw": [str(c) for c in all_k], "wy": [str(c) for c in all_w]}
    big = [(4, 4096, 16, 128, 128, n, gd) for n in (1, 2, 3) for gd in (False, True)]
    if os.environ.get("DIAG_DEV"):
        big = [(1, 64, 2, 128, 128, 2, True)]
        triton.testing.do_bench = lambda fn, quantiles=None: (fn(), 0.0)[1]
    for s in big:
        a = setup(*s)
        key = f"n{s[5]}{'g' if s[6] else ''}"
        out[key] = {"fused": triton.testing.do_bench(lambda: chunk_dp_bwd_dqkwg(*a), quantiles=[0.5])}
        at_k.configs, at_w.configs = [all_k[combos[0][0]]], [all_w[combos[0][1]]]
        at_k.cache, at_w.cache = {}, {}
        dq, dko, dw, dgp = sp.chunk_dp_bwd_dqkw(*a[:1], *a[1:2], a[4], a[6], a[7], a[8], a[9], a[10], a[11], a[12],
                                                a[13], a[14])
        for i, j in combos:
            at_k.configs, at_w.configs = [all_k[i]], [all_w[j]]
            at_k.cache, at_w.cache = {}, {}
            out[key][f"dqkw{i}"] = triton.testing.do_bench(
                lambda: sp.chunk_dp_bwd_dqkw(a[0], a[1], a[4], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13],
                                             a[14]), quantiles=[0.5])
            out[key][f"wy{j}"] = triton.testing.do_bench(
                lambda: sp.chunk_dp_bwd_wy(a[1], a[2], a[3], a[4], a[5], dw, a[9], dko, dgp, a[11], a[13], a[14]),
                quantiles=[0.5])
            out[key][f"split{i}.{j}"] = triton.testing.do_bench(lambda: chunk_dp_bwd_dqkwg_split(*a), quantiles=[0.5])
        print(json.dumps({key: out[key]}), flush=True)
        del a
print(json.dumps(out), flush=True)

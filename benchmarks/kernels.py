"""DeltaProduct kernel benchmark on one GPU: dpx Triton vs fla-core (optional) vs the naive loop, with floors.

    python benchmarks/kernels.py [--out DIR] [--ns 1,2,3,4] [--bwd-ns ...] [--fla-ns ...] [--fla-bwd] [--stages]
                                 [--decode-sweep]

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
except ImportError:  # repo checkout without `pip install -e .`: expose kernels/ as dpx.kernels
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dpx_checkout import expose_kernels
    expose_kernels()
    from dpx.kernels import chunk_gated_delta_product, fused_recurrent_gated_delta_product, gated_delta_product
    from dpx.kernels.delta_product.naive import naive_recurrent_gated_delta_product

# fla's autotuners (built at its import, after ours) keep their results on disk for this run, so its first-call
# autotuning (137 s for the n_h = 1 rows on the H200, session 6) is paid once, not again for every n_h row; ours
# were built above without it and autotune per row, as a user's first call does
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
try:
    from fla.ops.gated_delta_product import chunk_gated_delta_product as fla_chunk
except Exception as e:  # noqa: BLE001 - fla is optional
    fla_chunk, FLA_ERR = None, repr(e)


def triton_cache_dir() -> str:
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def bench(fn, warmup=25, rep=100):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5])


def with_env(name, value, fn):
    """fn() with os.environ[name] = value, the variable restored (or removed) afterwards."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        return fn()
    finally:
        os.environ.pop(name, None)
        if old is not None:
            os.environ[name] = old


def warmed(fn, calls=3):
    """fn after `calls` untimed calls, so that no backward kernel autotunes inside a timing (a precaution: session 11's
    ours_fwdbwd_repeat column, the default timed again last in each row, agreed with the first within 0.5 %; the
    3.42 against 3.18 ms it first looked like an order effect was DPX_KERNEL_SAVE_STATES=1 taking effect)."""
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return fn


def peak_mib(fn):
    """Peak memory allocated during one call of fn, above what was allocated before it (MiB)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def bench_graph(fn, steps=16):
    """Median time of one call of fn when `steps` calls are replayed from a CUDA graph (no host overhead)."""
    fn()  # autotune and compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(steps):
            fn()
    return bench(graph.replay) / steps


def decode_sweep(q, k, v, g, beta, n, S):
    """Graph time of the decode kernel for each (BV, num_warps), bypassing the autotuner."""
    from dpx.kernels.delta_product import fused_recurrent as fr
    jit = fr.fused_recurrent_dp_fwd_kernel.fn.fn  # heuristics -> autotuner -> JITFunction
    B_, T_, H_, K_ = q.shape
    V_ = v.shape[-1]
    o = torch.empty(B_, T_, H_, V_, device=q.device, dtype=q.dtype)
    ht = torch.empty_like(S)
    out = {}
    for bv, w in [(bv, w) for bv in (16, 32, 64) for w in (1, 2, 4, 8)] + [(128, 4), (128, 8)]:
        launch = lambda: jit[(triton.cdiv(V_, bv), B_ * H_)](
            q, k, v, g, beta, o, S, ht, None, K_ ** -0.5, T_, H=H_, K=K_, V=V_, NH=n, BK=K_, BV=bv,
            USE_L2NORM=False, USE_G=True, USE_INITIAL_STATE=True, STORE_FINAL_STATE=True, IS_VARLEN=False,
            num_warps=w)
        try:
            out[f"BV{bv}/w{w}"] = bench_graph(launch)
        except Exception as e:  # noqa: BLE001 - a config that does not compile (registers) is skipped
            print(f"decode config {(bv, w)}: {type(e).__name__}")
    return out


def stage_inputs(B, T, H, K, V, n, gated, dtype, dev) -> dict:
    """The flat inputs and every intermediate of one forward + backward (the arguments each stage kernel takes),
    for timing the stages alone (here and in kernel_configs.py)."""
    from dpx.kernels.delta_product.chunk_bwd import chunk_dp_bwd_dv_local
    from dpx.kernels.delta_product.chunk_h import chunk_dp_bwd_dh, chunk_dp_fwd_h
    from dpx.kernels.delta_product.index import chunk_table
    from dpx.kernels.delta_product.wy_fast import chunk_dp_fwd_prepare
    q, k, v, g, beta = inputs(B, T, H, K, V, n, gated, dtype, dev)
    q, k, v, beta = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), beta.flatten(0, 1)
    g = None if g is None else g.flatten(0, 1)
    do = torch.randn_like(v[: q.shape[0]])
    tab = chunk_table(B, T, n, dev)
    sc, p = K ** -0.5, "tf32"
    ug = g is not None
    w, u, gamma, G, t = chunk_dp_fwd_prepare(k, v, beta, g, tab, p, store_t=True)
    h, vn, _ = chunk_dp_fwd_h(w, u, k, G, gamma, None, tab, False, dtype, p, ug)
    dvl = chunk_dp_bwd_dv_local(q, k, G, do, tab, sc, p)
    dh, dvn, _ = chunk_dp_bwd_dh(q, do, w, k, gamma, G, dvl, None, tab, sc, False, p, ug)
    return dict(q=q, k=k, v=v, g=g, beta=beta, do=do, tab=tab, sc=sc, p=p, w=w, u=u, gamma=gamma, G=G, t=t,
                h=h, vn=vn, dvl=dvl, dh=dh, dvn=dvn)


def stage_times(B, T, H, K, V, n, gated, dtype, dev):
    """Each forward and backward kernel timed on its own (ms), to see what limits the total. The per-chunk gradients
    are the kernel(s) DPX_KERNEL_DQKWG selects (as chunk_dp_bwd does): the fused one, or the split pair (timed
    together and each half alone)."""
    from dpx.kernels.delta_product.chunk import dqkwg_kernel
    from dpx.kernels.delta_product.chunk_bwd import chunk_dp_bwd_dqkwg, chunk_dp_bwd_dv_local
    from dpx.kernels.delta_product.chunk_bwd_split import chunk_dp_bwd_dqkw, chunk_dp_bwd_dqkwg_split, chunk_dp_bwd_wy
    from dpx.kernels.delta_product.chunk_h import chunk_dp_bwd_dh, chunk_dp_fwd_h
    from dpx.kernels.delta_product.chunk_o import chunk_dp_fwd_o
    from dpx.kernels.delta_product.wy_fast import chunk_dp_fwd_inv, chunk_dp_fwd_prepare, chunk_dp_fwd_wu
    x = stage_inputs(B, T, H, K, V, n, gated, dtype, dev)
    q, k, v, g, beta, do, tab, sc, p = (x[nm] for nm in ("q", "k", "v", "g", "beta", "do", "tab", "sc", "p"))
    w, u, gamma, G, t, h, vn, dvl, dh, dvn = (x[nm] for nm in ("w", "u", "gamma", "G", "t", "h", "vn", "dvl", "dh",
                                                                "dvn"))
    ug = g is not None
    if dqkwg_kernel(torch.device(dev)) == "split":  # refused where its gradients are wrong (split_refusal)
        _, dko, dw, dgp = chunk_dp_bwd_dqkw(q, k, G, h, dh, vn, dvn, do, tab, sc, ug, p)
        dqkwg = {
            "bwd_dqkwg (split: dqkw + wy)": bench(lambda: chunk_dp_bwd_dqkwg_split(q, k, v, beta, G, t, h, dh, vn, dvn,
                                                                                  do, tab, sc, ug, p)),
            "bwd_dqkw (split, K-blocked)": bench(lambda: chunk_dp_bwd_dqkw(q, k, G, h, dh, vn, dvn, do, tab, sc, ug,
                                                                           p)),
            "bwd_wy (split, WY backward)": bench(lambda: chunk_dp_bwd_wy(k, v, beta, G, t, dw, dvn, dko, dgp, tab, ug,
                                                                         p)),
        }
    else:
        dqkwg = {"bwd_dqkwg": bench(lambda: chunk_dp_bwd_dqkwg(q, k, v, beta, G, t, h, dh, vn, dvn, do, tab,
                                                                       sc, ug, p))}
    from dpx.kernels.delta_product.chunk import fwd_kernel
    extra = {}
    if n > 1 and fwd_kernel() == "super":  # DPX_KERNEL_FWD=super: both of chunk_super's kernels, vs fwd_h + fwd_o
        from dpx.kernels.delta_product.chunk_super import chunk_dp_fwd_h_o_super
        extra["fwd_h + fwd_o (super-chunks)"] = bench(lambda: chunk_dp_fwd_h_o_super(q, k, w, u, gamma, G, None,
                                                                                   tab, sc, False, p, ug))
    from dpx.kernels.delta_product import chunk_o as _chunk_o
    if n > 1 and hasattr(_chunk_o, "chunk_dp_fwd_o_tok"):  # (benchmarks/pending/tok.patch) the output kernel over
        # super-chunks: over the walk's per-chunk states (training) and over chunk_super's walk (no gradient wanted)
        from dpx.kernels.delta_product.chunk_o import chunk_dp_fwd_o_tok
        from dpx.kernels.delta_product.chunk_super import chunk_dp_fwd_h_super
        hs, vns, _ = chunk_dp_fwd_h_super(w, u, k, G, gamma, None, tab, False, dtype, p, ug)
        extra["fwd_o_tok (per-chunk states: training)"] = bench(
            lambda: chunk_dp_fwd_o_tok(q, k, G, h, vn, tab, sc, p, ug, per_chunk=True))
        extra["fwd_h_super (no-grad walk)"] = bench(
            lambda: chunk_dp_fwd_h_super(w, u, k, G, gamma, None, tab, False, dtype, p, ug))
        extra["fwd_o_tok (super-chunk states: no grad)"] = bench(
            lambda: chunk_dp_fwd_o_tok(q, k, G, hs, vns, tab, sc, p, ug, per_chunk=False))
    return {
        **extra,
        "prepare (inv + wu)": bench(lambda: chunk_dp_fwd_prepare(k, v, beta, g, tab, p)),
        "inv (T = (I+A)^-1)": bench(lambda: chunk_dp_fwd_inv(k, beta, g, tab)),
        "wu (W, U from T; the backward's recompute)": bench(lambda: chunk_dp_fwd_wu(k, v, beta, G, t, tab, p)),
        "fwd_h": bench(lambda: chunk_dp_fwd_h(w, u, k, G, gamma, None, tab, False, dtype, p, ug)),
        "fwd_o": bench(lambda: chunk_dp_fwd_o(q, k, G, h, vn, tab, sc, p)),
        "bwd_dv_local": bench(lambda: chunk_dp_bwd_dv_local(q, k, G, do, tab, sc, p)),
        "bwd_dh": bench(lambda: chunk_dp_bwd_dh(q, do, w, k, gamma, G, dvl, None, tab, sc, False, p, ug)),
        **dqkwg,
    }


def fla_forward_stages(B, T, H, K, V, n, gated, dtype, dev) -> dict:
    """fla's forward kernels on the same inputs as ours, each as a zero-argument call in the forward's order (each
    run once here, so the next one has its inputs; the calls are warm after this). fla runs DeltaProduct as the
    delta rule over the T*n interleaved steps (kkt, solve_tril, recompute_w_u on 64-step chunks), then its
    DeltaProduct state and output kernels."""
    from fla.ops.common.chunk_scaled_dot_kkt import chunk_scaled_dot_kkt_fwd
    from fla.ops.delta_rule.wy_fast import recompute_w_u_fwd as dn_wu
    from fla.ops.gated_delta_product.chunk_deltaproduct_h import chunk_gated_delta_product_fwd_h
    from fla.ops.gated_delta_product.chunk_deltaproduct_o import chunk_gated_delta_product_fwd_o
    from fla.ops.gated_delta_rule.wy_fast import recompute_w_u_fwd as gdn_wu
    from fla.ops.utils import chunk_local_cumsum, solve_tril
    from fla.ops.utils.constant import RCP_LN2
    q, k, v, g, beta = inputs(B, T, H, K, V, n, gated, dtype, dev)
    calls = {}
    gi = None
    if gated:
        g_il = g.new_zeros(B, T, n, H)
        g_il[:, :, 0] = g
        g_il = g_il.flatten(1, 2).contiguous()
        g_tok = g
        calls["cumsum"] = cs = lambda: (
            chunk_local_cumsum(g_tok, chunk_size=64, scale=RCP_LN2, output_dtype=torch.float32),
            chunk_local_cumsum(g_il, chunk_size=64, scale=RCP_LN2, output_dtype=torch.float32))
        g, gi = cs()
    calls["kkt"] = kkt = lambda: chunk_scaled_dot_kkt_fwd(k=k, g=gi, beta=beta, output_dtype=torch.float32)
    A = kkt()
    calls["solve_tril"] = st = lambda: solve_tril(A=A, output_dtype=k.dtype)
    Ai = st()
    calls["recompute_w_u"] = wu = (lambda: gdn_wu(k=k, v=v, beta=beta, A=Ai, g=gi)) if gated else \
        (lambda: dn_wu(k=k, v=v, beta=beta, A=Ai, cu_seqlens=None))
    w, u = wu()
    calls["fwd_h"] = fh = lambda: chunk_gated_delta_product_fwd_h(k=k, w=w, u=u, g=gi, initial_state=None,
                                                                  output_final_state=False, num_householder=n)
    h, v_new, _ = fh()
    calls["fwd_o"] = fo = lambda: chunk_gated_delta_product_fwd_o(q=q, k=k, v=v_new, h=h, g=g, scale=K ** -0.5,
                                                                  num_householder=n)
    fo()
    return calls


def fla_stage_times(B, T, H, K, V, n, gated, dtype, dev):
    """fla's forward kernels, each alone (ms), on the same inputs as ours: where its forward is faster than ours."""
    return {name: bench(fn) for name, fn in fla_forward_stages(B, T, H, K, V, n, gated, dtype, dev).items()}


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


def _dpx_autotuners():
    """(kernel name, Autotuner) of every autotuned dpx kernel imported so far (also under @triton.heuristics)."""
    from dpx.kernels.utils import autotuner, kernel_name  # unwraps @heuristics down to the Autotuner
    for name, mod in list(sys.modules.items()):
        if not name.startswith("dpx.kernels") or mod is None:
            continue
        for obj in vars(mod).values():
            at = autotuner(obj)
            if at is not None:
                yield kernel_name(obj), at


def reset_dpx_autotune() -> int:
    """Forget every dpx kernel's autotuned picks, so the next call tunes at its own shape. The kernels' autotune keys
    name head dims, head count and dtype, not the number of sequences or chunks: a pick made at the small shape of
    the correctness check or the naive-loop row (B=1, T=1024) was reused at B=4, T=4096, where fwd_h at n_h = 3 then
    took 0.568 ms against 0.408 for its best config (H200, session 9). A training run tunes at its own shape on its
    first step, so each timed (n_h, gated) shape starts fresh, its main row and stage row sharing the picks
    (--keep-autotune: never reset). Returns the kernels reset."""
    n = 0
    for _, at in _dpx_autotuners():
        if at.cache:
            at.cache.clear()
            n += 1
    return n


def dpx_autotune_picks() -> dict:
    """Every dpx kernel's current autotune picks, {kernel: {key: config}} as strings: what the timed row ran with,
    and under "timings" {config: [median, p20, p80] ms} of the kernel's last tuning (Triton keeps it as
    configs_timings). Recorded per row because a pick can differ between runs at the same shape and sha (inv at
    n_h = 3: 0.579 against 0.438 ms, H200, session 13; session 8's sweep has 4 warps at 0.577 and 2 at 0.440 there),
    and only the pick and its timings say whether the tuning measured wrong or the kernel ran slow."""
    picks = {}
    for name, at in _dpx_autotuners():
        if at.cache:
            picks[name] = {str(k): str(c) for k, c in at.cache.items()}
            timings = getattr(at, "configs_timings", None) or {}
            if timings:
                picks[name]["timings"] = {str(c): t for c, t in timings.items()}
    return picks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ns", default="1,2,3,4", help="n_h values for our kernel")
    ap.add_argument("--bwd-ns", default="1,2,3,4", help="n_h values timed forward+backward")
    ap.add_argument("--fla-ns", default="1,2,3,4", help="n_h values timed with fla (its autotuning takes minutes)")
    ap.add_argument("--no-check", action="store_true", help="skip the bf16-vs-fp32 correctness check")
    ap.add_argument("--fla-bwd", action="store_true", help="also time fla's forward+backward")
    ap.add_argument("--stages", action="store_true", help="time each forward/backward kernel alone (--bwd-ns)")
    ap.add_argument("--fla-stages", action="store_true", help="time fla's forward kernels alone (--fla-ns)")
    ap.add_argument("--dqkwg", default="",
                    help="comma list of DPX_KERNEL_DQKWG values (fused,split): stages and forward+backward rows are "
                         "timed under each, in this one process (default: the environment's)")
    ap.add_argument("--autotune-cache", default="",
                    help="a .tgz of Triton *.autotune.json files (from --save-autotune-cache on the same image and GPU) "
                         "unpacked into the Triton cache first: fla then skips its first-call autotuning (137-150 s "
                         "per n_h row on the H200); results/kernels_h200_s7/fla_autotune_cache_h200_triton360.tgz "
                         "holds fla's for this script's shape at n_h 1-3 (Triton 3.6.0, fla-core 0.6.0)")
    ap.add_argument("--save-autotune-cache", default="", help="write the Triton cache's *.autotune.json files here")
    ap.add_argument("--decode-sweep", action="store_true", help="time the decode kernel at every (BV, warps)")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode timings")
    ap.add_argument("--bwd-fp32", choices=("0", "1", "default"), default="0",
                    help="DPX_KERNEL_BWD_FP32 for the timed backward: 0 = the 16-bit kernels (default here: they are "
                         "what is benchmarked), 1 = the float32 backward, default = the library's choice per n_h")
    ap.add_argument("--also-env", action="append", default=[], metavar="NAME=VALUE",
                    help="time each forward+backward row again with this variable set (read by the kernels at each "
                         "call, e.g. DPX_KERNEL_SAVE_STATES=1), in the same process, as column ours_fwdbwd[NAME=VALUE]; "
                         "each forward+backward column also gets its peak memory (MiB) in ours_peak_mib[...]")
    ap.add_argument("--keep-autotune", action="store_true",
                    help="keep the autotuned picks across rows (default: reset when the timed (n_h, gated) shape "
                         "changes, see reset_dpx_autotune)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)  # --out $OUT/sub: the folder may not exist yet (lost a GPU call once)
    if args.autotune_cache:
        import tarfile
        with tarfile.open(args.autotune_cache) as tf:
            tf.extractall(triton_cache_dir(), filter="data")
    if args.bwd_fp32 == "default":
        os.environ.pop("DPX_KERNEL_BWD_FP32", None)
    else:
        os.environ["DPX_KERNEL_BWD_FP32"] = args.bwd_fp32
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
    say(f"backward: DPX_KERNEL_BWD_FP32={os.environ.get('DPX_KERNEL_BWD_FP32', 'unset (per n_h)')}, "
        f"DPX_KERNEL_DQKWG={os.environ.get('DPX_KERNEL_DQKWG', 'unset (fused)')}")

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
        o2, ht2 = gated_delta_product(q, k, v, g, beta, num_householder=n, initial_state=h1, output_final_state=True,
                                       impl="torch")
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
    naive_recurrent_gated_delta_product(q, k, v, g, beta, num_householder=2)
    torch.cuda.synchronize()
    t_naive = (time.perf_counter() - t0) * 1e3
    with torch.no_grad():
        t_ours_small = bench(lambda: chunk_gated_delta_product(q, k, v, g, beta, 2))
    say(f"naive loop B=1 T=1024 H=16 n=2 gated fwd: {t_naive:.1f} ms (ours {t_ours_small:.3f} ms)")

    # decode: batch 64, H=16, d=128, fp32 state, one token per step. "eager" is one Python call per step (host
    # overhead included); "graph" replays 16 steps captured in a CUDA graph (what a serving loop does), per step.
    dec = []
    for n in () if args.no_decode else (1, 2, 3):
        Bd = 64
        q, k, v, g, beta = inputs(Bd, 1, H, K, V, n, True, torch.bfloat16, dev)
        S = torch.randn(Bd, H, K, V, device=dev)
        step = lambda: fused_recurrent_gated_delta_product(q, k, v, g, beta, num_householder=n, initial_state=S,
                                                           output_final_state=True)
        t = bench(step)
        t_graph = bench_graph(step)
        floor = 2 * S.numel() * 4 / bw * 1e3
        best = decode_sweep(q, k, v, g, beta, n, S) if args.decode_sweep else None
        dec.append(dict(n=n, ms=t, graph_ms=t_graph, floor_ms=floor, sweep=best))
        say(f"decode n={n}: eager {t * 1e3:.1f} us/step, graph {t_graph * 1e3:.1f} us/step (floor {floor * 1e3:.1f} us)"
            + ("" if best is None else "; graph us by config: " +
               ", ".join(f"{c}: {x * 1e3:.1f}" for c, x in sorted(best.items(), key=lambda kv: kv[1]))))

    dqkwgs = [x for x in args.dqkwg.split(",") if x] or [None]

    def with_dqkwg(choice, fn):
        return fn() if choice is None else with_env("DPX_KERNEL_DQKWG", choice, fn)

    stages = []
    tuned_at = [None]

    def tune_at(key):
        """Forget dpx's autotuned picks when the timed shape changes (not between a shape's main row and its stage
        row: they time the same calls, and tuning costs 20-40 s a shape on the H200)."""
        if args.keep_autotune or tuned_at[0] == key:
            return 0
        tuned_at[0] = key
        return reset_dpx_autotune()

    def stage_rows(n, gated):
        for choice in dqkwgs:
            tune_at((n, gated))
            st = with_dqkwg(choice, lambda: stage_times(B, T, H, K, V, n, gated, dtype, dev))
            stages.append(dict(who="dpx", n=n, gated=gated, dqkwg=choice or "env", ms=st,
                               autotune_picks=dpx_autotune_picks()))
            with open(os.path.join(args.out, "kernels_stages.jsonl"), "a") as f:
                f.write(json.dumps(stages[-1]) + "\n")
            say(f"stages n={n} gated={gated} dqkwg={choice or 'env'} (ms): " + ", ".join(
                f"{kk} {vv:.3f}" for kk, vv in st.items()))

    # per (n_h, gated): the main row first (the headline, if a timeout cuts the run), then its stage row
    all_ns = list(dict.fromkeys(parse(args.ns) + (parse(args.bwd_ns) if args.stages else [])))
    for n in all_ns:
        for gated in (False, True):
            if n not in parse(args.ns):
                stage_rows(n, gated)
                continue
            fb = bytes_fwd(B, T, H, K, V, n, gated) / bw * 1e3
            ff = flops_fwd(B, T, H, K, V, n) / mm * 1e3
            row = dict(n=n, gated=gated, floor_bytes_ms=fb, floor_flops_ms=ff)
            xs = inputs(B, T, H, K, V, n, gated, dtype, dev)
            row["autotune_reset"] = tune_at((n, gated))
            with torch.no_grad():
                row["ours_fwd"] = bench(lambda: chunk_gated_delta_product(*xs, n))
                if fla_chunk is not None and n in parse(args.fla_ns):
                    try:
                        row["fla_fwd"] = bench(lambda: fla_chunk(*xs, n))
                    except Exception as e:  # noqa: BLE001
                        row["fla_fwd"] = f"error: {type(e).__name__}"
            xg = inputs(B, T, H, K, V, n, gated, dtype, dev, requires_grad=True)
            do = torch.randn(B, T, H, V, device=dev, dtype=dtype)
            # the forward of a training step (a gradient wanted: it keeps the chunk states for the backward);
            # ours_fwd above is the inference forward (no_grad), as fla_fwd
            row["ours_fwd_train"] = bench(lambda: chunk_gated_delta_product(*xg, n))

            def fb_ours():
                o, _ = chunk_gated_delta_product(*xg, n)
                o.backward(do)
            if n in parse(args.bwd_ns):
                for choice in dqkwgs:
                    t_fb = with_dqkwg(choice, lambda: bench(warmed(fb_ours), warmup=5, rep=50))
                    row["ours_fwdbwd" if choice is None else f"ours_fwdbwd_{choice}"] = t_fb
                if "ours_fwdbwd" not in row:  # the library's default choice, named as the table's column
                    row["ours_fwdbwd"] = row.get("ours_fwdbwd_fused", row.get(f"ours_fwdbwd_{dqkwgs[0]}"))
                row["ours_peak_mib[default]"] = peak_mib(fb_ours)
                for assign in args.also_env:  # same inputs, same picks: only the variable differs
                    name, _, value = assign.partition("=")
                    row[f"ours_fwdbwd[{assign}]"] = with_env(name, value, lambda: bench(fb_ours, warmup=5, rep=50))
                    row[f"ours_peak_mib[{assign}]"] = with_env(name, value, lambda: peak_mib(fb_ours))
                if args.also_env:  # the default again, after the variants: an order effect shows as a difference
                    row["ours_fwdbwd_repeat"] = bench(fb_ours, warmup=5, rep=50)
            if fla_chunk is not None and args.fla_bwd and n in parse(args.fla_ns):
                def fb_fla():
                    o, _ = fla_chunk(*xg, n)
                    o.backward(do)
                try:
                    row["fla_fwdbwd"] = bench(warmed(fb_fla), warmup=5, rep=50)
                except Exception as e:  # noqa: BLE001
                    row["fla_fwdbwd"] = f"error: {type(e).__name__}: {str(e)[:80]}"
            say(json.dumps(row))
            row["autotune_picks"] = picks = dpx_autotune_picks()
            say(f"autotune picks n={n} gated={gated}: " + "; ".join(
                f"{k} {' | '.join(c for key, c in v.items() if key != 'timings')}" for k, v in sorted(picks.items())))
            rows.append(row)
            with open(os.path.join(args.out, "kernels_rows.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")
            del xs, xg
            torch.cuda.empty_cache()
            if args.stages and n in parse(args.bwd_ns):
                stage_rows(n, gated)

    if args.fla_stages and fla_chunk is not None:
        for n in parse(args.fla_ns):
            for gated in (False, True):
                try:
                    st = fla_stage_times(B, T, H, K, V, n, gated, dtype, dev)
                except Exception as e:  # noqa: BLE001
                    st = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
                stages.append(dict(who="fla", n=n, gated=gated, ms=st))
                with open(os.path.join(args.out, "kernels_stages.jsonl"), "a") as f:
                    f.write(json.dumps(stages[-1]) + "\n")
                say(f"fla stages n={n} gated={gated} (ms): " + ", ".join(
                    f"{kk} {vv:.3f}" if isinstance(vv, float) else f"{kk} {vv}" for kk, vv in st.items()))

    if args.save_autotune_cache:
        import tarfile
        root = triton_cache_dir()
        with tarfile.open(args.save_autotune_cache, "w:gz") as tf:
            for dirpath, _, files in os.walk(root):
                for fn in files:
                    if fn.endswith(".autotune.json"):
                        full = os.path.join(dirpath, fn)
                        tf.add(full, arcname=os.path.relpath(full, root))

    with open(os.path.join(args.out, "kernels_bench.json"), "w") as f:
        json.dump(dict(rows=rows, decode=dec, stages=stages, bw=bw, mm=mm, log=log), f, indent=1)

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

"""Chunkwise (Gated) DeltaProduct in Triton: forward kernels and a torch.autograd.Function.

Forward (three kernels, no interleaved query or gate tensors):
  wy_fast.chunk_dp_fwd_inv       per chunk: gate cumsum, A = beta k k^T decay, T = (I+A)^-1 by 16x16 blocks
  wy_fast.chunk_dp_fwd_wu        per chunk: W = T X, U = T Y (64-row products from T as one tile)
  chunk_h.chunk_dp_fwd_kernel_h  serial over chunks: h (state at each chunk start), v_new = U - W h, final state;
                                 Kd = exp(G_L - G) k formed from k as it walks (not stored)
  chunk_o.chunk_dp_fwd_o         per chunk: o = scale (exp(G) q h + (q k^T * decay) v_new), only T query rows
Backward (fla's split, specialised to DeltaProduct: only T query rows, gates once per token):
  wy_fast.wu + chunk_h (recompute)    W, U from the forward's saved T, and the chunk states h, v_new
  chunk_bwd.chunk_dp_bwd_dv_local     per chunk: dv_loc = scale P^T dO
  chunk_h.chunk_dp_bwd_kernel_dh      serial, reverse: dh (state gradient after each chunk), dv_new, dh0
  chunk_bwd.chunk_dp_bwd_dqkwg        per chunk: dq, dk, dv, dbeta, dg (W/U/Kd/P/T gradients stay in registers)
                                      DPX_KERNEL_DQKWG=split runs chunk_bwd_split's two kernels instead (opt-in:
                                      K-blocked dq/dk/dW, then the WY backward; same outputs; dqkwg_kernel;
                                      refused on Hopper with Triton < 3.7.1, where its gradients are wrong)
16-bit inputs: 16-bit operands and float32 accumulation throughout (as fla), forward and backward, at every n_h.
DPX_KERNEL_BWD_FP32=1 runs the backward of 16-bit inputs on float32 copies instead (float32 traffic, tf32x3 dots;
slower, kept as a switch for debugging); unset or 0, the 16-bit backward runs. The GPU acceptance check
(benchmarks/gpu_check.py, BENCHMARKS.md) verifies the 16-bit backward against float64 at n_h 1, 2, 3, 4, 8.
A float32 backward at head dim K > 128 does not fit a Hopper SM: the per-chunk gradient kernel keeps several
[64, K] float32 tiles in shared memory (262-524 KB against 227 KB per block for K = 256, every config; compiled for
sm_90 by benchmarks/kernel_resources.py). Such calls differentiate the PyTorch chunkwise form instead (torch_chunk,
recomputed under autograd): correct everywhere, several times slower; `backward_path` says which path a call takes.
"""
from __future__ import annotations

import os
import warnings
from typing import Optional

import torch
from torch import Tensor

from ..utils import contiguous, dot_precision, next_pow2
from .index import BL, chunk_table, tokens_per_chunk
from .naive import check_inputs, l2norm
from .chunk_h import chunk_dp_bwd_dh, chunk_dp_fwd_h

def chunk_dp_fwd(q, k, v, g, beta, h0, tab, scale, output_final_state, keep_states=False):
    """Flattened inputs: q [NTOK,H,K], k [NTOK*n,H,K], v [NTOK*n,H,V], beta [NTOK*n,H], g [NTOK,H] or None.
    Returns o, the final state and (T, G, gamma) for the backward, with keep_states (T, G, gamma, h, v_new): the
    chunk states and corrected values, so the backward need not walk the chunks again (keeps_states)."""
    from .chunk_o import chunk_dp_fwd_o
    from .wy_fast import chunk_dp_fwd_inv, chunk_dp_fwd_wu
    prec = dot_precision(q.dtype)
    t, G, gamma = chunk_dp_fwd_inv(k, beta, g, tab)
    w, u = chunk_dp_fwd_wu(k, v, beta, G, t, tab, prec)
    gated = g is not None
    kind = fwd_kernel() if tab.n > 1 else "chunk"  # at n_h 1 a super-chunk is a chunk: chunk_o's kernel
    if kind == "super":  # opt-in anchor: chunk_super's pair, one state per n chunks
        from .chunk_super import chunk_dp_fwd_h_o_super
        o, ht = chunk_dp_fwd_h_o_super(q, k, w, u, gamma, G, h0, tab, scale, output_final_state, prec, gated)
        return o, ht, (t, G, gamma)  # one state per n chunks: nothing per chunk to keep
    if kind == "tok" and not keep_states:  # no backward wants the chunk states: store one per super-chunk only
        from .chunk_o import chunk_dp_fwd_o_tok
        from .chunk_super import chunk_dp_fwd_h_super
        h, v_new, ht = chunk_dp_fwd_h_super(w, u, k, G, gamma, h0, tab, output_final_state, q.dtype, prec, gated)
        return chunk_dp_fwd_o_tok(q, k, G, h, v_new, tab, scale, prec, gated, per_chunk=False), ht, (t, G, gamma)
    h, v_new, ht = chunk_dp_fwd_h(w, u, k, G, gamma, h0, tab, output_final_state, q.dtype, prec, gated)
    if kind == "tok":  # the walk keeps every chunk's state (the backward reads them); the output reads one in n
        from .chunk_o import chunk_dp_fwd_o_tok
        o = chunk_dp_fwd_o_tok(q, k, G, h, v_new, tab, scale, prec, gated, per_chunk=True)
    else:
        o = chunk_dp_fwd_o(q, k, G, h, v_new, tab, scale, prec)
    return o, ht, (t, G, gamma) + ((h, v_new) if keep_states else ())


def chunk_dp_bwd(q, k, v, g, beta, h0, do, dht, tab, scale, wy=None):
    """wy = (T, G, gamma) from the forward, or (T, G, gamma, h, v_new) when it kept the chunk states (None:
    recomputed, as for the float32 copies of 16-bit inputs). Recompute W, U from T (64-row products) and, unless
    kept, the chunk states, then: dv_local (per chunk) -> dh (serial, reverse) -> dqkwg (per chunk). Returns (dq, dk,
    dv, dg, dbeta, dh0)."""
    from .chunk_bwd import chunk_dp_bwd_dqkwg, chunk_dp_bwd_dv_local
    from .wy_fast import chunk_dp_fwd_inv, chunk_dp_fwd_wu
    prec = dot_precision(q.dtype)
    t, G, gamma, *states = chunk_dp_fwd_inv(k, beta, g, tab) if wy is None else wy
    w, u = chunk_dp_fwd_wu(k, v, beta, G, t, tab, prec)
    gated = g is not None
    if states:  # the forward's own h and v_new: what the walk below would compute again, bit for bit
        h, v_new = states
    else:
        h, v_new, _ = chunk_dp_fwd_h(w, u, k, G, gamma, h0, tab, False, q.dtype, prec, gated)
    dv_loc = chunk_dp_bwd_dv_local(q, k, G, do, tab, scale, prec)
    dh, dv_new, dh0 = chunk_dp_bwd_dh(q, do, w, k, gamma, G, dv_loc, dht, tab, scale, h0 is not None, prec, gated)
    dqkwg = chunk_dp_bwd_dqkwg
    if dqkwg_kernel(q.device) == "split":
        from .chunk_bwd_split import chunk_dp_bwd_dqkwg_split as dqkwg
    dq, dk, dv, dbeta, dg = dqkwg(q, k, v, beta, G, t, h, dh, v_new, dv_new, do, tab, scale, g is not None, prec)
    return dq, dk, dv, dg, dbeta, dh0


FWD_KERNELS = ("tok", "chunk", "super")


def save_states() -> bool:
    """DPX_KERNEL_SAVE_STATES (read at each call; unset or 1: on, the default; 0: off): the forward keeps the chunk states
    h [NC,H,K,V] and the corrected values v_new [NC,H,64,V] for the backward, which then skips its second run of the
    state walk (chunk_dp_fwd_h: 0.27 / 0.42 ms of a 3.6 / 5.5-ms forward + backward at n_h 2 / 3, B=4 T=4096 H=16
    d=128 bf16 on the H200, BENCHMARKS.md session 10). The price is memory: per token and head, K*V/BT + 64*V/BT
    more elements kept (BT = 64 // n_h tokens a chunk), i.e. 1.0x / 1.2x / 1.3x the op's q, k, v at head dim 128
    and n_h 1 / 2 / 3, held only while autograd keeps the graph (the walk writes h and v_new for the output kernel
    anyway). On the H200 it made forward + backward 0.13 / 0.26 / 0.37 ms faster at n_h 1 / 2 / 3 with the op's peak
    memory unchanged (session 11); fla recomputes, as DPX_KERNEL_SAVE_STATES=0 does. Off for the float32 copies of
    16-bit inputs (they recompute everything in float32) and for the super-chunk forward (no per-chunk states)."""
    flag = os.environ.get("DPX_KERNEL_SAVE_STATES", "")
    if flag not in ("", "0", "1"):
        raise ValueError(f"DPX_KERNEL_SAVE_STATES: expected 0, 1 or unset, got {flag!r}")
    return flag != "0"


def keeps_states(dtype: torch.dtype, n: int, K: int) -> bool:
    """Whether a forward on `dtype` inputs (head dim K, padded) keeps h and v_new for its backward: save_states()
    on, a Triton backward that reuses the forward's T (not the float32 copies of 16-bit inputs, not torch_fp32), and
    the per-chunk forward (not super)."""
    if not save_states():
        return False
    path = backward_path(dtype, n, K)
    reuses = path == "triton" or (path == "triton_fp32" and dtype == torch.float32)
    # callers also ask whether a gradient is wanted at all (ChunkGatedDeltaProductFunction.forward, chunk_dp_apply)
    return reuses and not (n > 1 and fwd_kernel() == "super")


def _env_choice(name: str, choices: tuple[str, ...]) -> str:
    """The kernel switch `name` (read at each call): one of `choices`, the first when unset; loud on anything else."""
    flag = os.environ.get(name, "")
    if flag not in ("",) + choices:
        raise ValueError(f"{name}: expected {', '.join(choices)} or unset, got {flag!r}")
    return flag or choices[0]


def fwd_kernel() -> str:
    """Which state/output kernels the forward runs at n_h > 1, read at each call from DPX_KERNEL_FWD:
    "tok" (unset or "tok", the default): the output over super-chunks of n chunks (<= 64 tokens) in fla's layout,
        chunk_o.chunk_dp_fwd_kernel_o_tok; the walk keeps every chunk's state when the backward will read them
        (keeps_states and a gradient is wanted) and only one per super-chunk otherwise (chunk_super's walk);
    "chunk": chunk_h + chunk_o, one state per 64-step chunk and BT query rows (the default up to session 15);
    "super": chunk_super's walk and output kernels (an anchor; its output kernel is the slowest of the three).
    The backward is the same either way; n_h = 1 always runs chunk_o (a super-chunk is a chunk there)."""
    return _env_choice("DPX_KERNEL_FWD", FWD_KERNELS)


DQKWG_KERNELS = ("fused", "split")


def dqkwg_kernel(device: torch.device | None = None) -> str:
    """Which per-chunk gradient kernel the backward runs, read at each call from DPX_KERNEL_DQKWG: "fused" (unset
    or "fused": chunk_bwd.chunk_dp_bwd_kernel_dqkwg, the default, verified on the H200) or "split" (the two kernels
    of chunk_bwd_split, fla's K-blocked + WY-backward split; opt-in). On a Hopper GPU with Triton < 3.7.1 "split"
    raises (split_refusal): its gradients are wrong there."""
    choice = _env_choice("DPX_KERNEL_DQKWG", DQKWG_KERNELS)
    if choice == "split" and device is not None:
        why = split_refusal(device)
        if why:
            raise RuntimeError(why)
    return choice


def split_refusal(device: torch.device) -> str | None:
    """Why DPX_KERNEL_DQKWG=split must not run on `device`, or None. On the H200 (Triton 3.6.0, 2026-12-01) the split
    kernels gave gradients off by 5e-2 (n_h 1) to 1.2 (n_h 2, gated) relative to the fused kernel, and an illegal
    memory access at n_h 3 with gates, with every autotune config pinned in turn. Both halves have the shape of the
    two Triton miscompiles on Hopper that fla works around (fla #640: a dq/dk/dg kernel over 64-wide K blocks,
    fixed in Triton 3.7.1; fla #984: the WY backward at 64-row chunks). DPX_KERNEL_DQKWG_FORCE=1 runs it anyway
    (to reproduce the fault)."""
    if device.type != "cuda" or os.environ.get("DPX_KERNEL_DQKWG_FORCE", "0") == "1":
        return None
    import triton
    major = torch.cuda.get_device_capability(device)[0]
    version = tuple(int(x) for x in triton.__version__.split("+")[0].split(".")[:3] if x.isdigit())
    if major == 9 and version < (3, 7, 1):
        return (f"DPX_KERNEL_DQKWG=split: its gradients are wrong on Hopper with Triton {triton.__version__} (< 3.7.1; "
                "measured on the H200, see BENCHMARKS.md); unset it to run the fused kernel, or set "
                "DPX_KERNEL_DQKWG_FORCE=1 to reproduce the fault")
    return None


FP32_BWD_MAX_K = 128  # widest head dim whose float32 backward tiles fit Hopper's shared memory (see the docstring)


def backward_path(dtype: torch.dtype, n: int, K: int) -> str:
    """Which backward a call with `dtype` inputs, n Householder steps and head dim K runs: "triton" (16-bit
    operands), "triton_fp32" (the Triton kernels on float32 copies) or "torch_fp32" (autograd through torch_chunk)."""
    if dtype == torch.float32 or _float32_backward(dtype):
        return "triton_fp32" if next_pow2(K) <= FP32_BWD_MAX_K else "torch_fp32"
    return "triton"


def _torch_backward(saved, need, tab, scale, cu_seqlens, do, dht):
    """Gradients by autograd through the PyTorch chunkwise form, recomputed from the saved inputs in float32."""
    from .torch_chunk import torch_chunk_gated_delta_product
    if do.is_cuda:  # Python's default filter shows a warning once per call site: once per process here
        warnings.warn("chunk_gated_delta_product: the float32 backward at head dim > 128 runs in PyTorch (its Triton "
                      "tiles exceed the GPU's shared memory): correct but several times slower; 16-bit inputs "
                      "keep the Triton backward", stacklevel=2)
    with torch.enable_grad():
        xs = [None if x is None else x.detach().float().requires_grad_(bool(r)) for x, r in zip(saved, need)]
        q, k, v, g, beta, h0 = xs
        o, ht = torch_chunk_gated_delta_product(q, k, v, g, beta, num_householder=tab.n, scale=scale,
                                                initial_state=h0, output_final_state=dht is not None,
                                                cu_seqlens=cu_seqlens)
        outs, gos = [o], [do.float()]
        if dht is not None:
            outs.append(ht)
            gos.append(dht.float())
        wrt = [x for x in xs if x is not None and x.requires_grad]
        got = iter(torch.autograd.grad(outs, wrt, gos, allow_unused=True))
    grads = [next(got) if x is not None and x.requires_grad else None for x in xs]
    return tuple(None if gx is None else gx.to(x.dtype) for gx, x in zip(grads, saved))


def _float32_backward(dtype: torch.dtype) -> bool:
    """Whether the backward of `dtype` inputs runs on float32 copies (DPX_KERNEL_BWD_FP32=1, 16-bit inputs)."""
    flag = os.environ.get("DPX_KERNEL_BWD_FP32", "")
    if flag not in ("", "0", "1"):
        raise ValueError(f"DPX_KERNEL_BWD_FP32: expected 0, 1 or unset, got {flag!r}")
    return dtype != torch.float32 and flag == "1"


class ChunkGatedDeltaProductFunction(torch.autograd.Function):

    @staticmethod
    @contiguous
    def forward(ctx, q, k, v, g, beta, h0, tab, scale, output_final_state, cu_seqlens):
        # the chunk states are kept only where a backward will read them (not under no_grad / for inference)
        keep = any(ctx.needs_input_grad[:6]) and keeps_states(q.dtype, tab.n, q.shape[-1])
        o, ht, wy = chunk_forward(q, k, v, g, beta, h0, tab, scale, output_final_state, keep)
        # T = (I+A)^-1 per chunk (half a key tensor in size at head dim 128) and the gate sums are kept, so the
        # backward re-runs only the 64-row products W = T X, U = T Y instead of the whole preparation (fla keeps A);
        # by default also the chunk states and v_new (save_states; DPX_KERNEL_SAVE_STATES=0 recomputes them)
        ctx.save_for_backward(q, k, v, g, beta, h0, *wy)
        ctx.tab, ctx.scale, ctx.cu_seqlens = tab, scale, cu_seqlens
        return o, ht

    @staticmethod
    @contiguous
    def backward(ctx, do, dht):
        grads = chunk_backward(ctx.saved_tensors, do, dht, ctx.tab, ctx.scale, ctx.cu_seqlens, ctx.needs_input_grad[:6])
        return (*grads, None, None, None, None)


def chunk_backward(saved, do, dht, tab, scale, cu_seqlens, need=(True,) * 6):
    """(dq, dk, dv, dg, dbeta, dh0) from the forward's saved (q, k, v, g, beta, h0, T, G, gamma[, h, v_new]): the backward of
    ChunkGatedDeltaProductFunction and of the custom op dpx::chunk_dp_bwd (below). `need` says which of the
    six inputs want a gradient (only the PyTorch backward at float32 head dim > 128 uses it)."""
    q, k, v, g, beta, h0, t, G, gamma, *states = saved
    B, T, H, K = q.shape
    V = v.shape[-1]
    path = backward_path(q.dtype, tab.n, K)
    dqkwg_kernel(q.device)  # a bad DPX_KERNEL_DQKWG raises on every path, the PyTorch one included
    if path == "torch_fp32":
        return _torch_backward(saved[:6], need, tab, scale, cu_seqlens, do, dht)
    flat = lambda x, *s: None if x is None else x.reshape(*s)
    wy = (t, G, gamma, *states)
    if path == "triton_fp32" and q.dtype != torch.float32:  # float32 copies: T is recomputed in float32
        f32 = lambda x: None if x is None else x.float()
        q_, k_, v_, beta_, do_, wy = f32(q), f32(k), f32(v), f32(beta), f32(do), None
    else:
        q_, k_, v_, beta_, do_ = q, k, v, beta, do
    dq, dk, dv, dg, dbeta, dh0 = chunk_dp_bwd(
        flat(q_, -1, H, K), flat(k_, -1, H, K), flat(v_, -1, H, V), flat(g, -1, H), flat(beta_, -1, H), h0,
        flat(do_, -1, H, V), dht, tab, scale, wy)
    cast = lambda dx, x: None if dx is None else dx.view(x.shape).to(x.dtype)
    return cast(dq, q), cast(dk, k), cast(dv, v), cast(dg, g), cast(dbeta, beta), cast(dh0, h0)


def chunk_forward(q, k, v, g, beta, h0, tab, scale, output_final_state, keep_states=False):
    """(o [B,T,H,V], final state or None, (T, G, gamma[, h, v_new])) on [B,T,...] inputs: the forward of
    ChunkGatedDeltaProductFunction and of the custom op dpx::chunk_dp_fwd (below)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    flat = lambda x, *s: None if x is None else x.reshape(*s)
    o, ht, wy = chunk_dp_fwd(flat(q, -1, H, K), flat(k, -1, H, K), flat(v, -1, H, V), flat(g, -1, H),
                             flat(beta, -1, H), h0, tab, scale, output_final_state, keep_states)
    return o.view(B, T, H, V), ht, wy


def chunk_gated_delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    num_householder: int,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla-compatible chunkwise (Gated) DeltaProduct (float32 inputs accepted as well as bf16/fp16).

    q [B,T,H,K]; k [B,T*n,H,K], v [B,T*n,H,V], beta [B,T*n,H] interleaved per token; g [B,T,H] log gate or None;
    initial_state [N,H,K,V]; cu_seqlens [N+1] token offsets (B = 1). Returns (o [B,T,H,V], final state float32).
    Under torch.compile it runs as the custom ops dpx::chunk_dp_fwd / dpx::chunk_dp_bwd (end of this file: the same
    kernels, opaque to the compiler, so the glue around them compiles into one graph); eagerly, as the
    autograd.Function below.
    """
    check_inputs(q, k, v, g, beta, num_householder, initial_state, cu_seqlens)
    B, T, H, K = q.shape
    if K > 256 or v.shape[-1] > 256:
        raise ValueError(f"q/v: head dims up to 256 are supported, got K={K}, V={v.shape[-1]}")
    scale = K ** -0.5 if scale is None else scale
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q.float()).to(q.dtype), l2norm(k.float()).to(k.dtype)
    if g is not None:
        g = g.float()
    if torch.compiler.is_compiling():
        apply = chunk_dp_apply if chunk_dp_fwd_op is not None else _eager_behind_graph_break
        run = lambda q, k, v, h0: apply(q, k, v, g, beta, h0, cu_seqlens, num_householder, scale, output_final_state)
    else:
        tab = chunk_table(B, T, num_householder, q.device, cu_seqlens, cu_seqlens_cpu)
        run = lambda q, k, v, h0: ChunkGatedDeltaProductFunction.apply(q, k, v, g, beta, h0, tab, scale,
                                                                       output_final_state, cu_seqlens)
    V = v.shape[-1]
    Kp, Vp = next_pow2(K), next_pow2(V)
    if (Kp, Vp) == (K, V):
        return run(q, k, v, initial_state)
    # Head dims that are not a power of two (Table 3's head-dim matching gives 85) run zero-padded to the tile
    # width, which the kernels use anyway (BK = next power of two): no tile is then masked along K or V. The
    # bf16 n_h = 3 head dim 85 case raised an illegal memory access on the H200 (Triton 3.6, issue 14) in a
    # masked-K build; zero columns change no product (q.k, k.k, the state's padded rows and columns stay 0)
    pad = torch.nn.functional.pad
    q, k, v = pad(q, (0, Kp - K)), pad(k, (0, Kp - K)), pad(v, (0, Vp - V))
    h0 = None if initial_state is None else pad(initial_state, (0, Vp - V, 0, Kp - K))
    o, ht = run(q, k, v, h0)
    return o[..., :V], (None if ht is None else ht[..., :K, :V])


# -- under torch.compile: the kernel as two registered custom ops ---------------------------------------------------
# So that torch.compile traces a model around the kernel in one graph:
#     dpx::chunk_dp_fwd(q, k, v, g?, beta, h0?, cu_seqlens?, n, scale, output_final_state, keep=True)
#         -> (o [B,T,H,V], final state [N,H,K,V] float32 (or [0]), T [NC,H,64,64], G [NC,H,64], gamma [NC,H],
#             h [NC,H,K,V] and v_new [NC,H,64,V] (or [0] each: not kept with DPX_KERNEL_SAVE_STATES=0, keeps_states, or keep=False: no gradient wanted))
#     dpx::chunk_dp_bwd(q, k, v, g?, beta, h0?, T, G, gamma, h, v_new, do, dht?, cu_seqlens?, n, scale)
#         -> (dq, dk, dv, dg (or [0]), dbeta, dh0 (or [0]))
# They run chunk_forward / chunk_backward, the bodies of the eager autograd.Function, on the same chunk table, so
# compiled and eager training launch the same kernels. The compiler sees each op as one node: the fake (meta)
# implementation gives the output shapes (for varlen input the number of chunks is data-dependent: an unbacked
# size), and the autograd formula calls the backward op. Custom ops cannot return None, so absent outputs are [0]
# tensors, mapped back to None. Registered at import; where this torch cannot register them (CUSTOM_OP_ERROR),
# compiled code calls the eager path behind a graph break instead.

def _table(q: Tensor, n: int, cu_seqlens: Optional[Tensor]):
    B, T = q.shape[:2]
    return chunk_table(B, T, n, q.device, cu_seqlens)


def _register_ops():
    @torch.library.custom_op("dpx::chunk_dp_fwd", mutates_args=())
    def fwd_op(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], beta: Tensor, h0: Optional[Tensor],
               cu_seqlens: Optional[Tensor], n: int, scale: float, output_final_state: bool, keep: bool = True
               ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        c = lambda x: None if x is None else x.contiguous()
        o, ht, (t, G, gamma, *states) = chunk_forward(c(q), c(k), c(v), c(g), c(beta), c(h0), _table(q, n, cu_seqlens),
                                                      scale, output_final_state,
                                                      keep and keeps_states(q.dtype, n, q.shape[-1]))
        h, v_new = states or (q.new_empty(0), k.new_empty(0))
        return o, (ht if ht is not None else q.new_empty(0, dtype=torch.float32)), t, G, gamma, h, v_new

    @fwd_op.register_fake
    def _(q, k, v, g, beta, h0, cu_seqlens, n, scale, output_final_state, keep=True):
        B, T, H, K = q.shape
        V = v.shape[-1]
        if cu_seqlens is None:
            N, NC = B, B * (-(-T // tokens_per_chunk(n)))
        else:
            N, NC = cu_seqlens.shape[0] - 1, torch.library.get_ctx().new_dynamic_size()
        o = q.new_empty(B, T, H, V)
        ht = q.new_empty(N, H, K, V, dtype=torch.float32) if output_final_state else \
            q.new_empty(0, dtype=torch.float32)
        keep = keep and keeps_states(q.dtype, n, K)
        h = q.new_empty(NC, H, K, V) if keep else q.new_empty(0)
        v_new = k.new_empty(NC, H, BL, V) if keep else k.new_empty(0)
        return (o, ht, k.new_empty(NC, H, BL, BL), q.new_empty(NC, H, BL, dtype=torch.float32),
                q.new_empty(NC, H, dtype=torch.float32), h, v_new)

    @torch.library.custom_op("dpx::chunk_dp_bwd", mutates_args=())
    def bwd_op(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], beta: Tensor, h0: Optional[Tensor], t: Tensor,
               G: Tensor, gamma: Tensor, h: Tensor, v_new: Tensor, do: Tensor, dht: Optional[Tensor],
               cu_seqlens: Optional[Tensor], n: int, scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        c = lambda x: None if x is None else x.contiguous()
        states = (h, v_new) if h.numel() else ()  # [0]: the forward did not keep them
        saved = tuple(c(x) for x in (q, k, v, g, beta, h0, t, G, gamma, *states))
        dq, dk, dv, dg, dbeta, dh0 = chunk_backward(saved, c(do), c(dht), _table(q, n, cu_seqlens), scale, cu_seqlens)
        e = lambda: q.new_empty(0, dtype=torch.float32)  # one per absent output: returns must not alias each other
        return dq, dk, dv, (dg if dg is not None else e()), dbeta, (dh0 if dh0 is not None else e())

    @bwd_op.register_fake
    def _(q, k, v, g, beta, h0, t, G, gamma, h, v_new, do, dht, cu_seqlens, n, scale):
        e = lambda: q.new_empty(0, dtype=torch.float32)
        return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
                torch.empty_like(g) if g is not None else e(), torch.empty_like(beta),
                torch.empty_like(h0) if h0 is not None else e())

    def setup_context(ctx, inputs, output):
        q, k, v, g, beta, h0, cu_seqlens, n, scale, output_final_state, *_ = inputs
        _, _, t, G, gamma, h, v_new = output
        ctx.save_for_backward(q, k, v, g, beta, h0, t, G, gamma, h, v_new, cu_seqlens)
        ctx.n, ctx.scale, ctx.has_ht = n, scale, output_final_state
        ctx.has_g, ctx.has_h0 = g is not None, h0 is not None
        ctx.mark_non_differentiable(t, G, gamma, h, v_new)

    def backward(ctx, do, dht, _dt, _dG, _dgamma, _dh, _dv_new):
        q, k, v, g, beta, h0, t, G, gamma, h, v_new, cu_seqlens = ctx.saved_tensors
        dq, dk, dv, dg, dbeta, dh0 = bwd_op(q, k, v, g, beta, h0, t, G, gamma, h, v_new, do,
                                            dht if ctx.has_ht else None, cu_seqlens, ctx.n, ctx.scale)
        return (dq, dk, dv, dg if ctx.has_g else None, dbeta, dh0 if ctx.has_h0 else None, None, None, None, None)

    fwd_op.register_autograd(backward, setup_context=setup_context)
    return fwd_op, bwd_op


try:
    chunk_dp_fwd_op, chunk_dp_bwd_op = _register_ops()
    CUSTOM_OP_ERROR = None
except Exception as e:  # noqa: BLE001 - a torch whose torch.library cannot: compile breaks the graph at the kernel
    chunk_dp_fwd_op = chunk_dp_bwd_op = None
    CUSTOM_OP_ERROR = f"{type(e).__name__}: {e}"


def chunk_dp_apply(q, k, v, g, beta, h0, cu_seqlens, n: int, scale: float, output_final_state: bool):
    """(o, final state or None), as ChunkGatedDeltaProductFunction.apply, through the custom ops."""
    keep = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (q, k, v, g, beta, h0))
    o, ht, *_ = chunk_dp_fwd_op(q, k, v, g, beta, h0, cu_seqlens, n, scale, output_final_state, keep)
    return o, (ht if output_final_state else None)


@torch.compiler.disable
def _eager_behind_graph_break(q, k, v, g, beta, h0, cu_seqlens, n: int, scale: float, output_final_state: bool):
    return ChunkGatedDeltaProductFunction.apply(q, k, v, g, beta, h0, _table(q, n, cu_seqlens), scale,
                                                output_final_state, cu_seqlens)

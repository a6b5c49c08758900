"""DeltaNet, Gated DeltaNet, DeltaProduct and Gated DeltaProduct: one layer, fla's GatedDeltaProduct.

Per token t (paper, Siems et al. 2025): gate once, S <- exp(g_t) S (gated families only); then n_h Householder
steps S <- S + beta_j k_j (v_j - S^T k_j)^T with keys SiLU'd and L2-normalised and one projection per step; then
read out once, o_t = S^T q_t / sqrt(K). So the transition is exp(g_t) prod_j (I - beta_j k_j k_j^T). beta =
sigmoid (eigenvalues in [0,1]) or 2*sigmoid (allow_neg_eigval, eigenvalues in [-1,1]). DeltaNet is n_h = 1.

The recurrence itself lives in dpx.kernels (Triton on CUDA, PyTorch chunkwise on CPU, a token loop as oracle).

On CUDA a training/prefill forward takes the fused path (`_forward_fused`): all input projections as one GEMM
(the weights concatenated per call, so parameters and state_dict keys stay those of the separate projections),
the short convolutions with SiLU and the q/k L2 norm as one Triton op each (kernels/fused/short_conv.py; without a
short conv, SiLU + L2 norm as one op), the delta kernel without its own L2 pass, and the output RMSNorm (+ gate) as
one op (kernels/fused/fused_norm_gate.py). Same function, float32 inside the fused ops instead of the plain path's
16-bit conv arithmetic. Elsewhere (CPU, decoding, `record`) the plain path runs, unchanged. `fused`: None (default:
on CUDA unless DPX_FUSED=0), True (force it, e.g. CPU tests; the ops then run `fused_impl`) or False.
"""
from __future__ import annotations

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import kernels
from ...kernels import fused
from ...kernels.delta_product.naive import l2norm
from ..config import ModelConfig
from ..layers import GatedRMSNorm, ShortConv
from .base import Mixer


class DeltaProductMixer(Mixer):
    fused: bool | None = None
    fused_impl: str = "auto"  # impl of the fused ops: "auto" (Triton on CUDA, PyTorch forms elsewhere), "triton", "torch"

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        d, H, K, V, n = cfg.hidden_size, cfg.num_heads, cfg.key_dim, cfg.value_dim, cfg.num_householder
        self.H, self.K, self.V, self.n = H, K, V, n
        self.q_proj = nn.Linear(d, H * K, bias=False)
        self.k_proj = nn.Linear(d, H * K * n, bias=False)  # one key projection per Householder step
        self.v_proj = nn.Linear(d, H * V * n, bias=False)
        self.b_proj = nn.Linear(d, H * n, bias=False)
        if cfg.use_forget_gate:
            # Mamba-2 style gate as in fla: g = -exp(A_log) * softplus(a_proj(x) + dt_bias)
            self.a_proj = nn.Linear(d, H, bias=False)
            self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1, 16)))
            dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
            self.A_log._no_weight_decay = True
            self.dt_bias._no_weight_decay = True
        if cfg.use_short_conv:
            self.q_conv = ShortConv(H * K, cfg.conv_size)
            self.k_conv = ShortConv(H * K * n, cfg.conv_size)
            self.v_conv = ShortConv(H * V * n, cfg.conv_size)
        if cfg.use_output_gate:
            self.g_proj = nn.Linear(d, H * V, bias=False)
        self.o_norm = GatedRMSNorm(V, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(H * V, d, bias=False)

    def _inputs(self, x, state):
        """Projections, convs and activations; returns kernel inputs in fla's interleaved layout + new caches."""
        B, T, _ = x.shape
        H, K, V, n = self.H, self.K, self.V, self.n
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        caches = {}
        if self.cfg.use_short_conv:
            q, caches["conv_q"] = self.q_conv(q, state.get("conv_q"))
            k, caches["conv_k"] = self.k_conv(k, state.get("conv_k"))
            v, caches["conv_v"] = self.v_conv(v, state.get("conv_v"))
        else:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        q = q.reshape(B, T, H, K)
        k = k.reshape(B, T * n, H, K)  # '... t (n h d) -> ... (t n) h d'
        v = v.reshape(B, T * n, H, V)
        beta = self.b_proj(x).sigmoid().view(B, T * n, H)
        if self.cfg.allow_neg_eigval:
            beta = beta * 2
        g = None
        if self.cfg.use_forget_gate:
            g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)
            if x.dtype == torch.float64:
                g = g.double()
        return q, k, v, beta, g, caches

    def _use_fused(self, x, state, mode) -> bool:
        if mode != "chunk" or self.record or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return False
        if any(c is not None and c.requires_grad for c in (state.get(k) for k in ("conv_q", "conv_k", "conv_v"))):
            return False  # the fused conv does not differentiate its cache
        if self.fused is not None:
            return self.fused
        return x.is_cuda and os.environ.get("DPX_FUSED", "1") != "0"

    # The fused projection's parts each start at a column that is a multiple of this (zero rows after each part;
    # no parameter). cuBLAS picks its fast Hopper GEMMs only for 16-byte-aligned rows (8 bf16): unaligned, fig4 at
    # n_h = 3 (6 heads: 768 + 2 x 2304 + 18 = 5394 columns) ran an sm80 "align2" kernel, 1.44 ms forward against
    # 0.6 for the separate projections (H200, session 18 profile). 16 rather than 8, and each part rather than the
    # total: the short-conv kernels read q/k/v as strided column views of this output, and Triton vectorizes those
    # loads only when the row stride is divisible by 16 and the view starts 16-byte aligned (5400 = 5394 padded to 8
    # is not: every x load of the conv was a 2-byte scalar load, tests/test_kernel_resources.py).
    IN_ALIGN = 16

    def _in_weight(self) -> tuple[torch.Tensor, list[int]]:
        """All input projections as one [sum(sizes), d] weight (concatenated per call; the pads are zero rows, no
        parameter, no gradient) and its split sizes: each projection's width followed by its pad (the real parts
        are split(sizes)[::2])."""
        mods = [self.q_proj, self.k_proj, self.v_proj, self.b_proj]
        if self.cfg.use_forget_gate:
            mods.append(self.a_proj)
        if self.cfg.use_output_gate:
            mods.append(self.g_proj)
        ws, sizes = [], []
        for m in mods:
            pad = -m.out_features % self.IN_ALIGN
            ws.append(m.weight)
            if pad:
                ws.append(m.weight.new_zeros(pad, m.weight.shape[1]))
            sizes += [m.out_features, pad]
        return torch.cat(ws), sizes

    def _forward_fused(self, x, state):
        B, T, _ = x.shape
        H, K, V, n, cfg = self.H, self.K, self.V, self.n, self.cfg
        impl = self.fused_impl
        w, sizes = self._in_weight()
        parts = F.linear(x, w).split(sizes, dim=-1)[::2]  # the pads' columns dropped
        q, k, v, b = parts[:4]
        caches = {}
        if cfg.use_short_conv:
            q, caches["conv_q"] = fused.causal_conv1d(q, self.q_conv.weight, self.q_conv.bias, state.get("conv_q"),
                                                      self.q_conv.activation, K, impl=impl)
            k, caches["conv_k"] = fused.causal_conv1d(k, self.k_conv.weight, self.k_conv.bias, state.get("conv_k"),
                                                      self.k_conv.activation, K, impl=impl)
            v, caches["conv_v"] = fused.causal_conv1d(v, self.v_conv.weight, self.v_conv.bias, state.get("conv_v"),
                                                      self.v_conv.activation, None, impl=impl)
        else:
            q, k, v = fused.l2norm(q, K, True, impl=impl), fused.l2norm(k, K, True, impl=impl), F.silu(v)
        q, k, v = q.reshape(B, T, H, K), k.reshape(B, T * n, H, K), v.reshape(B, T * n, H, V)
        beta = b.sigmoid().reshape(B, T * n, H)
        if cfg.allow_neg_eigval:
            beta = beta * 2
        g = None
        if cfg.use_forget_gate:
            g = -self.A_log.float().exp() * F.softplus(parts[4].float() + self.dt_bias)
        o, S = self._core(q, k, v, beta, g, state.get("S"), "chunk", l2=False)
        gate = parts[-1] if cfg.use_output_gate else None
        o = fused.rms_norm_gated(o, self.o_norm.weight, gate, self.o_norm.eps, impl=impl)
        return self.o_proj(o.reshape(B, T, H * V)), {"S": S, **caches}

    def _core(self, q, k, v, beta, g, S0, mode, l2=True):
        """The recurrence, through dpx.kernels (which choose the implementation): decoding (one token, recurrent
        mode) takes the decode entry, every other call the chunkwise one (mode "recurrent": the token loop)."""
        kw = dict(num_householder=self.n, use_qk_l2norm_in_kernel=l2)
        if mode == "recurrent" and q.shape[1] == 1:
            return kernels.gated_delta_product_step(q, k, v, g, beta, state=S0, impl=self.cfg.impl, **kw)
        return kernels.gated_delta_product(q, k, v, g, beta, initial_state=S0, output_final_state=True,
                                           chunk_size=self.cfg.chunk_size, impl=self.impl_for(mode, self.cfg.impl),
                                           **kw)

    def _forward(self, x, state, mode):
        if self._use_fused(x, state, mode):
            return self._forward_fused(x, state)
        B, T, _ = x.shape
        q, k, v, beta, g, caches = self._inputs(x, state)
        o, S = self._core(q, k, v, beta, g, state.get("S"), mode)
        if self.record:
            n, H = self.n, self.H
            kn = l2norm(k.float() if k.dtype != torch.float64 else k)
            self._keep(q=q, k=kn.view(B, T, n, H, -1), v=v.view(B, T, n, H, -1), beta=beta.view(B, T, n, H), g=g)
        gate = self.g_proj(x).view(B, T, self.H, self.V) if self.cfg.use_output_gate else None
        o = self.o_norm(o.to(x.dtype), gate)
        return self.o_proj(o.reshape(B, T, self.H * self.V)), {"S": S, **caches}


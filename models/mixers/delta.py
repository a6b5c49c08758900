"""DeltaNet, Gated DeltaNet, DeltaProduct and Gated DeltaProduct: one layer, fla's GatedDeltaProduct.

Per token t (paper, Siems et al. 2025): gate once, S <- exp(g_t) S (gated families only); then n_h Householder
steps S <- S + beta_j k_j (v_j - S^T k_j)^T with keys SiLU'd and L2-normalised and one projection per step; then
read out once, o_t = S^T q_t / sqrt(K). So the transition is exp(g_t) prod_j (I - beta_j k_j k_j^T). beta =
sigmoid (eigenvalues in [0,1]) or 2*sigmoid (allow_neg_eigval, eigenvalues in [-1,1]). DeltaNet is n_h = 1.

The recurrence itself lives in dpx.kernels (Triton on CUDA, PyTorch chunkwise on CPU, a token loop as oracle).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import kernels
from ..config import ModelConfig
from ..layers import GatedRMSNorm, ShortConv
from .base import Mixer


class DeltaProductMixer(Mixer):

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

    def _forward(self, x, state, mode):
        B, T, _ = x.shape
        q, k, v, beta, g, caches = self._inputs(x, state)
        S0 = state.get("S")
        kw = dict(num_householder=self.n, use_qk_l2norm_in_kernel=True)
        if mode == "recurrent" and T == 1 and self.cfg.impl != "naive":
            o, S = kernels.gated_delta_product_step(q, k, v, beta, g, state=S0, impl=self.cfg.impl, **kw)
        elif mode == "recurrent":
            o, S = kernels.naive_recurrent_gated_delta_product(q, k, v, beta, g, initial_state=S0,
                                                                output_final_state=True, **kw)
        elif self.cfg.chunk_size is not None and kernels.resolve_impl(self.cfg.impl, x.device) == "torch":
            o, S = kernels.torch_chunk_gated_delta_product(q, k, v, beta, g, initial_state=S0, output_final_state=True,
                                                           chunk_size=self.cfg.chunk_size, **kw)
        else:
            o, S = kernels.gated_delta_product(q, k, v, beta, g, initial_state=S0, output_final_state=True,
                                               impl=self.cfg.impl, **kw)
        if self.record:
            n, H = self.n, self.H
            kn = kernels.delta_product.naive.l2norm(k.float() if k.dtype != torch.float64 else k)
            self._keep(q=q, k=kn.view(B, T, n, H, -1), v=v.view(B, T, n, H, -1), beta=beta.view(B, T, n, H), g=g)
        gate = self.g_proj(x).view(B, T, self.H, self.V) if self.cfg.use_output_gate else None
        o = self.o_norm(o.to(x.dtype), gate)
        return self.o_proj(o.reshape(B, T, self.H * self.V)), {"S": S, **caches}


def transition(k: torch.Tensor, beta: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
    """The state-transition matrix of one token, exp(g) (I - b_n k_n k_n^T) ... (I - b_1 k_1 k_1^T), in execution
    order (step 1 acts first, so it is the rightmost factor): S_new = A S_old + (writes).
    k [..., n, K] (as used, i.e. already normalised), beta [..., n], g [...] log gate or None -> A [..., K, K].
    Used by probes (eigenvalues, rotation angles) and the tests."""
    K = k.shape[-1]
    A = torch.eye(K, dtype=k.dtype, device=k.device).expand(*k.shape[:-2], K, K)
    for j in range(k.shape[-2]):
        kj = k[..., j, :]
        A = A - beta[..., j, None, None] * kj[..., :, None] * (kj[..., None, :] @ A)
    return A if g is None else A * g.exp()[..., None, None]


def state_trajectory(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor | None = None,
                     S0: torch.Tensor | None = None, every: str = "token"):
    """Yield the recurrent state [B, H, K, V] after every token (or every Householder sub-step), from the per-token
    internals a forward with return_aux=True records: k [B, T, n, H, K] (normalised), v [B, T, n, H, V],
    beta [B, T, n, H], g [B, T, H] or None. For the effective-rank analysis and state probes (float64-safe loop)."""
    if every not in ("token", "substep"):
        raise ValueError(f"every: expected 'token' or 'substep', got {every!r}")
    B, T, n, H, K = k.shape
    S = k.new_zeros(B, H, K, v.shape[-1]) if S0 is None else S0.to(k.dtype)
    for t in range(T):
        if g is not None:
            S = S * g[:, t].exp().to(S.dtype)[..., None, None]
        for j in range(n):
            kj, vj, bj = k[:, t, j], v[:, t, j].to(S.dtype), beta[:, t, j].to(S.dtype)
            err = vj - torch.einsum("bhkv,bhk->bhv", S, kj)
            S = S + bj[..., None, None] * kj[..., :, None] * err[..., None, :]
            if every == "substep":
                yield S
        if every == "token":
            yield S

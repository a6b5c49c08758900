"""Linear recurrence: diagonal decay plus an optional rank-one term, the state update of every non-delta family.

    S_t = diag(exp(w_t)) S_{t-1} + a_t (b_t^T S_{t-1}) + k_t v_t^T          S: [K, V] per head, w_t <= 0 (log decay)
    o_t = scale * S_t^T q_t                                                   (default: read after the update)
    o_t = scale * (S_{t-1}^T q_t + (q_t . (u * k_t)) v_t)                    (u given: RWKV's "bonus" read)

Linear attention (w = 0), RetNet (w = log gamma_h), RWKV-5 (static per-channel w), RWKV-6 / GLA (data-dependent
per-channel w), Mamba-2 (data-dependent scalar w), Mamba (per channel x state w = dt*A, V = 1), RWKV-4 (K = 1) and
RWKV-7 (a = -(a_t * kappa_t), b = kappa_t) are all special cases. `w` may be [..., K] or [..., 1] (scalar decay).

naive.py (the token loop, the oracle: float64 in, float64 out), torch_chunk.py (chunkwise parallel, the training
path), dispatch.py (`gated_linear_recurrence`: picks one, upcasts 16-bit inputs). PyTorch only, no Triton kernel yet.
"""

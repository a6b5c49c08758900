"""Compute and memory arithmetic for LM trials: FLOPs per token (for MFU) and a memory estimate that refuses a
context length / micro-batch the trial cannot hold, before any training step. Pure Python (no torch).

FLOPs follow the usual 6N rule (forward 2N, backward 4N for N matmul parameters, the tied output head included)
plus the recurrence: per token, layer and head, n_h Householder steps each read the state once (S^T k) and write
it once (rank-1 update), 2*K*V multiply-adds each, and one read-out S^T q: (4*n_h + 2)*K*V FLOPs forward, x3 for
training. Attention-free, so nothing grows with the context.

The memory estimate is deliberately coarse (weights, gradients, AdamW moments in fp32, bf16 activations saved
per token and layer, fp32 logits and their gradient); it exists to refuse shapes that are clearly too big with a
clear message, not to pack the GPU to the last byte.
"""
from __future__ import annotations

GIB = 1024 ** 3
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "GH200": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0,
                    "B200": 2250.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


def peak_tflops(device_name: str, override: float = 0.0) -> float:
    """Dense bf16 peak of a GPU by (a part of) its name; 0 when unknown (then no MFU is reported)."""
    if override:
        return override
    for key, v in PEAK_BF16_TFLOPS.items():
        if key in device_name:
            return v
    return 0.0


def recurrence_flops_per_token(model: dict) -> float:
    """Forward FLOPs of the state recurrence per token, all layers (0 for families without a matrix state)."""
    H = model.get("num_heads", 4)
    K = model.get("head_dim") or model.get("hidden_size", 128) // H
    V = K * model.get("expand_v", 1.0)
    n_h = model.get("num_householder", 1)
    return model.get("num_layers", 2) * H * (4 * n_h + 2) * K * V


def train_flops_per_token(model: dict, matmul_params: int) -> float:
    """Training FLOPs per token: 6 * matmul parameters + 3 * forward recurrence FLOPs."""
    return 6.0 * matmul_params + 3.0 * recurrence_flops_per_token(model)


def estimate_train_memory_gib(model: dict, n_params: int, micro_batch: int, seq_len: int) -> float:
    """Peak memory of one training step in GiB (coarse; see the module docstring)."""
    d = model.get("hidden_size", 128)
    H = model.get("num_heads", 4)
    K = model.get("head_dim") or d // H
    V = K * model.get("expand_v", 1.0)
    n_h = model.get("num_householder", 1)
    mlp = model.get("intermediate_size") or 256 * ((int(d * model.get("mlp_ratio", 4.0) * 2 / 3) + 255) // 256)
    vocab = model.get("vocab_size", 32000)
    states = 16 * n_params  # fp32 weights + grads + two AdamW moments
    tokens = micro_batch * seq_len
    # saved activations per token and layer (bf16): norms, projections q/k/v/beta (x n_h), conv outputs, mixer
    # output, SwiGLU inputs and hidden; x2 for the kernel's recomputed / chunk-local tensors
    per_layer = 2 * (8 * d + 3 * mlp + 2 * H * (K + n_h * (K + V) * 2 + V)) * 2
    act = tokens * model.get("num_layers", 2) * per_layer
    logits = tokens * vocab * (2 + 4 + 4)  # bf16 logits, fp32 copy for the loss, its gradient
    return (states + act + logits) / GIB


def check_memory(model: dict, n_params: int, micro_batch: int, seq_len: int, budget_gib: float,
                 key: str = "task.context_len") -> float:
    """Raise ValueError("task.context_len: ...") when the estimate exceeds the budget; return the estimate."""
    need = estimate_train_memory_gib(model, n_params, micro_batch, seq_len)
    if budget_gib and need > budget_gib:
        raise ValueError(f"{key}: {seq_len} tokens x micro-batch {micro_batch} needs about {need:.1f} GiB, more than "
                         f"the {budget_gib:.1f} GiB this trial may use (task.memory_gb / the device); lower "
                         f"context_len or micro_batch_size (gradient accumulation keeps the tokens per step)")
    return need

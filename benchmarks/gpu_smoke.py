"""Seconds-long GPU smoke test of the paths added since the last acceptance check (no fla, no wheels needed):
the custom ops register on this torch, a compiled call (aot_eager, fullgraph) matches eager, and the opt-in
super-chunk forward (DPX_KERNEL_FWD=super) matches the default forward and the float32 PyTorch form.
    python3 benchmarks/gpu_smoke.py        # on the GPU machine, from the repository root
    SMOKE_DEVICE=cpu TRITON_INTERPRET=1 python3 benchmarks/gpu_smoke.py   # the script itself, on the CPU (float32)"""
import os
import sys
import types

if "dpx" not in sys.modules:  # a checkout without `pip install -e .`: expose the repository as dpx
    m = types.ModuleType("dpx")
    m.__path__ = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]
    sys.modules["dpx"] = m
import torch

from dpx.kernels.delta_product import chunk
from dpx.kernels.delta_product.torch_chunk import torch_chunk_gated_delta_product

print("torch", torch.__version__, "custom ops:", "registered" if chunk.CUSTOM_OP_ERROR is None else chunk.CUSTOM_OP_ERROR,
      flush=True)
dev = os.environ.get("SMOKE_DEVICE", "cuda")
dt = torch.bfloat16 if dev == "cuda" else torch.float32  # the interpreter has no bfloat16 arithmetic
rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()


def inputs(B, T, H, K, n, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(B, T, H, K, device=dev, generator=g).to(dt)
    k = torch.nn.functional.normalize(torch.randn(B, T * n, H, K, device=dev, generator=g), dim=-1).to(dt)
    v = torch.randn(B, T * n, H, K, device=dev, generator=g).to(dt)
    beta = (2 * torch.rand(B, T * n, H, device=dev, generator=g)).to(dt)
    gate = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=dev, generator=g))
    return q, k, v, gate, beta


for n, K in [(2, 64), (3, 128)]:
    q, k, v, g, beta = inputs(2, 300, 4, K, n)
    os.environ["DPX_KERNEL_FWD"] = "chunk"
    o_c, h_c = chunk.chunk_gated_delta_product(q, k, v, g, beta, n, output_final_state=True)
    os.environ["DPX_KERNEL_FWD"] = "super"
    o_s, h_s = chunk.chunk_gated_delta_product(q, k, v, g, beta, n, output_final_state=True)
    os.environ["DPX_KERNEL_FWD"] = "chunk"
    o_r, h_r = torch_chunk_gated_delta_product(q.float(), k.float(), v.float(), g, beta.float(), num_householder=n,
                                               output_final_state=True)
    print(f"super n={n} K={K}: o vs fp32 torch {rel(o_s, o_r):.2e} (default {rel(o_c, o_r):.2e}), "
          f"ht {rel(h_s, h_r):.2e} (default {rel(h_c, h_r):.2e})", flush=True)

q, k, v, g, beta = [x.requires_grad_() if x.is_floating_point() else x for x in inputs(1, 200, 2, 64, 2)]


def f(q, k, v, g, beta):
    o, ht = chunk.chunk_gated_delta_product(q, k, v, g, beta, 2, output_final_state=True)
    return (o.float() ** 2).sum() + ht.sum()


ref = f(q, k, v, g, beta)
gr = torch.autograd.grad(ref, [q, k, v, g, beta])
got = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v, g, beta)
gc = torch.autograd.grad(got, [q, k, v, g, beta])
print(f"compiled vs eager: loss {rel(got, ref):.2e}, grads " + ", ".join(f"{rel(a, b):.1e}" for a, b in zip(gc, gr)),
      flush=True)

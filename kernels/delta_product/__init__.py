"""DeltaProduct: gate once per token, n_h generalized Householder steps, read out once.

naive.py (token loop, the oracle), torch_chunk.py (chunkwise PyTorch, the CPU path), chunk.py (Triton chunkwise
forward + backward), fused_recurrent.py (Triton decode). Triton modules are not imported here.
"""

"""models/compile.py: compile_model by block (in place: same module, same parameter names) or whole, with the
same outputs as eager. Dynamo's "eager" backend here (tracing and guards, no code generation: seconds); inductor runs
in tests/test_training_compile.py (slow)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from dpx.models import build_model
from dpx.models.compile import compile_model

CFG = dict(family="deltaproduct", num_layers=3, hidden_size=32, num_heads=2, head_dim=16, vocab_size=64,
           num_householder=2, allow_neg_eigval=True, use_short_conv=True, chunk_size=8)


def _model():
    torch.manual_seed(0)
    return build_model(dict(CFG)).train()


def _loss(run, x):
    out = run(x)
    return (out.logits if hasattr(out, "logits") else out[0]).float().logsumexp(-1).mean()


def test_blocks_in_place_same_outputs_and_grads():
    torch._dynamo.reset()
    x = torch.randint(0, 64, (2, 24))
    ref, mod = _model(), _model()
    names = list(mod.state_dict())
    lr = _loss(ref, x)
    lr.backward()
    run = compile_model(mod, "blocks", backend="eager")
    assert run is mod and list(mod.state_dict()) == names  # checkpoints keep their keys
    assert all(b._compiled_call_impl is not None for b in mod.layers)
    lc = _loss(run, x)
    lc.backward()
    torch.testing.assert_close(lc, lr, rtol=1e-5, atol=1e-6)
    for (n, p), q in zip(ref.named_parameters(), mod.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=n)


def test_model_scope_wraps_and_a_model_without_layers_is_compiled_whole():
    torch._dynamo.reset()
    mod = _model()
    run = compile_model(mod, "model", backend="eager")
    assert run is not mod and run._orig_mod is mod and all(b._compiled_call_impl is None for b in mod.layers)
    lin = nn.Linear(4, 4)
    whole = compile_model(lin, "blocks", backend="eager")
    assert whole._orig_mod is lin
    x = torch.randn(3, 4)
    torch.testing.assert_close(whole(x), lin(x))
    with pytest.raises(ValueError, match="compile scope: expected 'blocks' or 'model', got 'layers'"):
        compile_model(mod, "layers")

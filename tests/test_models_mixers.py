"""Every token mixer: chunkwise form == recurrent form == one-token steps (float64, random shapes, T not a
multiple of the chunk), state carried across calls, gradients finite and equal between the forms."""
import pytest
import torch

from dpx.models import ModelConfig
from dpx.models.mixers import MIXERS, get_mixer

torch.set_num_threads(1)  # tiny float64 shapes on a shared 2-core box: extra intra-op threads only contend

FAMILIES = sorted(MIXERS)


def make(family, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    H = int(torch.randint(1, 3, (1,), generator=g))
    K = 2 * int(torch.randint(2, 5, (1,), generator=g))
    base = dict(family=family, hidden_size=16, num_heads=H, head_dim=K, chunk_size=4, state_size=4,
                low_rank_dim=4, expand=1 if family == "mamba2" else 2)
    if family in ("deltaproduct", "gated_deltaproduct"):
        base["num_householder"] = 1 + seed % 3
    if family in ("deltanet", "gated_deltanet", "deltaproduct", "gated_deltaproduct", "rwkv7"):
        base["allow_neg_eigval"] = bool(seed % 2)
    if family == "mamba2":
        base["num_heads"] = 2
    base.update(kw)
    torch.manual_seed(seed)
    cfg = ModelConfig(**base)
    m = get_mixer(family)(cfg).double()
    with torch.no_grad():  # larger than the LM's init so every term of the recurrence matters
        for p in m.parameters():
            if p.ndim == 2:
                p.add_(torch.randn_like(p) * 0.3)
    return m


def close(a, b, tol=1e-9):
    assert torch.allclose(a, b, rtol=tol, atol=tol), f"max abs diff {(a - b).abs().max().item():.3e}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_chunk_recurrent_step_agree(family, seed):
    m = make(family, seed)
    B, T = 2, 11  # chunk 4 -> 3 chunks, the last one partial
    x = torch.randn(B, T, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 7))
    y_c, s_c = m(x, mode="chunk")
    y_r, s_r = m(x, mode="recurrent")
    close(y_c, y_r)
    st, ys = None, []
    for t in range(T):
        y_t, st = m.step(x[:, t], st)
        ys.append(y_t)
    close(torch.stack(ys, 1), y_r)
    # the state of a prefix continues the sequence exactly
    y1, s1 = m(x[:, :6], mode="chunk")
    y2, s2 = m(x[:, 6:], s1, mode="chunk")
    close(torch.cat([y1, y2], 1), y_c)
    for key in s_c:
        if torch.is_tensor(s_c[key]):
            close(s2[key].to(s_c[key].dtype), s_c[key])
            close(s_r[key].to(s_c[key].dtype), s_c[key])


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_finite_and_equal(family):
    m = make(family, 3)
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    grads = []
    for mode in ("chunk", "recurrent"):
        m.zero_grad()
        x.grad = None
        y, _ = m(x, mode=mode)
        (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
        grads.append([x.grad.clone()] + [p.grad.clone() for p in m.parameters() if p.grad is not None])
    for a, b in zip(*grads):
        assert torch.isfinite(a).all()
        close(a, b, 1e-8)


def test_registry_covers_every_family():
    from dpx.models.config import FAMILIES as ALL
    assert set(ALL) == set(MIXERS)
    with pytest.raises(ValueError, match="family"):
        get_mixer("mamba3")

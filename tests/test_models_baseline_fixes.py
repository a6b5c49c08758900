"""Baseline fixes against their references: Mamba-2's gated norm is RMSNorm(y * SiLU(z)) (mamba_ssm / fla), weight
decay skips `_no_weight_decay` parameters (Mamba A_log, RWKV decays/bonuses/mixes), RWKV-7's decay bias survives
the LM init, and `model.init: authors` is fla 0.2.2's _init_weights (o_proj / down_proj rescaled, convs normal)."""
import math

import pytest
import torch
import torch.nn.functional as F

from dpx.models import ModelConfig, build_model
from dpx.models.mixers import get_mixer
from dpx.tasks.training.config import TrainConfig
from dpx.tasks.training.loop import make_optimizer

torch.set_num_threads(1)


def test_mamba2_matches_a_token_loop_with_rmsnorm_of_the_gated_output():
    """Reference: the SSD recurrence written out per token, then mamba_ssm's RMSNormGated(norm_before_gate=False):
    rmsnorm(y * silu(z)) * weight."""
    torch.manual_seed(0)
    cfg = ModelConfig(family="mamba2", hidden_size=8, num_heads=2, state_size=3, expand=1, conv_size=2,
                      chunk_size=4)
    m = get_mixer("mamba2")(cfg).double()
    with torch.no_grad():
        m.norm.weight.copy_(torch.rand(m.Di) + 0.5)
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    y, _ = m(x)
    H, P, N, Di = m.H, m.P, m.N, m.Di
    z, xBC, dt = m.in_proj(x).split([Di, Di + 2 * N, H], dim=-1)
    xBC, _ = m.conv(xBC)
    xs, Bm, Cm = xBC.split([Di, N, N], dim=-1)
    dt = F.softplus(dt + m.dt_bias)
    A = -m.A_log.exp()
    S = torch.zeros(2, H, N, P, dtype=torch.float64)
    outs = []
    for t in range(7):
        xt = xs[:, t].view(2, H, P)
        S = (dt[:, t] * A).exp()[:, :, None, None] * S + \
            dt[:, t, :, None, None] * Bm[:, t, None, :, None] * xt[:, :, None, :]
        outs.append(torch.einsum("bn,bhnp->bhp", Cm[:, t], S) + m.D[:, None] * xt)
    yy = torch.stack(outs, 1).reshape(2, 7, Di) * F.silu(z)
    ref = m.out_proj(yy * torch.rsqrt(yy.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * m.norm.weight)
    assert torch.allclose(y, ref, atol=1e-10), (y - ref).abs().max()


def _no_decay_names(model):
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1), torch.device("cpu"))
    no = {id(p) for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}
    return {n.split(".")[-1] for n, p in model.named_parameters() if id(p) in no}, \
        {n.split(".")[-1] for n, p in model.named_parameters() if id(p) not in no}


@pytest.mark.parametrize("family,exempt", [
    ("mamba", {"A_log", "D", "dt_bias"}),
    ("rwkv4", {"mu", "time_decay", "time_first"}),
    ("rwkv5", {"mu", "w0", "u"}),
    ("rwkv6", {"mu", "mu_x", "w0", "u", "shift_lora_b"}),
    ("rwkv7", {"mu", "w0", "k_k", "k_a", "r_k"}),
])
def test_weight_decay_honours_no_weight_decay(family, exempt):
    cfg = ModelConfig(family=family, vocab_size=11, hidden_size=16, num_heads=2, num_layers=1, state_size=4,
                      low_rank_dim=4)
    no, yes = _no_decay_names(build_model(cfg))
    assert exempt <= no and not (exempt & yes)
    assert "weight" in yes  # the projections still decay


def test_weight_decay_of_deltaproduct_unchanged():
    """Matrices decay, vectors do not: the split the DeltaProduct results so far were trained with."""
    m = build_model(ModelConfig(family="gated_deltaproduct", vocab_size=11, hidden_size=16, num_heads=2,
                                num_layers=1, num_householder=2))
    opt = make_optimizer(m, TrainConfig(weight_decay=0.1), torch.device("cpu"))
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    assert decayed == {id(p) for p in m.parameters() if p.ndim >= 2}


def test_rwkv7_decay_bias_survives_the_lm_init():
    cfg = ModelConfig(family="rwkv7", vocab_size=11, hidden_size=32, num_heads=2, head_dim=16, num_layers=2,
                      low_rank_dim=4)
    m = build_model(cfg)
    for mixer in m.mixers:
        w0 = mixer.w0.detach()
        # fla / RWKV-7: decay_speed + 0.5 = -7 + 5 * (n / (C - 1)) ** 0.85 + 0.5 (first-layer exponent)
        assert w0[0].item() == pytest.approx(-6.5) and w0[-1].item() == pytest.approx(-1.5)
        assert torch.all(w0[1:] > w0[:-1])
        assert mixer.w_lora[2].bias is None
    # at init most channels decay slowly: log decay -0.6065 * sigmoid(w0 + small) is far from the -0.30 of a
    # zeroed bias
    ids = torch.randint(0, 11, (2, 9))
    out = m(ids, return_aux=True)
    g = out.aux[0]["g"]
    assert g.median().item() > -0.05 and g.min().item() > -0.2


def test_init_authors_is_fla_rescale():
    L, d = 3, 64
    base = dict(family="deltaproduct", vocab_size=100, hidden_size=d, num_heads=4, num_layers=L, init_std=0.02,
                num_householder=2, use_short_conv=True)
    torch.manual_seed(0)
    m = build_model(ModelConfig(**base, init="authors"))
    for blk in m.layers:
        for lin in (blk.attn.o_proj, blk.mlp.down_proj):
            fan_in = lin.weight.shape[1]
            bound = 1 / math.sqrt(fan_in) / math.sqrt(2 * L)
            w = lin.weight.detach()
            assert w.abs().max().item() <= bound + 1e-7
            assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)  # uniform's std
        for conv in (blk.attn.q_conv, blk.attn.k_conv, blk.attn.v_conv):
            assert conv.weight.std().item() == pytest.approx(0.02, rel=0.1)
        assert blk.attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    torch.manual_seed(0)
    d0 = build_model(ModelConfig(**base))
    conv = d0.layers[0].attn.q_conv.weight.detach()
    assert conv.abs().max().item() > 0.1  # default keeps the uniform +-1/sqrt(conv_size) conv init
    assert d0.layers[0].attn.o_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_init_is_checked_and_default_leaves_ids_alone():
    with pytest.raises(ValueError, match="init: unknown init 'fla'.*known: default, authors"):
        ModelConfig(init="fla")
    assert ModelConfig().init == "default"

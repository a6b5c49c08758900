"""Parameter matching against the authors' published LM configs (automl/DeltaProduct language_modeling configs:
24 layers, head_dim 128, expand_v 1, no output/forget gate, tied embeddings, hidden_ratio 4, vocab 32000)."""
import pytest
import torch

from dpx.models import ModelConfig, build_model
from dpx.models.config import FAMILIES
from dpx.models.matching import count_params, param_report, solve

torch.set_num_threads(1)  # tiny float64 shapes on a shared 2-core box: extra intra-op threads only contend

AUTHORS = dict(family="deltaproduct", vocab_size=32000, num_layers=24, head_dim=128, expand_v=1,
               allow_neg_eigval=True, use_output_gate=False, tie_embeddings=True, mlp_ratio=4)
# (name, hidden, heads, n_h) from the authors' model_configs/*.json
PUBLISHED = {
    "213M": [(768, 8, 1), (736, 6, 2), (768, 4, 3)],
    "392M": [(1024, 8, 2), (1024, 6, 3)],          # the 340m_..._8h / _6h files: the paper's 392M models
    "805M": [(1536, 16, 1), (1468, 12, 2), (1536, 8, 3)],
}


def authors(d, h, n, **kw):
    return ModelConfig(**{**AUTHORS, "hidden_size": d, "num_heads": h, "n_h": n, **kw})


@pytest.mark.parametrize("size", sorted(PUBLISHED))
def test_published_configs_are_parameter_matched(size):
    counts = [count_params(authors(*c)) for c in PUBLISHED[size]]
    nominal = float(size[:-1]) * 1e6
    for n in counts:
        assert abs(n - counts[0]) / counts[0] < 0.005   # the variants of one size agree within 0.5%
        assert abs(n - nominal) / nominal < 0.01        # and carry the paper's name


@pytest.mark.parametrize("size", ["213M", "805M"])
def test_heads_mode_reproduces_the_authors_choice(size):
    d, h, _ = PUBLISHED[size][0]
    for d_n, h_n, n in PUBLISHED[size][1:]:
        cfg = authors(d, h, n, matching={"mode": "heads", "reference": {"n_h": 1}})
        out, info = solve(cfg)
        assert (out.num_heads, out.hidden_size) == (h_n, d_n), info
        assert abs(info["rel_diff"]) < 0.01 and out.num_householder == n and out.matching.mode == "none"


@pytest.mark.parametrize("mode", ["mlp", "head_dim"])
def test_other_modes_land_within_tolerance(mode):
    cfg = authors(768, 8, 3, num_layers=4, matching={"mode": mode, "reference": {"n_h": 1}})
    out, info = solve(cfg)
    ref = count_params(authors(768, 8, 1, num_layers=4))
    assert info["reference_params"] == ref
    assert abs(count_params(out) - ref) / ref < 0.01
    assert (out.intermediate_size if mode == "mlp" else out.head_dim) != (None if mode == "mlp" else 128)


def test_cross_family_matching_and_failure():
    # a Gated DeltaNet matched to a transformer of the same width by its MLP
    cfg = ModelConfig(family="gated_deltanet", hidden_size=64, num_heads=4, num_layers=2, vocab_size=100,
                      matching={"mode": "mlp", "reference": {"family": "transformer"}})
    out, info = solve(cfg)
    assert abs(info["rel_diff"]) < 0.01
    # no integer head_dim can make a tiny model match a huge one
    bad = ModelConfig(hidden_size=64, num_heads=4, num_layers=2, vocab_size=100,
                      matching={"mode": "head_dim", "reference": {"hidden_size": 4096}})
    with pytest.raises(ValueError, match="^matching.mode"):
        solve(bad)


@pytest.mark.parametrize("family", FAMILIES)
def test_count_is_exact(family):
    cfg = ModelConfig(family=family, hidden_size=32, num_heads=2, num_layers=2, vocab_size=50, num_classes=7)
    assert count_params(cfg) == sum(p.numel() for p in build_model(cfg).parameters())


def test_param_report_rows():
    rows = param_report([authors(768, 8, 1).to_dict(),
                         authors(768, 8, 3, matching={"mode": "heads", "reference": {"n_h": 1}})])
    assert rows[0]["mode"] == "none" and rows[0]["reference_params"] is None
    assert rows[1]["matched"] == "num_heads=4" and rows[1]["num_heads"] == 4
    assert abs(rows[1]["params"] - rows[0]["params"]) / rows[0]["params"] < 0.01
    assert rows[1]["non_embedding_params"] == rows[1]["params"] - 32000 * 768

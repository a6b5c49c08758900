"""ModelConfig: aliases fold into canonical fields, bad settings are ValueError('key: reason'), torch-free import."""
import dataclasses
import subprocess
import sys

import pytest

from dpx.models import ModelConfig
from dpx.models.config import FAMILIES


def test_aliases_fold_into_canonical_fields():
    a = ModelConfig(family="deltaproduct", n_h=3, beta_range="[-1, 1]")
    b = ModelConfig(family="deltaproduct", num_householder=3, allow_neg_eigval=True)
    assert a.num_householder == 3 and a.allow_neg_eigval and a.n_h is None and a.beta_range is None
    assert dataclasses.asdict(a) == dataclasses.asdict(b)  # same trial id
    assert ModelConfig(beta_range=[-1, 1]).allow_neg_eigval  # YAML list form
    assert not ModelConfig(beta_range="[0,1]").allow_neg_eigval
    assert ModelConfig.from_dict(a.to_dict()) == a
    m1 = ModelConfig(matching={"mode": "heads", "reference": {"n_h": 1, "beta_range": "[0,1]"}})
    m2 = ModelConfig(matching={"mode": "heads", "reference": {"num_householder": 1, "allow_neg_eigval": False}})
    assert dataclasses.asdict(m1) == dataclasses.asdict(m2)


def test_forget_gate_follows_the_family():
    assert ModelConfig(family="gated_deltaproduct").use_forget_gate is True
    assert ModelConfig(family="deltaproduct").use_forget_gate is False
    with pytest.raises(ValueError, match=r"^use_forget_gate: .*gated_deltaproduct"):
        ModelConfig(family="deltaproduct", use_forget_gate=True)


@pytest.mark.parametrize("kw, key", [
    (dict(n_h=0), "n_h"),
    (dict(num_householder=0), "num_householder"),
    (dict(family="deltanet", num_householder=2), "num_householder"),
    (dict(family="retnet", n_h=2), "num_householder"),
    (dict(hidden_size=100, num_heads=3), "head_dim"),
    (dict(family="transformer", hidden_size=96, num_heads=32), "head_dim"),
    (dict(family="delta_product"), "family"),
    (dict(beta_range="[0,2]"), "beta_range"),
    (dict(beta_range=[-2, 2]), "beta_range"),
    (dict(expand_v=0.3, head_dim=5), "expand_v"),
    (dict(impl="cuda"), "impl"),
    (dict(family="mamba2", hidden_size=30, num_heads=7, head_dim=4), "num_heads"),
    (dict(matching={"mode": "params"}), "matching.mode"),
    (dict(matching={"mode": "heads"}), "matching.reference"),
    (dict(matching={"mode": "heads", "reference": {"n_hh": 1}}), "matching.reference.n_hh"),
])
def test_bad_settings_name_the_key(kw, key):
    with pytest.raises(ValueError) as e:
        ModelConfig(**kw)
    assert str(e.value).startswith(key + ":"), str(e.value)


def test_unknown_family_suggests_the_closest():
    with pytest.raises(ValueError, match="did you mean 'deltaproduct'"):
        ModelConfig(family="deltaprodcut")
    with pytest.raises(ValueError, match=r"^num_heds: unknown model field.*num_heads"):
        ModelConfig.from_dict({"num_heds": 4})


def test_every_family_builds_a_valid_default_config():
    for f in FAMILIES:
        ModelConfig(family=f)


def test_import_is_torch_free():
    code = "import sys, dpx.models; dpx.models.ModelConfig(n_h=2); assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_nested_matching_errors_are_relative_for_the_recipe_loader():
    pydantic = pytest.importorskip("pydantic")
    with pytest.raises(pydantic.ValidationError) as e:
        pydantic.TypeAdapter(ModelConfig).validate_python({"matching": {"mode": "x"}})
    err = e.value.errors()[0]
    assert err["loc"] == ("matching",) and err["msg"].removeprefix("Value error, ").startswith("mode:")

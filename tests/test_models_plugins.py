"""A token-mixer family from another package, through the `dpx.models` entry point: the recipe validates (no
torch), the model builds, and a real training trial runs end to end (the word problem, on the CPU)."""
import json
import subprocess
import sys

from conftest import fake_install

PLUGIN = '''
my_mixer = {"mixer": "dpx_test_mixer.mixer:CausalMeanMixer", "doc": "a causal running mean, for the test"}
'''
MIXER = '''
import torch
from dpx.models.mixers.base import Mixer


class CausalMeanMixer(Mixer):
    """y_t = W (mean of x_1..x_t): a recurrent family with a state (the running sum and count)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.proj = torch.nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def _forward(self, x, state, mode):
        s0 = state.get("S", x.new_zeros(x.shape[0], x.shape[-1]))
        n0 = state.get("n", x.new_zeros(x.shape[0], 1))
        csum = s0[:, None] + x.cumsum(1)
        n = n0[:, None] + torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[None, :, None]
        return self.proj(csum / n), {"S": csum[:, -1], "n": n[:, -1]}
'''


def _site(tmp_path):
    return fake_install(tmp_path / "site", "dpx_test_mixer", {"__init__.py": PLUGIN, "mixer.py": MIXER},
                        "[dpx.models]\nmy_mixer = dpx_test_mixer:my_mixer\n")


def test_model_family_from_another_package(tmp_path, dpx):
    env = {"PYTHONPATH": str(_site(tmp_path))}
    code = ("import torch, dpx.models as m; from dpx.models.plugins import families; "
            "mdl = m.build_model({'family': 'my_mixer', 'vocab_size': 11, 'hidden_size': 16, 'num_layers': 2}); "
            "y = mdl(torch.randint(0, 11, (2, 7))); y = y.logits if hasattr(y, 'logits') else y; "
            "print(json.dumps({'families': list(families()), 'shape': list(y.shape)}))")
    r = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True,
                       env={**__import__("os").environ, **env}, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["families"][-1] == "my_mixer" and out["shape"] == [2, 7, 11]
    recipe = tmp_path / "plug.yaml"
    recipe.write_text("name: plugmix\nmodel: {family: my_mixer, hidden_size: 16, num_layers: 1}\n"
                      "task: {name: word_problem, group: S3, train_len: 8, test_len: 12, val_samples: 32}\n"
                      "train: {steps: 3, batch_size: 8, eval_every: 3, log_every: 1, checkpoint_every: 3}\n"
                      "eval: {num_samples: 16, batch_size: 16}\ntracking: {enabled: false}\n")
    r = dpx("expand", str(recipe), "--format", "ids", env=env)
    assert r.returncode == 0 and len(r.stdout.split()) == 1, r.stderr
    r = dpx("expand", str(recipe), "model.family=my_mixr", env=env)
    assert r.returncode == 2 and "did you mean 'my_mixer'" in r.stderr, r.stderr
    r = dpx("submit", str(recipe), "--wait", ws=tmp_path / "ws", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "completed" in r.stdout

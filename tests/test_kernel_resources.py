"""Every Triton kernel that a training step launches fits a Hopper SM: benchmarks/kernel_resources.py compiles
the launches ahead of time for sm_90 on this CPU machine (Triton's compiler and its bundled ptxas; no GPU), and
at least one autotune config of each launch must stay within 227 KB of shared memory per block, or the call
fails with OutOfResources on an H100/H200. Cases: the heaviest of each backward path. A subprocess, because the
interpreter tests set TRITON_INTERPRET=1 in this process, and interpreted kernels cannot be compiled."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "kernel_resources.py"
HEAVY = {"chunk_dp_bwd_kernel_dqkwg", "chunk_dp_bwd_kernel_dh"}  # the backward kernels with [64, K] tiles


@pytest.mark.parametrize("dtype,d,n,path", [("bf16", 256, 2, "triton"),       # 16-bit tiles at K = 256
                                            ("fp32", 128, 1, "triton_fp32"),  # the widest float32 tiles
                                            ("fp32", 256, 3, "torch_fp32")])  # would not fit: PyTorch backward
def test_backward_launches_fit_hopper_shared_memory(tmp_path, dtype, d, n, path):
    import torch
    from dpx.kernels.delta_product.chunk import backward_path
    assert backward_path({"bf16": torch.bfloat16, "fp32": torch.float32}[dtype], n, d) == path
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DPX_KERNEL_BWD_FP32")}
    r = subprocess.run([sys.executable, str(SCRIPT), "--dtypes", dtype, "--dims", str(d), "--ns", str(n),
                        "--kernels", "kernel_inv,kernel_wu,bwd_kernel_dh,dqkwg", "--json", str(tmp_path / "r.json")],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    launches = json.loads((tmp_path / "r.json").read_text())["launches"]
    names = {x["kernel"] for x in launches}
    assert {"chunk_dp_fwd_kernel_inv", "chunk_dp_fwd_kernel_wu"} <= names, names
    assert (HEAVY <= names) == (path != "torch_fp32"), names  # the PyTorch backward launches no Triton kernel
    for x in launches:
        assert x["fits"] and all(c.get("error") is None for c in x["configs"]), x


@pytest.mark.parametrize("dtype,dims,n", [("bf16", "32,64,85,128,256", 2), ("fp32", "32,85,128", 3),
                                          ("fp32", "64", 4)])  # n_h = 4: float32's 32-row query tiles (16 faulted)
def test_every_autotune_config_of_every_kernel_compiles_for_sm90(tmp_path, dtype, dims, n):
    # every kernel a forward + backward and a decode step launch, every autotune config it would try, at every head
    # dim of the GPU acceptance check (benchmarks/gpu_check.py): each compiles for sm_90 and fits its shared memory
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DPX_KERNEL_BWD_FP32")}
    r = subprocess.run([sys.executable, str(SCRIPT), "--dtypes", dtype, "--dims", dims, "--ns", str(n),
                        "--json", str(tmp_path / "r.json")], capture_output=True, text=True, env=env, timeout=2400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    launches = json.loads((tmp_path / "r.json").read_text())["launches"]
    names = {x["kernel"] for x in launches}
    # at n_h > 1 the output kernel is o_tok (over the walk's per-chunk states in training, over chunk_super's walk in
    # the no-grad forward)
    want = {"chunk_dp_fwd_kernel_inv", "chunk_dp_fwd_kernel_wu", "chunk_dp_fwd_kernel_h", "chunk_dp_fwd_kernel_o_tok",
            "chunk_dp_fwd_kernel_h_super", "fused_recurrent_dp_fwd_kernel"}
    assert want <= names, names
    assert {x["d"] for x in launches} == {int(d) for d in dims.split(",")}
    for x in launches:
        for c in x["configs"]:
            assert c.get("error") is None, (x["kernel"], x["d"], c)
            # a config over the shared memory limit is skipped by the autotuner; one must fit
        assert x["fits"], x


@pytest.mark.parametrize("dtype,dims,n", [("bf16", "32,64,85,128,256", 2), ("fp32", "32,85,128", 3)])
def test_split_dqkwg_kernels_compile_for_sm90(tmp_path, dtype, dims, n):
    # DPX_KERNEL_DQKWG=split (opt-in): both kernels of chunk_bwd_split, every autotune config, at the GPU check's
    # head dims: each compiles for sm_90 and fits its shared memory
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DPX_KERNEL_BWD_FP32")}
    r = subprocess.run([sys.executable, str(SCRIPT), "--dtypes", dtype, "--dims", dims, "--ns", str(n), "--dqkwg",
                        "split", "--kernels", "dqkw,kernel_wy", "--json", str(tmp_path / "r.json")],
                       capture_output=True, text=True, env=env, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    launches = json.loads((tmp_path / "r.json").read_text())["launches"]
    assert {x["kernel"] for x in launches} == {"chunk_dp_bwd_kernel_dqkw", "chunk_dp_bwd_kernel_wy"}
    assert {x["d"] for x in launches} == {int(d) for d in dims.split(",")}
    for x in launches:
        assert x["fits"] and all(c.get("error") is None for c in x["configs"]), x


@pytest.mark.parametrize("dtype,dims,n", [("bf16", "32,64,85,128,256", 2), ("fp32", "32,85,128", 3),
                                          ("bf16", "64,128", 4)])
def test_super_forward_kernels_compile_for_sm90(tmp_path, dtype, dims, n):
    # DPX_KERNEL_FWD=super (opt-in): chunk_super's state walk and output kernels, every autotune config, at the GPU
    # check's head dims: each compiles for sm_90 and fits its shared memory
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DPX_KERNEL_BWD_FP32")}
    env["DPX_KERNEL_FWD"] = "super"
    r = subprocess.run([sys.executable, str(SCRIPT), "--dtypes", dtype, "--dims", dims, "--ns", str(n),
                        "--kernels", "h_super,o_super", "--json", str(tmp_path / "r.json")],
                       capture_output=True, text=True, env=env, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    launches = json.loads((tmp_path / "r.json").read_text())["launches"]
    assert {x["kernel"] for x in launches} == {"chunk_dp_fwd_kernel_h_super", "chunk_dp_fwd_kernel_o_super"}
    assert {x["d"] for x in launches} == {int(d) for d in dims.split(",")}
    for x in launches:
        assert x["fits"] and all(c.get("error") is None for c in x["configs"]), x


CONV_LOADS = r"""
import json, sys
sys.path.insert(0, "benchmarks")
import kernel_resources as kr, lm_throughput as lt
from dpx.models import build_model
from dpx.models.mixers.delta import DeltaProductMixer
out = {}
for shape in ("fig4", "table3"):
    for variant in ("1", "2", "3", "g1", "g2", "g3"):
        m = next(x for x in build_model({**lt.model_config(shape, variant), "num_layers": 1}).modules()
                 if isinstance(x, DeltaProductMixer))
        w, sizes = m._in_weight()
        starts = [sum(sizes[:i]) for i in range(0, len(sizes), 2)]  # sizes: each part's width, then its pad
        for name, off, c, g in (("q", starts[0], sizes[0], m.K), ("k", starts[1], sizes[2], m.K),
                                ("v", starts[2], sizes[4], 0)):
            key = f"{w.shape[0]}/{off}/{c}/{g}"
            if key not in out:
                out[key] = kr.conv_x_loads(w.shape[0], off, c, g)
out["unpadded 5400/768/2304/128"] = kr.conv_x_loads(5400, 768, 2304, 128)
print(json.dumps(out))
"""


def test_short_conv_loads_of_every_lm_shape_are_vectorized():
    # the short conv reads q/k/v as column slices of the fused input projection; unless its row stride is a
    # multiple of 16 elements, Triton does not specialize it and every load of x is a 2-byte scalar load (fig4 at
    # n_h = 3 padded to 8 was 5400 wide: 128 `ld.global.b16` a thread in each kernel). Every fig4/table3 variant the
    # LM benchmark builds, compiled for sm_90 from its real launch; the unpadded width shows the check can fail.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", CONV_LOADS], capture_output=True, text=True, env=env, timeout=900,
                       cwd=SCRIPT.parent.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    loads = json.loads(r.stdout.strip().splitlines()[-1])
    bad = loads.pop("unpadded 5400/768/2304/128")
    assert all("ld.global.b16" in v for v in bad.values()), bad
    assert len(loads) >= 12, loads
    for key, kernels in loads.items():
        assert set(kernels) == {"_conv_fwd_kernel", "_conv_bwd_kernel"}, key
        _, _, c, g = map(int, key.split("/"))
        if g % 8 or c % 16:  # head dim 85 (Table 3, n_h = 2): q/k programs start at column i * 85, and v's 680
            continue         # channels leave the mask `cols < C` unspecialized: kernel-side, no padding removes it
        for name, ld in kernels.items():
            assert "ld.global.b16" not in ld and any(".v" in i for i in ld), (key, name, ld)

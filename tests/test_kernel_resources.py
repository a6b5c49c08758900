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

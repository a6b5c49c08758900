"""The gated per-chunk gradient diagnostics (benchmarks/dqkwg_diag.py, dqkwg_spills.py) stay in step with the kernel.

Their variants are built by text substitution in kernels/delta_product/chunk_bwd.py; a kernel edit that moves one of
those lines would make the GPU call fail after minutes of compiling (or, worse, time the wrong thing). These checks
run on the CPU in a second: every substitution matches exactly once, every variant is valid Python, and the pending
patches the device call times as extra variants still apply to main.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import dqkwg_spills  # noqa: E402  (reads dqkwg_diag's tables from its source: no torch import)


def test_every_variant_builds_is_valid_python_and_changes_the_kernel():
    # variant_source itself refuses (SystemExit) a substitution that does not match chunk_bwd.py exactly once
    subs, variants = dqkwg_spills.diag_tables()
    src = open(dqkwg_spills.KFILE).read()
    for name, terms in variants.items():
        out = dqkwg_spills.variant_source(name, src, subs, variants, {})
        compile(out, f"<{name}>", "exec")
        assert (out == src) == (not terms), name  # "gated" / "plain" are main's; every other variant differs


@pytest.mark.skipif(shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")),
                    reason="needs a git checkout")
@pytest.mark.parametrize("patch", ["dg-lean.patch", "autotune-spaces.patch"])
def test_pending_diag_patches_apply_to_main(patch):
    r = subprocess.run(["git", "apply", "--check", os.path.join("benchmarks", "pending", patch)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

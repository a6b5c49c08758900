"""Run a benchmark script against the patched copy of kernels/ that time_patches.sh builds: the copy's kernels/ is
registered as dpx.kernels in sys.modules before the script runs, so neither an editable install of main (its finder
won over PYTHONPATH on the H200 image in session 11's first call) nor the repository root can supply main's kernels.
    python3 run_patched.py /tmp/dpx_pending benchmarks/kernels.py --out ... (the script's own arguments)"""
import os
import runpy
import sys

tree, script = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(tree, "benchmarks"))
from dpx_checkout import expose_kernels  # noqa: E402  (the copy's, which registers the copy's kernels/)

expose_kernels()
where = sys.modules["dpx.kernels"].__file__
assert os.path.realpath(where).startswith(os.path.realpath(tree)), where
print("patched tree imports", where, flush=True)
sys.argv = [os.path.join(tree, script)] + sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")

#!/usr/bin/env bash
# A Ray wheel (CPython 3.12, x86-64) small enough to carry to the GPU machine, whose image lacks Ray.
# ray-2.60.0's wheel is 79 MB, over the device tool's 64 MiB working-tree limit; 31 MB of it is the Java worker
# (ray/jars/ray_dist.jar), the rest the dashboard's web client and RLlib, none of which a Python driver with
# include_dashboard=False loads. This repacks the wheel without them (RECORD rewritten to match) into .whl-ray/
# (git-ignored through .git/info/exclude), with Ray's one dependency the image also lacks: jsonschema and its
# own (referencing, jsonschema-specifications, rpds-py), and what `dpx submit` needs beyond the image (pydantic,
# omegaconf; not duckdb, which only `dpx query/report` use): 45 MB in all, so the folder travels alone (carry
# .whl-ray; `pip install --no-deps --target /tmp/site .whl-ray/*.whl`, PYTHONPATH=/tmp/site).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-3.12}
OUTD=${OUTD:-.whl-ray}
grep -qx '/.whl-ray/' .git/info/exclude 2>/dev/null || echo '/.whl-ray/' >> .git/info/exclude
mkdir -p "$OUTD" /tmp/ray_wheel_dl
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp "${PLAT[@]}" "$@"; }
dl -d /tmp/ray_wheel_dl ray==2.60.0
dl -d "$OUTD" jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 omegaconf==2.4.0 \
  typing-extensions==4.16.0
python3 - "$PY" "$OUTD" <<'EOF'
import sys, zipfile, glob
py, outd = sys.argv[1].replace(".", ""), sys.argv[2]
src = glob.glob(f"/tmp/ray_wheel_dl/ray-2.60.0-cp{py}-*.whl")[0]
drop = ("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/")
dst = f"{outd}/{src.rsplit('/', 1)[1]}"
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zo:
    for info in zi.infolist():
        if info.filename.startswith(drop):
            continue
        data = zi.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(l for l in data.splitlines(True) if not l.decode().startswith(drop))
        zo.writestr(info, data)
print(dst)
EOF
ls -la "$OUTD"; du -sh "$OUTD"

#!/usr/bin/env bash
# On the GPU machine, after one_run.sh's suite (nothing else on the GPU): the Python package's CUDA
# tests (a CUDA tensor read in place, python/tests -k cuda) and the load times of the transformer
# exports (issue 32: SwinUNETR 48 and UNETR as W5/W6 export them, `voxtile plan` on the CPU and on the
# GPU, wall seconds). Carry WHEELS (the release wheel, `maturin build --release --out .whl`, and
# pytest's wheels) and run from the repository root:
#   bash tests/gpu/python_cuda.sh [WHEELS=.whl] [SHARED=/tmp/one_repo/.dev/one/shared] [BUNDLE=/tmp/one_repo/.dev/one/gb]
# Results in $OUT/py_cuda.log and $OUT/load_times.txt; the last lines printed are the summary.
set -u
W=${1:-.whl}; S=${2:-/tmp/one_repo/.dev/one/shared}; B=${3:-/tmp/one_repo/.dev/one/gb}; O=${OUT:-/tmp}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/pysite "$W"/*.whl
# The tests run from a copy: the source package under python/ would shadow the installed one.
rm -rf /tmp/pyt && cp -r python/tests /tmp/pyt
(cd /tmp/pyt && PYTHONPATH=/tmp/pysite VOXTILE_SHARED_DIR="$S" timeout 300 python3 -m pytest -q -s -k cuda . \
  > "$O/py_cuda.log" 2>&1; echo "pytest rc $?" >> "$O/py_cuda.log")
# The exports (MONAI from the bench bundle's wheels, installed by bench.sh into /tmp/site).
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$B"/wheels/*.whl
mkdir -p /tmp/tx
PYTHONPATH=/tmp/site timeout 300 python3 - <<'EOF' > "$O/load_times.txt" 2>&1
import torch
from monai.networks.nets import UNETR, SwinUNETR
torch.manual_seed(1)
nets = {
    "swinunetr": lambda: SwinUNETR(in_channels=1, out_channels=14, feature_size=48, depths=(2, 2, 2, 2),
                                   num_heads=(3, 6, 12, 24)),
    "unetr": lambda: UNETR(in_channels=1, out_channels=14, img_size=(96, 96, 96), feature_size=16,
                           hidden_size=768, mlp_dim=3072, num_heads=12),
}
for name, make in nets.items():
    with torch.no_grad():
        torch.onnx.export(make().eval(), torch.randn(1, 1, 96, 96, 96), f"/tmp/tx/{name}.onnx",
                          input_names=["image"], output_names=["logits"], opset_version=17, dynamo=False)
    print("exported", name, flush=True)
EOF
for m in swinunetr unetr; do
  for dev in cpu cuda; do
    t0=$(date +%s.%N)
    XDG_CACHE_HOME=/tmp/voxtile-cache timeout 300 "$B"/voxtile plan -m /tmp/tx/$m.onnx --volume 512x512x128 \
      --device $dev > /tmp/tx/plan_${m}_${dev}.txt 2>&1
    rc=$?; t1=$(date +%s.%N)
    echo "LOAD $m plan --device $dev: $(python3 -c "print(f'{$t1-$t0:.2f}')") s (rc $rc)" >> "$O/load_times.txt"
  done
done
tail -5 "$O/py_cuda.log"
grep LOAD "$O/load_times.txt"

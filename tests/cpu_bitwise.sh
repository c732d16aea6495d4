#!/usr/bin/env bash
# CPU outputs of two voxtile binaries on the same fixtures, compared bit for bit (data + header).
# usage: tests/cpu_bitwise.sh OLD_BIN NEW_BIN   (from the repository root; SHARED=../shared, PY=python3 with numpy + nibabel)
set -u
OLD=$1; NEW=$2; S=${SHARED:-../shared}/fixtures; W=/tmp/bitwise; rm -rf $W; mkdir -p $W/old $W/new
PY=${PY:-python3}
[ -f /tmp/bw_ct.nii.gz ] || S=$S $PY - <<'P'
import nibabel as nib, numpy as np
v = nib.load(__import__("os").environ["S"] + "/volumes/ts_example_ct_sm.nii.gz")
a = np.asarray(v.dataobj, dtype=np.float32)[:96, :96, :48]
nib.save(nib.Nifti1Image(a, v.affine), "/tmp/bw_ct.nii.gz")
P
cases=(
 "sample|data/mni_t1_128.nii.gz --model data/deepbrain.onnx --device cpu"
 "sample_sw|data/mni_t1_128.nii.gz --model data/deepbrain.onnx --device cpu --roi 64 --overlap 0.5"
 "sample_tta|data/mni_t1_128.nii.gz --model data/deepbrain.onnx --device cpu --roi 96 --tta 0"
 "sample_z|data/mni_t1_128.nii.gz --model data/deepbrain.onnx --device cpu --roi 64 --normalize zscore --blend hann --placement nnunet"
 "nnunet_ct|/tmp/bw_ct.nii.gz --model $S/models/nnunet_small.onnx --device cpu --roi 32 --overlap 0.25 --normalize ct:-1000,1000,0,300"
 "monai_ct|/tmp/bw_ct.nii.gz --model $S/models/monai_unet_small.onnx --device cpu --roi 32,32,16 --pad edge"
 "sample_sp|data/mni_t1_128.nii.gz --model data/deepbrain.onnx --device cpu --roi 64 --spacing 1.5"
)
fail=0
for c in "${cases[@]}"; do
  name=${c%%|*}; args=${c#*|}
  for who in old new; do
    bin=$OLD; [ $who = new ] && bin=$NEW
    $bin segment $args -o $W/$who/$name.nii.gz --logits $W/$who/${name}_logits.nii.gz --force >$W/$who/$name.log 2>&1 || echo "$who $name rc=$?"
  done
  $PY - "$W/old" "$W/new" "$name" <<'P' || fail=1
import sys, nibabel as nib, numpy as np
o, n, name = sys.argv[1:]
ok = True
for f in (f"{name}.nii.gz", f"{name}_logits.nii.gz"):
    a, b = nib.load(f"{o}/{f}"), nib.load(f"{n}/{f}")
    da, db = np.asarray(a.dataobj), np.asarray(b.dataobj)
    same = da.dtype == db.dtype and da.shape == db.shape and da.tobytes() == db.tobytes() and np.array_equal(a.affine, b.affine) and bytes(a.header.binaryblock) == bytes(b.header.binaryblock)
    ok &= same
    print(f"{name:10s} {f:28s} {'BITWISE EQUAL' if same else 'DIFFERENT'} {da.shape}")
sys.exit(0 if ok else 1)
P
done
echo "bitwise: $([ $fail = 0 ] && echo ALL EQUAL || echo SOME DIFFER)"

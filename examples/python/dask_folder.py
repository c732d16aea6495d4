"""Segment a folder of cases over a Dask cluster: one voxtile.Model per worker (loaded when the
worker starts, kept for every case it gets), each result written by its worker as it finishes.
Dask is the distributed engine; voxtile only segments arrays. On one machine this starts a
LocalCluster; give --scheduler ADDRESS to use a cluster you already run.

usage: python examples/python/dask_folder.py IN_DIR OUT_DIR -m MODEL.onnx [--workers 2]
           [--device cpu] [--memory-budget 4GiB] [--scheduler tcp://host:8786]
Cases are the .nii / .nii.gz files of IN_DIR; a case whose output exists is skipped.
"""
import argparse
import os
import sys
import time

import nibabel as nib
import numpy as np
from dask.distributed import Client, LocalCluster, WorkerPlugin, as_completed, get_worker

import voxtile


class VoxtileModel(WorkerPlugin):
    """One voxtile.Model per worker, made when the worker starts."""

    name = "voxtile-model"

    def __init__(self, path, **options):
        self.path, self.options = path, options

    def setup(self, worker):
        worker.voxtile_model = voxtile.Model(self.path, **self.options)


def segment_case(src, dst):
    """On a worker: read, segment with the worker's model, write (a temp file renamed into
    place, so a killed run leaves no half-written output)."""
    t = time.perf_counter()
    model = get_worker().voxtile_model
    img = nib.load(src)
    x = np.asarray(img.dataobj, dtype=np.float32)
    if x.ndim == 4:
        x = np.moveaxis(x, -1, 0)
    labels = model.segment(x, affine=img.affine)
    out = nib.Nifti1Image(labels, img.affine)
    out.set_qform(img.affine, int(img.header["qform_code"]) or 1)
    out.set_sform(img.affine, int(img.header["sform_code"]) or 1)
    tmp = dst + ".part.nii.gz"
    nib.save(out, tmp)
    os.replace(tmp, dst)
    return dst, get_worker().address, time.perf_counter() - t


def cases(in_dir, out_dir):
    """(input, output) of every case still to do, sorted."""
    todo = []
    for name in sorted(os.listdir(in_dir)):
        if name.endswith((".nii", ".nii.gz")):
            dst = os.path.join(out_dir, name if name.endswith(".gz") else name + ".gz")
            if not os.path.exists(dst):
                todo.append((os.path.join(in_dir, name), dst))
    return todo


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("in_dir")
    ap.add_argument("out_dir")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--memory-budget", default=None)
    ap.add_argument("--scheduler", default=None, help="a running scheduler's address")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    todo = cases(a.in_dir, a.out_dir)
    if not todo:
        print("nothing to do")
        return 0
    if a.scheduler:
        client = Client(a.scheduler)
    else:
        # One thread per worker: a worker runs one case at a time on its model.
        client = Client(LocalCluster(n_workers=a.workers, threads_per_worker=1,
                                     dashboard_address=None))
    plugin = VoxtileModel(os.path.abspath(a.model), device=a.device,
                          memory_budget=a.memory_budget)
    register = getattr(client, "register_plugin", None) or client.register_worker_plugin
    register(plugin)
    futures = [client.submit(segment_case, src, dst, pure=False) for src, dst in todo]
    failed = 0
    for fut in as_completed(futures):
        try:
            dst, worker, seconds = fut.result()
            print(f"{dst}  {seconds:.1f} s on {worker}", flush=True)
        except Exception as e:  # one case's error does not stop the others
            failed += 1
            print(f"error: {e}", file=sys.stderr, flush=True)
    client.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

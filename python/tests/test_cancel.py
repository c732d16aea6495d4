"""Stopping a run: Model.cancel() from another thread, and Ctrl-C (SIGINT) in a script."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import voxtile


@pytest.fixture(scope="module")
def slow(shared):
    # Many small windows: a run of several seconds that checks its token before each batch.
    return voxtile.Model(shared / "models" / "nnunet_small.onnx", device="cpu", roi=32,
                         overlap=0.75, batch=1, allow_small_roi=True)


def test_cancel_from_another_thread(slow):
    x = np.random.default_rng(1).random((64, 64, 64), dtype=np.float32)
    seen = []
    timer = threading.Timer(0.5, slow.cancel)
    timer.start()
    t = time.perf_counter()
    with pytest.raises(voxtile.Cancelled):
        slow.segment(x, progress=lambda done, total: seen.append((done, total)))
    took = time.perf_counter() - t
    timer.join()
    total = seen[-1][1] if seen else None
    assert not seen or seen[-1][0] < total, "the run finished before it was cancelled"
    assert took < 20
    # The model runs again afterwards.
    assert slow.segment(x[:32, :32, :32]).shape == (32, 32, 32)


def test_ctrl_c_stops_a_run(shared):
    # The child restores Python's own SIGINT handler: a shell that starts a job with `&` hands it
    # SIGINT ignored, and Python keeps an inherited "ignore" (no KeyboardInterrupt at all then).
    script = f"""
import numpy as np, signal, sys, voxtile
signal.signal(signal.SIGINT, signal.default_int_handler)
m = voxtile.Model({str(shared / "models" / "nnunet_small.onnx")!r}, device="cpu", roi=32,
                  overlap=0.75, batch=1, allow_small_roi=True)
x = np.random.default_rng(1).random((64, 64, 64), dtype=np.float32)
def started(done, total):
    if done == 1:
        print("running", flush=True)
try:
    m.segment(x, progress=started)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
print("finished", flush=True)
"""
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                         stderr=subprocess.DEVNULL)
    assert p.stdout.readline().strip() == "running"
    t = time.perf_counter()
    os.kill(p.pid, signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 3, out
    assert "interrupted" in out
    assert time.perf_counter() - t < 20

"""voxtile against its PyTorch + MONAI peers on the GPU, every workload and peer mode in one run:
W1 (nnU-Net CT net) and W2 (MONAI UNet) on the same 512x512x128 volume and the same random weights
(exported to ONNX in the run), each peer mode timed apart (eager fp16, eager channels_last_3d,
torch.compile default, reduce-overhead, max-autotune-no-cudagraphs); W3 (the CLI end to end against
peer_e2e.py); W4 (1024x1024x512, voxtile at --memory-budget 4GiB against MONAI with its whole
accumulator on the GPU); W5 (MONAI SwinUNETR feature_size 48) and W6 (MONAI UNETR feature_size 16,
hidden 768), roi 96³ on the W1 volume, each export's load timed by `voxtile plan` (a voxtile that
refuses a net is recorded as such, the peers are timed all the same); K1 (one conv against cuDNN). Each ratio is voxtile's time over the best peer's of the same run. Writes OUT/bench.json and OUT/bench.md after every step, so a run cut short
keeps what it measured. See tests/gpu/README.md.

usage: python3 tests/gpu/bench.py run --bundle DIR --out DIR [--only w1,w2,w3,w4,w5,w6,k1] [--modes ...]
                                      [--w4-modes eager,default] [--w5-modes eager,default,...]
                                      [--w6-modes eager,default]
                                      [--deadline S] [--mode-timeout S]
       python3 tests/gpu/bench.py merge OUT RESULT.json [RESULT.json ...]   (no GPU: joins two calls)
"""
import argparse, json, os, re, signal, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_table as bt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TITLES = {
    "w1": "W1 nnU-Net CT net, 512x512x128, 49 windows",
    "w2": "W2 MONAI UNet 16..256, 512x512x128, 49 windows",
    "w3": "W3 CLI end to end, int16 .nii.gz -> uint8 labels .nii.gz (W1 net)",
    "w4": "W4 W1 net on 1024x1024x512, voxtile at --memory-budget 4GiB",
    "w5": "W5 MONAI SwinUNETR 48 (14 classes), 512x512x128, roi 96³, 200 windows",
    "w6": "W6 MONAI UNETR 16 (hidden 768, 12 heads, 14 classes), 512x512x128, roi 96³, 200 windows",
    "k1": "K1 fp16 conv 32->32 3³, 2x32x128³",
}
W4_SHAPE, W4_BUDGET = (1024, 1024, 512), "4GiB"
# The transformers' exports fix the window (tests/gpu/bench_peer.py's ROIS); their batch-1 traces
# run several windows per call after voxtile's batch rewrite. W5 at 2 (1.69 GiB: its issue's bar is
# 2 GiB; batch 4 takes 2.66), W6 at 4 (1.36 GiB; 0.555 s against 0.729 s at 2, session 14).
TRANSFORMER_ROI, TRANSFORMER_BATCH = 96, dict(w5=2, w6=4)
# The volume prep writes (bench_peer.py's prep), which the load time's `voxtile plan` plans for.
VOLUME = (512, 512, 128)


def w4_note(vx):
    """Roi, batch, windows and device peak of a timed W4 voxtile run (its report replaced by its
    stage times, kept as the W1/W2 rows keep theirs)."""
    rep = vx.pop("report")
    vx["stages"] = dict(seconds=rep.get("seconds"), gpu=rep.get("gpu"), bands=rep.get("bands"))
    pred = ((rep.get("predicted_peak_bytes") or {}).get("device") or 0) / bt.GIB
    bands = rep.get("bands") or []
    cut = (f" in {len(bands)} bands along H (rows {', '.join(f'{a}-{b}' for a, b in bands)}), "
           f"{rep.get('windows_run')} windows run") if len(bands) > 1 else ""
    return (f"voxtile roi {'x'.join(map(str, rep['roi']))}, batch {rep['batch']}, {rep['windows']} windows{cut}, "
            f"device peak predicted {pred:.3f} / measured {vx['peak_gib']:.3f} GiB")


class Bench:
    """One run: its options, the results so far, and the files they are written to."""

    peer_script = os.path.join(HERE, "bench_peer.py")

    def __init__(self, a):
        self.a, self.t0 = a, time.monotonic()
        self.id = time.strftime("%Y%m%dT%H%M%S")
        self.bin = os.path.join(a.bundle, "bench")
        self.meta = dict(id=self.id, only=a.only, modes=a.modes, w4_modes=a.w4_modes, w5_modes=a.w5_modes,
                         w6_modes=a.w6_modes, argv=sys.argv[1:])
        self.res = {"runs": [self.meta], "rows": {}, "extra": []}
        os.makedirs(a.out, exist_ok=True); os.makedirs(a.work, exist_ok=True)
        self.env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{a.work}/inductor-{self.id}",
                        TRITON_CACHE_DIR=f"{a.work}/triton-{self.id}")

    def left(self):
        return None if self.a.deadline is None else self.a.deadline - (time.monotonic() - self.t0)

    def save(self):
        self.meta["wall_s"] = time.monotonic() - self.t0
        with open(f"{self.a.out}/bench.json", "w") as f:
            json.dump(self.res, f, indent=1)
        with open(f"{self.a.out}/bench.md", "w") as f:
            f.write(bt.markdown(self.res))

    def job(self, cmd, timeout, what, env=None, json_out=True):
        """Runs cmd in its own process group: its last stdout line as JSON (or, with json_out False,
        its wall time and stdout), or {"error"} / {"skipped"}. The timeout is cut to what the
        deadline leaves; on expiry the whole group is killed."""
        left = self.left()
        if left is not None:
            if left < 20:
                return {"skipped": f"deadline ({self.a.deadline:.0f} s) reached"}
            timeout = min(timeout, left - 10)
        print(f"[{time.monotonic() - self.t0:6.1f} s] {what} (timeout {timeout:.0f} s)", flush=True)
        t = time.perf_counter()
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or self.env,
                                 start_new_session=True)
        except OSError as e:  # a binary missing from the bundle costs its step only
            return {"error": f"{cmd[0]}: {e.strerror}"}
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            try:
                _, err = p.communicate(timeout=30)
                sys.stderr.write(err[-2000:])
            except subprocess.TimeoutExpired:  # a grandchild outside the group holds the pipes
                p.stdout.close(); p.stderr.close()
            return {"error": f"timed out after {timeout:.0f} s"}
        if p.returncode != 0:
            sys.stderr.write(err[-3000:])
            last = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or [f"exit status {p.returncode}"]
            return {"error": last[0][:300]}
        if not json_out:
            return dict(wall_s=time.perf_counter() - t, stdout=out.strip())
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            return {"error": f"no JSON line in its output: {out[-200:]!r}"}

    def worker(self, args, timeout, what):
        r = self.job([sys.executable, self.peer_script, *args], timeout, what)
        for k in ("gpu", "torch", "monai", "cudnn"):
            if r.get(k) is not None:
                self.meta[k] = r.pop(k)
        return r

    def row(self, w):
        return self.res["rows"].setdefault(w, dict(title=TITLES[w], peers={}, voxtile={}, notes=[]))

    def peer_mode(self, w, mode, reps, shape=None):
        args = ["peer", self.a.work, w, mode, str(reps)] + (["x".join(map(str, shape))] if shape else [])
        e = self.worker(args, self.a.eager_timeout if mode.startswith("eager") else self.a.mode_timeout, f"{w} peer {mode}")
        e["run"] = self.id
        self.row(w)["peers"][mode] = e
        print(w, mode, json.dumps({k: v for k, v in e.items() if k != "times"}), flush=True)
        self.save()

    def voxtile(self, w, args, timeout):
        """examples/bench.rs on the run's ONNX: its JSON line, or the error."""
        r = self.job([self.bin, *args], timeout, f"{w} voxtile")
        if "s" not in r and "median_s" in r:
            rep = r["report"]
            r = dict(s=r["median_s"], first_s=r["first_s"], times=r["times"], report=rep,
                     peak_gib=(rep.get("peak_device_bytes") or 0) / bt.GIB, engine_load_s=r.get("load_s"))
        r["run"] = self.id
        return r

    def sliding(self, w):
        """W1 / W2: eager first (its labels are the agreement reference), voxtile, then the other modes."""
        import numpy as np
        row = self.row(w)
        modes = self.a.modes
        if "eager" in modes:
            self.peer_mode(w, "eager", self.a.reps)
        lab = f"{self.a.work}/{w}_labels.npy"
        vx = self.voxtile(w, [f"{self.a.work}/{w}.onnx", f"{self.a.work}/vol.npy", "128", "0.5", "4", "5", "cuda", lab], 120)
        if "s" in vx:
            vx["notes"] = [f"{vx['report']['windows']} windows, voxtile first run {vx['first_s']:.3f} s"]
            ref = f"{self.a.work}/{w}_peer_labels.npy"
            if os.path.exists(ref) and row["peers"].get("eager", {}).get("s") is not None:
                agree = float((np.load(lab).astype(np.int64) == np.load(ref)).mean())
                vx["label_agreement"] = agree
                vx["notes"].append(f"labels agree with the eager peer on {agree:.2%} of voxels")
            rep = vx.pop("report", None) or {}
            # Where the call's time goes: the engine's stage seconds and the GPU pass's own split.
            vx["stages"] = dict(seconds=rep.get("seconds"), gpu=rep.get("gpu"))
        row["voxtile"][self.id] = vx; self.save()
        for m in modes:
            if m != "eager":
                self.peer_mode(w, m, self.a.reps)

    def w4(self):
        row = self.row("w4")
        acc = bt.monai_accumulator_bytes(W4_SHAPE, 14) / bt.GIB
        vin = W4_SHAPE[0] * W4_SHAPE[1] * W4_SHAPE[2] * 4 / bt.GIB
        wins = bt.monai_windows(W4_SHAPE, (128,) * 3, 0.5)
        row["notes"] = [f"MONAI's accumulator (14-class fp32 output + fp32 count map) {acc:.1f} GiB, "
                        f"plus the fp32 input {vin:.1f} GiB, computed; on the GPU (139 GiB) its peer runs "
                        f"roi 128³, {wins} windows"]
        shape = "x".join(map(str, W4_SHAPE))
        args = [f"{self.a.work}/w1.onnx", shape, "auto", "0.5", "auto", "1", "cuda", "-"]
        vx = self.voxtile("w4", args + [W4_BUDGET], 240)
        if "s" not in vx:
            # Refused at the target budget (the planner keeps the model's window): time it at the
            # least whole GiB that holds that window, as a note, so the speed is still measured.
            m = re.search(r"needed: (\d+)", vx.get("error", ""))
            if m:
                gib = -(-int(m.group(1)) // (1 << 30))
                fit = self.voxtile("w4", args + [f"{gib}GiB"], 240)
                vx["notes"] = [f"refused at {W4_BUDGET}; at --memory-budget {gib}GiB: "
                               + (f"{fit['s']:.2f} s, " + w4_note(fit) if "s" in fit else fit.get("error", "")[:200])]
        else:
            vx["notes"] = [w4_note(vx)]
        row["voxtile"][self.id] = vx; self.save()
        for m in self.a.w4_modes:
            self.peer_mode("w4", m, 1, W4_SHAPE)

    def load(self, w):
        """Wall seconds of `voxtile plan` on a transformer's export, in a process of its own: the file
        read, its constants folded and the prep volume planned on the GPU, nothing run (issue 32's
        load line). Returns (seconds, None) or (None, why not)."""
        cmd = [f"{self.a.bundle}/voxtile", "plan", "-m", f"{self.a.work}/{w}.onnx", "--volume", "x".join(map(str, VOLUME)),
               "--device", "cuda", "--json"]
        r = self.job(cmd, 120, f"{w} load (voxtile plan)", json_out=False)
        return r.get("wall_s"), r.get("error") or r.get("skipped")

    def transformer(self, w):
        """W5 / W6: eager first, the export's load time, voxtile (or the line it refuses the net with),
        then the compiles; the labels' agreement is with the best peer, so it is computed once every
        mode has run."""
        import numpy as np
        row, work = self.row(w), self.a.work
        modes = getattr(self.a, f"{w}_modes")
        if "eager" in modes:
            self.peer_mode(w, "eager", self.a.reps)
        lab, onnx_error = f"{work}/{w}_labels.npy", self.meta.get("export_errors", {}).get(w)
        if onnx_error:
            vx = dict(error=f"the ONNX export failed: {onnx_error}", run=self.id)
        else:
            load_s, load_error = self.load(w)
            args = [f"{work}/{w}.onnx", f"{work}/vol.npy", str(TRANSFORMER_ROI), "0.5", str(TRANSFORMER_BATCH[w]), "3", "cuda", lab]
            vx = self.voxtile(w, args, 300)
            if load_s is not None:
                vx["load_s"] = load_s
            else:
                row["notes"].append(f"voxtile plan (load): {load_error}")
        if "s" in vx:
            vx["notes"] = [f"{vx.pop('report')['windows']} windows, voxtile first run {vx['first_s']:.3f} s"]
            if vx.get("engine_load_s") is not None:
                vx["notes"].append(f"Engine::from_file {vx['engine_load_s']:.2f} s")
        else:
            row["notes"].append(f"voxtile: {vx.get('error') or vx.get('skipped')}")
        row["voxtile"][self.id] = vx; self.save()
        for m in modes:
            if m != "eager":
                self.peer_mode(w, m, self.a.reps)
        best, _ = bt.best_peer({m: e for m, e in row["peers"].items() if e.get("run") == self.id})
        ref = bt.peer_labels(work, w, best) if best else None
        if "s" in vx and ref and os.path.exists(ref):
            ours = np.load(lab).astype(np.int64)
            agree = float((ours == np.load(ref)).mean())
            vx["label_agreement"], vx["agreement_with"] = agree, best
            vx["notes"].append(f"labels agree with the best peer ({bt.MODE_LABELS[best]}) on {agree:.2%} of voxels")
            eager = bt.peer_labels(work, w, "eager")
            # Issue 32's bar is against eager: said too when eager is not the best peer.
            if best != "eager" and row["peers"].get("eager", {}).get("run") == self.id and os.path.exists(eager):
                vx["label_agreement_eager"] = float((ours == np.load(eager)).mean())
                vx["notes"].append(f"with eager fp16 on {vx['label_agreement_eager']:.2%}")
        self.save()

    def w3(self):
        """The whole CLI process on the real CT at 512x512x128 against peer_e2e.py (nibabel + MONAI +
        PyTorch), both timed as processes; voxtile twice: a cold kernel cache, then a warm one."""
        wheels, work, row = f"{self.a.bundle}/wheels", self.a.work, self.row("w3")
        ct20 = f"{self.a.bundle}/shared/fixtures/volumes/ts_ct_512x512x20.nii.gz"
        ct = f"{work}/ct512.nii.gz"
        made = self.job([sys.executable, f"{wheels}/make_ct512.py", ct20, ct], 120, "w3 make_ct512", json_out=False)
        if "wall_s" not in made:
            row["peers"]["peer_e2e.py"] = dict(made, run=self.id); self.save(); return
        r = self.job([sys.executable, f"{wheels}/peer_e2e.py", ct, f"{work}/peer_seg.nii.gz"], 300, "w3 peer_e2e.py", json_out=False)
        row["peers"]["peer_e2e.py"] = dict(r, run=self.id)
        if "wall_s" in r:
            row["peers"]["peer_e2e.py"]["s"] = r["wall_s"]
            row["notes"] = [f"peer_e2e.py's own split: {r['stdout'].splitlines()[-1] if r['stdout'] else '?'}"]
        env = dict(self.env, XDG_CACHE_HOME=f"{work}/vx-cache-{self.id}")
        cmd = [f"{self.a.bundle}/voxtile", "segment", ct, "--model", f"{work}/w1.onnx", "-o", f"{work}/vx_seg.nii.gz",
               "--roi", "128", "--overlap", "0.5", "--batch", "4", "--normalize", "zscore", "--device", "cuda",
               "--force", "--report", f"{work}/w3_report.json"]
        cold = self.job(cmd, 120, "w3 voxtile, cold kernel cache", env, json_out=False)
        warm = self.job(cmd, 120, "w3 voxtile, warm kernel cache", env, json_out=False) if "wall_s" in cold else cold
        if "wall_s" in warm:
            with open(f"{work}/w3_report.json") as f:
                stages = json.load(f).get("seconds")
            row["voxtile"][self.id] = dict(s=warm["wall_s"], cold_s=cold["wall_s"], stages=stages, run=self.id, notes=[
                f"whole processes' wall; voxtile with a warm kernel cache, {cold['wall_s']:.2f} s cold"])
        else:
            row["voxtile"][self.id] = dict(warm, run=self.id)
        self.save()

    def k1(self):
        row = self.row("k1")
        fl = 2 * 2 * 32 * 128**3 * 32 * 27
        r = self.worker(["k1"], 180, "k1 cuDNN")
        if "error" in r or "skipped" in r:
            row["peers"]["cuDNN"] = dict(r, run=self.id)
        else:
            row["peers"]["cuDNN NDHWC"] = dict(s=r["ndhwc"], tflops=fl / r["ndhwc"] / 1e12, run=self.id)
            row["peers"]["cuDNN NCDHW"] = dict(s=r["ncdhw"], tflops=fl / r["ncdhw"] / 1e12, run=self.id)
        ops = f"{self.a.bundle}/it"
        p = self.job([ops, "cuda::ops::bench::bench_conv_32_32", "--nocapture", "--test-threads=1"], 300,
                     "k1 voxtile (it cuda::ops::bench)", json_out=False)
        vx = None
        for line in p.get("stdout", "").splitlines():
            if line.startswith("RESULT bench conv 32->32"):
                vx = float(line.split(":")[1].split("ms")[0]) / 1e3
        row["voxtile"][self.id] = (dict(s=vx, run=self.id, notes=[f"voxtile {fl / vx / 1e12:.1f} TF/s, cuDNN NDHWC "
                                                                   f"{row['peers'].get('cuDNN NDHWC', {}).get('tflops', 0):.1f} TF/s"])
                                   if vx else dict(error=p.get("error") or p.get("skipped") or "no RESULT line from it cuda::ops::bench", run=self.id))
        self.save()

    def mem(self):
        """Extra: W1 at 2/4/8 GiB on 512x512x128 and the 1024² volumes at 4 GiB (planner vs measured)."""
        for vol, b, reps in [("vol.npy", "2GiB", "1"), ("vol.npy", "4GiB", "1"), ("vol.npy", "8GiB", "1"),
                             ("1024x1024x256", "4GiB", "0"), ("1024x1024x512", "4GiB", "0")]:
            path = f"{self.a.work}/vol.npy" if vol == "vol.npy" else vol
            r = self.job([self.bin, f"{self.a.work}/w1.onnx", path, "auto", "0.5", "auto", reps, "cuda", "-", b], 120, f"mem {vol} {b}")
            row = dict(workload="mem", budget=b, volume="512x512x128" if vol == "vol.npy" else vol)
            if "median_s" in r:
                rep = r["report"]
                pred, meas = ((rep.get("predicted_peak_bytes") or {}).get("device") or 0), (rep.get("peak_device_bytes") or 0)
                row.update(roi=rep["roi"], batch=rep["batch"], windows=rep["windows"], seconds=r["median_s"],
                           predicted_device_gib=pred / bt.GIB, measured_device_gib=meas / bt.GIB,
                           pred_over_meas=round(pred / meas, 3) if meas else None, oom_retries=rep.get("oom_retries"))
            else:
                row["error"] = r.get("error") or r.get("skipped")
            self.res["extra"].append(row); print(json.dumps(row), flush=True); self.save()

    def w1x2(self):
        """Extra (2-GPU host): W1 on cuda:0, then split over cuda:0,1; medians and label identity."""
        import numpy as np
        runs = {}
        for devs in ("cuda:0", "cuda:0,1"):
            lab = f"{self.a.work}/w1x2_{devs.replace(':', '').replace(',', '_')}.npy"
            r = self.job([self.bin, f"{self.a.work}/w1.onnx", f"{self.a.work}/vol.npy", "128", "0.5", "4", "3", devs, lab], 120, f"w1x2 {devs}")
            runs[devs] = (r, np.load(lab) if "median_s" in r else None)
        (j1, l1), (j2, l2) = runs["cuda:0"], runs["cuda:0,1"]
        if l1 is None or l2 is None:
            row = dict(workload="w1x2", error=[j1.get("error") or j1.get("skipped"), j2.get("error") or j2.get("skipped")])
        else:
            row = dict(workload="w1x2", one_gpu_s=j1["median_s"], two_gpu_s=j2["median_s"], speedup=j1["median_s"] / j2["median_s"],
                       labels_identical=bool(np.array_equal(l1, l2)), label_agreement=float((l1 == l2).mean()),
                       windows=j2["report"]["windows"], windows_run=j2["report"].get("windows_run"))
        self.res["extra"].append(row); print(json.dumps(row), flush=True); self.save()

    def run(self):
        only = self.a.only
        nets = [n for n in ("w1", "w2", "w5", "w6") if n in only or (n == "w1" and set(only) & {"w3", "w4", "mem", "w1x2"})]
        if nets:
            transformers = sum(n in bt.TRANSFORMERS for n in nets)
            r = self.worker(["prep", self.a.work, ",".join(nets)], 300 + 300 * transformers, f"prep {','.join(nets)}")
            self.meta["export_errors"] = r.get("export_errors", {})
            if "error" in r or "skipped" in r:
                self.meta["prep_error"] = r.get("error") or r.get("skipped"); self.save()
                raise SystemExit(f"bench.py: preparing the nets and the volume failed: {self.meta['prep_error']}")
        steps = dict(w1=lambda: self.sliding("w1"), w2=lambda: self.sliding("w2"), w3=self.w3, w4=self.w4,
                     w5=lambda: self.transformer("w5"), w6=lambda: self.transformer("w6"), k1=self.k1,
                     mem=self.mem, w1x2=self.w1x2)
        for w in only:  # in the order given: cheap ones first leave less to a deadline
            steps[w]()
        self.save()
        print("\n" + bt.markdown(self.res), flush=True)


def cli(argv):
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure on this GPU machine")
    r.add_argument("--bundle", default=".dev/gpu", help="folder with bench, voxtile, it, wheels/, shared/ (tests/gpu/bench_bundle.sh)")
    r.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp/out"), "bench"), help="bench.json and bench.md go here")
    r.add_argument("--work", default="/tmp/voxtile-bench", help="volumes, ONNX, labels, caches (large: keep out of $OUT)")
    r.add_argument("--only", default=",".join(bt.WORKLOADS), help=f"workloads, of {','.join(bt.WORKLOADS + bt.EXTRAS)}")
    r.add_argument("--modes", default=",".join(bt.MODES), help="W1/W2 peer modes")
    r.add_argument("--w4-modes", default="eager,default", help="W4 peer modes (each pass ~15 s)")
    r.add_argument("--w5-modes", default=",".join(bt.W5_MODES), help="W5 (SwinUNETR) peer modes")
    r.add_argument("--w6-modes", default=",".join(bt.W6_MODES), help="W6 (UNETR) peer modes")
    r.add_argument("--reps", type=int, default=3, help="timed passes per peer mode (median; W4: one)")
    r.add_argument("--mode-timeout", type=float, default=900, help="seconds per compiled peer mode, compile included (W1 max-autotune: 6-8 min)")
    r.add_argument("--eager-timeout", type=float, default=180, help="seconds per eager peer mode")
    r.add_argument("--deadline", type=float, help="seconds for the whole run: a step is cut or skipped so the run ends by then")
    m = sub.add_parser("merge", help="join the results of several runs (say, two device calls) into one table")
    m.add_argument("out")
    m.add_argument("results", nargs="+")
    a = p.parse_args(argv)
    if a.cmd == "run":
        try:
            # 'compiled' was the old switch for W1's compile default: every mode is timed now.
            a.only = bt.parse_list(",".join(n for n in a.only.split(",") if n != "compiled"), bt.WORKLOADS + bt.EXTRAS, "workload")
            a.modes = bt.parse_list(a.modes, bt.MODES, "peer mode")
            a.w4_modes = bt.parse_list(a.w4_modes, bt.MODES, "W4 peer mode")
            a.w5_modes = bt.parse_list(a.w5_modes, bt.MODES, "W5 peer mode")
            a.w6_modes = bt.parse_list(a.w6_modes, bt.MODES, "W6 peer mode")
        except ValueError as e:
            p.error(str(e))
    return a


def main(argv):
    a = cli(argv)
    if a.cmd == "merge":
        results = []
        for path in a.results:
            with open(path) as f:
                results.append(json.load(f))
        os.makedirs(a.out, exist_ok=True)
        res = bt.merge(results)
        with open(f"{a.out}/bench.json", "w") as f:
            json.dump(res, f, indent=1)
        with open(f"{a.out}/bench.md", "w") as f:
            f.write(bt.markdown(res))
        print(bt.markdown(res))
        return
    Bench(a).run()


if __name__ == "__main__":
    main(sys.argv[1:])

"""Tests of tests/gpu/bench.py's pure-Python parts, runnable without a GPU or torch:
    /tmp/venv/bin/python -m unittest tests/gpu/test_bench_table.py   (numpy needed for the run test)
The run test drives bench.py's orchestration with a fake bundle (bench, voxtile, it, wheels)
and a fake peer worker: one mode fails, one hangs past its timeout, the others give times."""
import json, os, sys, tempfile, textwrap, time, unittest

sys.dont_write_bytecode = True  # no __pycache__ left in tests/gpu

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_table as bt  # noqa: E402
# The fake peer worker imports bench_table (for the labels' file names) from here.
os.environ["BENCH_DIR"] = os.path.dirname(os.path.abspath(__file__))


def entry(s, run="a", **kw):
    return dict(s=s, run=run, **kw)


class Ratio(unittest.TestCase):
    def test_faster_slower_same(self):
        r, words = bt.ratio_words(0.25, 0.5)
        self.assertEqual(r, 0.5)
        self.assertEqual(words, "0.500 (voxtile 2.00x faster)")
        self.assertEqual(bt.ratio_words(0.6, 0.4)[1], "1.500 (voxtile 1.50x slower)")
        self.assertEqual(bt.ratio_words(0.3001, 0.3)[1], "1.000 (same time within 0.5%)")

    def test_best_peer_skips_failures(self):
        peers = {"eager": entry(0.44), "default": dict(error="boom", run="a"), "reduce-overhead": entry(0.29),
                 "max-autotune-no-cudagraphs": dict(skipped="deadline", run="a")}
        self.assertEqual(bt.best_peer(peers)[0], "reduce-overhead")
        self.assertEqual(bt.best_peer({"default": dict(error="x")}), (None, None))

    def test_ratio_pairs_the_best_peer_with_voxtile_of_its_run(self):
        # Two device calls merged: the best peer comes from run b, so voxtile's time of run b is used.
        a = {"runs": [{"id": "a"}], "rows": {"w1": {"title": "W1", "peers": {"eager": entry(0.44, "a")},
                                                   "voxtile": {"a": entry(0.30, "a")}}}}
        b = {"runs": [{"id": "b"}], "rows": {"w1": {"title": "W1", "peers": {"max-autotune-no-cudagraphs": entry(0.29, "b")},
                                                   "voxtile": {"b": entry(0.27, "b")}}}}
        m = bt.merge([a, b])
        self.assertEqual(sorted(m["rows"]["w1"]["peers"]), ["eager", "max-autotune-no-cudagraphs"])
        sm = bt.summarize(m["rows"]["w1"])
        self.assertEqual((sm["best_mode"], sm["vox_s"]), ("max-autotune-no-cudagraphs", 0.27))
        self.assertAlmostEqual(sm["ratio"], 0.27 / 0.29)
        self.assertIn("voxtile 1.07x faster", sm["words"])

    def test_no_voxtile_time_in_the_best_peers_run(self):
        row = {"peers": {"eager": entry(0.4, "b")}, "voxtile": {"a": entry(0.3, "a")}}
        self.assertEqual(bt.summarize(row)["ratio"], None)
        self.assertIn("not timed in run b", bt.summarize(row)["words"])


class Sizes(unittest.TestCase):
    def test_monai_accumulator_w4(self):
        # 14 fp32 class planes + 1 fp32 count map over 1024x1024x512 voxels = 30 GiB.
        self.assertEqual(bt.monai_accumulator_bytes((1024, 1024, 512), 14), 30 * 2**30)

    def test_monai_windows(self):
        self.assertEqual(bt.monai_windows((512, 512, 128), (128,) * 3, 0.5), 49)
        self.assertEqual(bt.monai_windows((1024, 1024, 512), (128,) * 3, 0.5), 1575)
        self.assertEqual(bt.monai_windows((130, 128, 128), (128,) * 3, 0.5), 2)

    def test_parse_list(self):
        self.assertEqual(bt.parse_list("w2,w1,w2", bt.WORKLOADS, "workload"), ["w2", "w1"])
        with self.assertRaisesRegex(ValueError, "unknown workload w9"):
            bt.parse_list("w1,w9", bt.WORKLOADS, "workload")


class Tables(unittest.TestCase):
    def res(self):
        return {"runs": [{"id": "a", "gpu": "H200", "only": ["w1", "k1"], "modes": bt.MODES, "wall_s": 10}],
                "rows": {"w1": {"title": "W1 net", "notes": [], "peers": {
                    "eager": entry(0.446, peak_gib=7.97), "default": entry(0.294, compiled=True, first_s=61.0),
                    "max-autotune-no-cudagraphs": dict(error="timed out after 480 s", run="a")},
                    "voxtile": {"a": entry(0.278, peak_gib=2.44, notes=["49 windows"])}},
                    "k1": {"title": "K1 conv", "notes": [], "peers": {"cuDNN NDHWC": entry(1.319e-3)},
                           "voxtile": {"a": entry(0.93e-3)}}}, "extra": []}

    def test_tables_are_well_formed_and_say_who_is_faster(self):
        md = bt.markdown(self.res())
        tables = [ln for ln in md.splitlines() if ln.startswith("|")]
        self.assertTrue(tables)
        for block in (bt.summary_table(self.res()), bt.modes_table(self.res())):
            widths = {ln.count("|") for ln in block.splitlines()}
            self.assertEqual(len(widths), 1, block)
        modes = bt.modes_table(self.res())
        self.assertIn("FAILED: timed out after 480 s", modes)
        self.assertIn("0.294 s (first pass 61.0 s)", modes)
        self.assertIn("compile default 0.294 s", modes)
        self.assertIn("**0.946 (voxtile 1.06x faster)**", modes)
        self.assertNotIn("reduce-overhead", modes)  # a mode no row ran has no column
        summary = bt.summary_table(self.res())
        self.assertIn("cuDNN NDHWC 1.319 ms", summary)
        self.assertIn("voxtile 1.42x faster", summary)
        self.assertIn("7.97 / 2.44", bt.summary_table({"rows": {"w1": dict(self.res()["rows"]["w1"], peers={
            "eager": entry(0.446, peak_gib=7.97)})}}))


FAKE_PEER = """
import json, os, sys, time, numpy as np
sys.path.insert(0, os.environ["BENCH_DIR"])
import bench_table as bt
job = sys.argv[1]
if job == "prep":
    np.save(sys.argv[2] + "/vol.npy", np.zeros((4, 4, 4), np.float32))
    for n in sys.argv[3].split(","):
        open(f"{sys.argv[2]}/{n}.onnx", "w").write("fake")
    print(json.dumps(dict(gpu="Fake GPU", torch="0", monai="0")))
elif job == "k1":
    print(json.dumps(dict(ndhwc=1.3e-3, ncdhw=1.9e-3)))
elif sys.argv[3] in bt.TRANSFORMERS:  # every mode times and keeps its labels; the last compile is the best
    work, w, mode = sys.argv[2:5]
    lab = np.ones((4, 4, 4), np.uint8)
    lab[3, 3, 3] = 3 if mode == "eager" else 1  # eager's labels differ from the compiles' in one voxel
    np.save(bt.peer_labels(work, w, mode), lab)
    s = {"w5": {"eager": 2.0, "default": 1.5, "max-autotune-no-cudagraphs": 1.2},
         "w6": {"eager": 1.0, "default": 0.7}}[w][mode]
    print(json.dumps(dict(s=s, first_s=s + 100, compile_s=100.0, compiled=mode != "eager", peak_gib=9.0)))
else:
    work, w, mode = sys.argv[2:5]
    if mode == "reduce-overhead":
        raise RuntimeError("cudagraphs broke")
    if mode == "max-autotune-no-cudagraphs":
        time.sleep(60)
    if mode == "eager" and len(sys.argv) == 6:
        np.save(f"{work}/{w}_peer_labels.npy", np.ones((4, 4, 4), np.uint8))
    s = {"eager": 0.44, "eager-cl": 0.45, "default": 0.29}[mode]
    print("noise")
    print(json.dumps(dict(s=s * (10 if len(sys.argv) > 6 else 1), first_s=9.0, compiled=mode == "default", peak_gib=8.0)))
"""
FAKE_BENCH = """
import json, os, sys, numpy as np
a = sys.argv
if a[1].endswith("w5.onnx") and os.environ.get("FAKE_REFUSE"):
    sys.exit("Error: unsupported: the CUDA backend runs rank-5 activations only (node /swinViT/Reshape)")
if len(a) > 9 and a[9] == "4GiB" and os.environ.get("FAKE_W4_REFUSE"):
    sys.exit("Error: BudgetTooSmall { needed: 4693867520, budget: 4294967296, roi: [128, 128, 128], batch: 1 }")
if a[8] != "-":
    lab = np.ones((4, 4, 4), np.float32); lab[0, 0, 0] = 2; np.save(a[8], lab)
rep = dict(windows=49, roi=[64, 128, 128], batch=4, peak_device_bytes=2**31, predicted_peak_bytes=dict(device=2**31))
print(json.dumps(dict(median_s=0.28 if a[2].endswith(".npy") else 9.5, first_s=0.4, load_s=0.9, times=[0.28], report=rep)))
"""
FAKE_OPS = "print('RESULT bench conv 32->32 3^3 2x32x128^3: 0.930 ms')"
FAKE_VOXTILE = """
import json, os, sys, time
a = sys.argv
if a[1] == "plan":  # the load time: the export planned for the prep volume on the GPU, nothing run
    if os.environ.get("FAKE_PLAN_FAIL"):
        sys.exit("Error: no CUDA device found")
    if a[2:] != ["-m", a[3], "--volume", "512x512x128", "--device", "cuda", "--json"] or not os.path.exists(a[3]):
        sys.exit(f"fake voxtile: unexpected plan call {a}")
    time.sleep(0.2)
    print(json.dumps(dict(roi=[96, 96, 96], batch=1, windows=200)))
else:
    json.dump(dict(seconds=dict(total=1.0)), open(a[a.index("--report") + 1], "w"))
"""


def fake_bundle():
    """A temp folder and, in it, a bundle whose `bench`, `voxtile` and `peer.py` are the fakes above."""
    d = tempfile.mkdtemp()
    bundle = f"{d}/bundle"
    os.makedirs(f"{bundle}/wheels")
    for name, body in (("bench", FAKE_BENCH), ("voxtile", FAKE_VOXTILE), ("peer.py", FAKE_PEER)):
        path = f"{bundle}/{name}"
        with open(path, "w") as f:
            f.write(f"#!{sys.executable}\n" + textwrap.dedent(body))
        os.chmod(path, 0o755)
    return d, bundle


class Run(unittest.TestCase):
    """bench.py run end to end on fakes: every workload gets a row, failures are reported, the run
    is not lost, and the files land in --out."""

    def test_run_with_fakes(self):
        import bench
        d = tempfile.mkdtemp()
        bundle = f"{d}/bundle"
        os.makedirs(f"{bundle}/wheels"); os.makedirs(f"{bundle}/shared/fixtures/volumes")

        def script(path, body):
            with open(path, "w") as f:
                f.write(f"#!{sys.executable}\n" + textwrap.dedent(body))
            os.chmod(path, 0o755)
        script(f"{bundle}/bench", FAKE_BENCH)
        script(f"{bundle}/it", FAKE_OPS)
        script(f"{bundle}/voxtile", FAKE_VOXTILE)
        script(f"{bundle}/wheels/make_ct512.py", "import sys; open(sys.argv[2], 'w').write('ct'); print((512, 512, 128))")
        script(f"{bundle}/wheels/peer_e2e.py", "import time; time.sleep(0.2); print('import 1s total 2s')")
        script(f"{d}/peer.py", FAKE_PEER)
        a = bench.cli(["run", "--bundle", bundle, "--out", f"{d}/out", "--work", f"{d}/work", "--only", "w1,w3,w4,k1",
                       "--mode-timeout", "3", "--w4-modes", "eager"])
        b = bench.Bench(a)
        b.peer_script = f"{d}/peer.py"
        t = time.monotonic()
        b.run()
        self.assertLess(time.monotonic() - t, 40, "the hanging mode was not cut at its timeout")
        with open(f"{d}/out/bench.json") as f:
            res = json.load(f)
        w1 = res["rows"]["w1"]
        self.assertEqual(w1["peers"]["max-autotune-no-cudagraphs"]["error"], "timed out after 3 s")
        self.assertIn("cudagraphs broke", w1["peers"]["reduce-overhead"]["error"])
        self.assertEqual(bt.summarize(w1)["best_mode"], "default")
        vx = w1["voxtile"][b.id]
        self.assertAlmostEqual(vx["label_agreement"], 63 / 64)
        self.assertEqual(res["runs"][0]["gpu"], "Fake GPU")
        self.assertEqual(res["rows"]["w4"]["peers"]["eager"]["s"], 4.4)
        self.assertIn("30.0 GiB", res["rows"]["w4"]["notes"][0])
        self.assertEqual(res["rows"]["k1"]["voxtile"][b.id]["s"], 0.93e-3)
        self.assertGreater(res["rows"]["w3"]["peers"]["peer_e2e.py"]["s"], 0.2)
        with open(f"{d}/out/bench.md") as f:
            md = f.read()
        self.assertIn("voxtile 1.04x faster", md)  # 0.28 against compile default's 0.29
        self.assertIn("FAILED: timed out after 3 s", md)

    def run_w5(self, refuse=False, only="w5", env=()):
        """bench.py run --only ONLY on fakes, voxtile refusing SwinUNETR or not, with the fakes' switches
        in env set: the result file, the run's id and its markdown."""
        import bench
        d, bundle = fake_bundle()
        env = dict(env, **({"FAKE_REFUSE": "1"} if refuse else {}))
        os.environ.update(env)
        try:
            b = bench.Bench(bench.cli(["run", "--bundle", bundle, "--out", f"{d}/out", "--work", f"{d}/work", "--only", only]))
            b.peer_script = f"{bundle}/peer.py"
            b.run()
        finally:
            for k in env:
                os.environ.pop(k, None)
        with open(f"{d}/out/bench.json") as f:
            res = json.load(f)
        with open(f"{d}/out/bench.md") as f:
            return res, b.id, f.read()

    def test_w5_voxtile_refusing_the_net_keeps_the_peers(self):
        res, run, md = self.run_w5(refuse=True)
        w5 = res["rows"]["w5"]
        self.assertEqual(sorted(w5["peers"]), sorted(bt.W5_MODES))
        self.assertEqual(bt.summarize(w5)["best_mode"], "max-autotune-no-cudagraphs")
        self.assertIn("CUDA backend runs rank-5 activations only", w5["voxtile"][run]["error"])
        self.assertTrue(w5["notes"][0].startswith("voxtile: Error: unsupported"), w5["notes"])
        self.assertIn("voxtile not timed in run", md)
        self.assertIn("1.200 s (first pass 101.2 s, compile 100.0 s)", md)

    def test_w5_agreement_is_with_the_best_peer(self):
        res, run, md = self.run_w5(refuse=False)
        vx = res["rows"]["w5"]["voxtile"][run]
        self.assertEqual(vx["agreement_with"], "max-autotune-no-cudagraphs")
        self.assertAlmostEqual(vx["label_agreement"], 63 / 64)
        self.assertIn("0.233 (voxtile 4.29x faster)", md)  # the fake's 0.28 s against max-autotune's 1.2 s

    def test_w5_and_w6_in_one_call(self):
        res, run, md = self.run_w5(only="w5,w6")
        self.assertEqual(res["runs"][0]["w6_modes"], bt.W6_MODES)
        w5, w6 = res["rows"]["w5"], res["rows"]["w6"]
        self.assertEqual(sorted(w6["peers"]), sorted(bt.W6_MODES))
        self.assertIn("UNETR", w6["title"])
        vx = w6["voxtile"][run]
        self.assertEqual((vx["agreement_with"], vx["s"]), ("default", 0.28))
        self.assertAlmostEqual(vx["label_agreement"], 63 / 64)
        self.assertAlmostEqual(vx["label_agreement_eager"], 62 / 64)
        # The load time is the fake plan's wall (it sleeps 0.2 s); the engine's own load is kept apart.
        for row in (w5, w6):
            self.assertGreaterEqual(row["voxtile"][run]["load_s"], 0.2)
            self.assertEqual(row["voxtile"][run]["engine_load_s"], 0.9)
        self.assertIn("0.400 (voxtile 2.50x faster)", md)  # 0.28 s against W6's compile default 0.7 s
        summary = md.split("\n\n")[3]
        self.assertTrue(summary.startswith("| workload"), summary)
        self.assertIn("| load s |", summary)
        self.assertEqual({ln.count("|") for ln in summary.splitlines()}, {8})
        w6_line = [ln for ln in summary.splitlines() if ln.startswith("| W6")][0]
        self.assertRegex(w6_line.split(" | ")[5], r"^0\.[2-9]\d$")
        self.assertIn("Engine::from_file 0.90 s", w6_line)

    def test_w6_alone_and_a_failed_load_is_a_note(self):
        res, run, md = self.run_w5(only="w6", env={"FAKE_PLAN_FAIL": "1"})
        self.assertEqual(list(res["rows"]), ["w6"])
        w6 = res["rows"]["w6"]
        self.assertNotIn("load_s", w6["voxtile"][run])
        self.assertEqual(w6["voxtile"][run]["s"], 0.28)  # the bench itself still ran
        self.assertEqual(w6["notes"], ["voxtile plan (load): Error: no CUDA device found"])
        self.assertNotIn("load s", md)
        self.assertIn("workloads w6, peer modes eager,eager-cl,default,reduce-overhead,max-autotune-no-cudagraphs, W6 eager,default;", md)

    def test_w4_refused_at_its_budget_is_timed_at_a_fitting_one(self):
        import bench
        d, bundle = fake_bundle()
        os.environ["FAKE_W4_REFUSE"] = "1"
        try:
            b = bench.Bench(bench.cli(["run", "--bundle", bundle, "--out", f"{d}/out", "--work", f"{d}/work",
                                       "--only", "w4", "--w4-modes", "eager"]))
            b.peer_script = f"{bundle}/peer.py"
            b.run()
        finally:
            os.environ.pop("FAKE_W4_REFUSE", None)
        with open(f"{d}/out/bench.json") as f:
            vx = json.load(f)["rows"]["w4"]["voxtile"][b.id]
        self.assertIn("BudgetTooSmall", vx["error"])
        self.assertNotIn("s", vx)
        # 4693867520 bytes round up to 5 GiB; the fake then answers 9.5 s on 64x128x128 windows.
        self.assertTrue(vx["notes"][0].startswith("refused at 4GiB; at --memory-budget 5GiB: 9.50 s, voxtile roi 64x128x128"),
                        vx["notes"])

    def test_deadline_skips_instead_of_overrunning(self):
        import bench
        a = bench.cli(["run", "--bundle", "/nonexistent", "--out", tempfile.mkdtemp(), "--work", tempfile.mkdtemp(),
                       "--deadline", "5"])
        r = bench.Bench(a).job([sys.executable, "-c", "print(1)"], 100, "anything")
        self.assertIn("deadline", r["skipped"])

    def test_bad_workload_is_one_clear_error(self):
        import bench
        with self.assertRaises(SystemExit):
            bench.cli(["run", "--only", "w1,w9"])
        with self.assertRaises(SystemExit):
            bench.cli(["run", "--only", "w6", "--w6-modes", "eager,fast"])
        a = bench.cli(["run", "--only", "w6,w5", "--w6-modes", "default"])
        self.assertEqual((a.only, a.w6_modes, a.w5_modes), (["w6", "w5"], ["default"], bt.W5_MODES))

    def test_a_missing_binary_costs_its_step_only(self):
        import bench
        a = bench.cli(["run", "--bundle", "/nonexistent", "--out", tempfile.mkdtemp(), "--work", tempfile.mkdtemp()])
        r = bench.Bench(a).job(["/nonexistent/voxtile", "plan"], 10, "missing")
        self.assertEqual(r, {"error": "/nonexistent/voxtile: No such file or directory"})


if __name__ == "__main__":
    unittest.main()

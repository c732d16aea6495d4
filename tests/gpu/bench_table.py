"""The pure-Python half of tests/gpu/bench.py: the results' shape, best-peer selection, ratio wording,
merging the results of several device calls, MONAI's accumulator size, and the markdown tables that
BENCHMARKS.md takes as they are. No torch here, so tests/gpu/test_bench_table.py runs without a GPU.

A result file is {"runs": [run meta...], "rows": {workload: row}, "extra": [...]}. A row is
{"title", "peers": {mode: entry}, "voxtile": {run_id: entry}, ...}; an entry has "s" (steady-state
median seconds) and "run", or "error". Each ratio pairs the best peer with voxtile's time from the
same run (device call), so merging two calls never compares times from two machines.
"""
import json

GIB = 2**30

# Peer modes of the sliding-window workloads (W1, W2, W4), in table order, and their column names.
MODES = ["eager", "eager-cl", "default", "reduce-overhead", "max-autotune-no-cudagraphs"]
MODE_LABELS = {
    "eager": "eager fp16",
    "eager-cl": "eager fp16 channels_last_3d",
    "default": "compile default",
    "reduce-overhead": "compile reduce-overhead",
    "max-autotune-no-cudagraphs": "compile max-autotune-no-cudagraphs",
}
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune-no-cudagraphs"]
# Every workload the bench knows, in table order; mem and w1x2 are extras outside the main table.
WORKLOADS = ["w1", "w2", "w3", "w4", "w5", "w6", "k1"]
# The transformer workloads (SwinUNETR, UNETR): exports fixed at the window, load times measured.
TRANSFORMERS = ["w5", "w6"]
# W5's peer modes (eager, the two compiles that reach steady state fastest on the GPU).
W5_MODES = ["eager", "default", "max-autotune-no-cudagraphs"]
# W6's: eager and compile default, issue 32's pair.
W6_MODES = ["eager", "default"]
EXTRAS = ["mem", "w1x2"]


def peer_labels(work, w, mode):
    """Where a peer mode's labels (uint8 argmax of its logits) go: eager's are the W1/W2 reference."""
    return f"{work}/{w}_peer_labels.npy" if mode == "eager" else f"{work}/{w}_{mode}_peer_labels.npy"


def parse_list(text, allowed, what):
    """'w1,w2' -> ['w1', 'w2'] in the order given; an unknown name is one clear error."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ValueError(f"unknown {what} {', '.join(bad)}: choose from {', '.join(allowed)}")
    if not names:
        raise ValueError(f"no {what} given: choose from {', '.join(allowed)}")
    return list(dict.fromkeys(names))


def best_peer(peers):
    """(mode, entry) of the fastest peer that has a time, or (None, None) when none has one."""
    timed = [(e["s"], m) for m, e in peers.items() if isinstance(e.get("s"), (int, float))]
    if not timed:
        return None, None
    s, mode = min(timed)
    return mode, peers[mode]


def ratio_words(vox_s, peer_s):
    """voxtile time / peer time, with the words that say which side is faster and by how much."""
    r = vox_s / peer_s
    if round(r, 2) == 1.0 and round(1 / r, 2) == 1.0:
        return r, f"{r:.3f} (same time within 0.5%)"
    if r < 1:
        return r, f"{r:.3f} (voxtile {1 / r:.2f}x faster)"
    return r, f"{r:.3f} (voxtile {r:.2f}x slower)"


def summarize(row):
    """The best peer of a row and voxtile's time from that peer's run, with the ratio and its words."""
    mode, peer = best_peer(row.get("peers", {}))
    out = dict(best_mode=mode, best_s=None, vox_s=None, ratio=None, words="no peer time")
    if peer is None:
        return out
    out["best_s"] = peer["s"]
    vox = row.get("voxtile", {}).get(peer.get("run"), {})
    if not isinstance(vox.get("s"), (int, float)):
        out["words"] = f"voxtile not timed in run {peer.get('run')}" + (f": {vox['error']}" if "error" in vox else "")
        return out
    out["vox_s"] = vox["s"]
    out["ratio"], out["words"] = ratio_words(vox["s"], peer["s"])
    return out


def monai_accumulator_bytes(shape, classes, batch=1, dtype_bytes=4):
    """What MONAI's sliding_window_inference (1.6.1, unbuffered) allocates for the whole output: the
    output (batch, classes, D, H, W) and the count map (1, 1, D, H, W), both in the input's dtype
    (fp32 here: autocast does not change it)."""
    voxels = shape[0] * shape[1] * shape[2]
    return (batch * classes + 1) * voxels * dtype_bytes


def monai_windows(shape, roi, overlap):
    """Windows of MONAI's dense_patch_slices for a volume at least roi big: per axis the first start
    index d with d * interval + roi >= size, plus one (interval = int(roi * (1 - overlap)), or roi
    when roi equals the size)."""
    n = 1
    for size, r in zip(shape, roi):
        step = r if r == size else max(int(r * (1 - overlap)), 1)
        n *= next(d for d in range(size + 1) if d * step + r >= size) + 1
    return n


def merge(results):
    """One result from several device calls' results: peers are merged by mode (a later file wins a
    mode it also has), voxtile's times kept per run, extras appended."""
    out = {"runs": [], "rows": {}, "extra": []}
    for res in results:
        out["runs"] += res.get("runs", [])
        out["extra"] += res.get("extra", [])
        for w, row in res.get("rows", {}).items():
            into = out["rows"].setdefault(w, {"peers": {}, "voxtile": {}})
            for k, v in row.items():
                if k in ("peers", "voxtile"):
                    into[k].update(v)
                else:
                    into[k] = v
    return out


def _s(x):
    return f"{x:.3f} s" if x >= 0.1 else f"{x * 1e3:.3f} ms"


def _peer_cell(e):
    if e is None:
        return "not run"
    if "skipped" in e:
        return "skipped: " + str(e["skipped"])
    if "error" in e:
        return "FAILED: " + str(e["error"]).replace("|", "/").replace("\n", " ")[:120]
    cell = _s(e["s"])
    if e.get("first_s") is not None and e.get("compiled"):
        compile_s = f", compile {e['compile_s']:.1f} s" if e.get("compile_s") is not None else ""
        cell += f" (first pass {e['first_s']:.1f} s{compile_s})"
    return cell


def _gib(x):
    return "" if x is None else f"{x:.2f}"


def modes_table(res):
    """W1, W2, W4, W5, W6: one column per peer mode (steady-state median; the first pass holds the compile)."""
    rows = [w for w in ("w1", "w2", "w4", "w5", "w6") if w in res["rows"]]
    if not rows:
        return ""
    modes = [m for m in MODES if any(m in res["rows"][w]["peers"] for w in rows)]
    head = ["workload"] + [MODE_LABELS[m] for m in modes] + ["best peer", "voxtile", "voxtile / best peer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in rows:
        row = res["rows"][w]
        sm = summarize(row)
        cells = [row.get("title", w)] + [_peer_cell(row["peers"].get(m)) for m in modes]
        cells.append("none" if sm["best_mode"] is None else f"{MODE_LABELS.get(sm['best_mode'], sm['best_mode'])} {_s(sm['best_s'])}")
        cells.append("" if sm["vox_s"] is None else _s(sm["vox_s"]))
        cells.append(f"**{sm['words']}**" if sm["ratio"] is not None else sm["words"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _vox_of_best(row):
    """voxtile's entry from the best peer's run ({} when there is none)."""
    peer = row["peers"].get(summarize(row)["best_mode"]) or {}
    return row["voxtile"].get(peer.get("run"), {}) if peer else {}


def has_loads(res):
    """Whether some row's voxtile (of its best peer's run) has an export's load time: the transformers'."""
    return any("load_s" in _vox_of_best(row) for row in res["rows"].values())


def summary_table(res):
    """Every workload run: best peer, voxtile, the ratio in words, device peaks, the export's load time
    (a column only when some row has one) and what else to know."""
    loads = has_loads(res)
    head = ["workload", "best peer", "voxtile", "voxtile / best peer", "peak GiB peer / voxtile"] + \
        (["load s"] if loads else []) + ["notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in WORKLOADS:
        row = res["rows"].get(w)
        if row is None:
            continue
        sm = summarize(row)
        peer = row["peers"].get(sm["best_mode"]) or {}
        vox = _vox_of_best(row)
        label = MODE_LABELS.get(sm["best_mode"], sm["best_mode"])
        best = "none" if sm["best_mode"] is None else f"{label} {_s(sm['best_s'])}"
        peaks = ""
        if peer.get("peak_gib") is not None or vox.get("peak_gib") is not None:
            peaks = f"{_gib(peer.get('peak_gib'))} / {_gib(vox.get('peak_gib'))}"
        notes = "; ".join(row.get("notes", []) + vox.get("notes", []))
        load = [f"{vox['load_s']:.2f}" if vox.get("load_s") is not None else ""] if loads else []
        lines.append("| " + " | ".join([row.get("title", w), best, "" if sm["vox_s"] is None else _s(sm["vox_s"]),
                                          f"**{sm['words']}**" if sm["ratio"] is not None else sm["words"],
                                          peaks] + load + [notes.replace("|", "/")]) + " |")
    return "\n".join(lines)


def mem_table(res):
    """The memory-budget sweep (extra `mem`), in BENCHMARKS.md's memory table's columns."""
    rows = [r for r in res.get("extra", []) if r.get("workload") == "mem"]
    if not rows:
        return ""
    lines = ["| volume | budget | roi chosen | batch | windows | time | predicted peak | measured peak | predicted / measured |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r.get('volume', '')} | {r.get('budget', '')} | FAILED: {r['error']} | | | | | | |")
            continue
        roi = "x".join(map(str, r["roi"])) if isinstance(r["roi"], list) else r["roi"]
        lines.append(f"| {r['volume']} | {r['budget']} | {roi} | {r['batch']} | {r['windows']} | {r['seconds']:.3f} s | "
                     f"{r['predicted_device_gib']:.3f} GiB | {r['measured_device_gib']:.3f} GiB | {r['pred_over_meas']} |")
    return "\n".join(lines)


def markdown(res):
    """The whole report: run facts, then the tables, ready to paste into BENCHMARKS.md."""
    parts = ["# voxtile against its PyTorch + MONAI peers (tests/gpu/bench.py)", ""]
    for run in res["runs"]:
        modes = f"peer modes {','.join(run.get('modes', []))}" + "".join(
            f", {w.upper()} {','.join(run[f'{w}_modes'])}" for w in TRANSFORMERS
            if w in run.get("only", []) and run.get(f"{w}_modes"))
        parts.append(f"- run `{run.get('id')}`: {run.get('gpu')}, torch {run.get('torch')}, MONAI {run.get('monai')}; "
                     f"workloads {','.join(run.get('only', []))}, {modes}; {run.get('wall_s', 0):.0f} s wall")
    parts += ["", "Ratio = voxtile time / best peer time, voxtile's time taken from the best peer's own run "
              "(below 1: voxtile is faster). "
              "Peers: MONAI sliding_window_inference (roi 128³, W5 and W6 96³; sw_batch 4, overlap 0.5, gaussian) under "
              "torch.autocast fp16, the volume on the GPU, logits left there; median of the timed passes after "
              "warm-up (a compiled mode's first pass holds its compile). voxtile: the engine on the host volume, "
              "labels back on the host." + (" load s: the wall time of `voxtile plan --device cuda` on the export, a "
              "process of its own (file read, constants folded, the volume planned; nothing run)." if has_loads(res) else ""),
              "", summary_table(res), ""]
    for title, table in (("## Peer modes", modes_table(res)), ("## Memory budget (extra `mem`)", mem_table(res))):
        if table:
            parts += [title, "", table, ""]
    for r in res.get("extra", []):
        if r.get("workload") == "w1x2":
            parts += ["## W1 on two GPUs (extra `w1x2`)", "", "```", json.dumps(r), "```", ""]
    return "\n".join(parts)

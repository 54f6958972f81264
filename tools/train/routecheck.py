# SPDX-License-Identifier: MIT
"""Replays a trace's token ids through the C runner and compares its routing with the trace.

  /usr/bin/python3 tools/train/routecheck.py --model build-train/data/models/tiny-fine.mpk \\
      data/traces/tiny-fine/heldout-fortunes.csv [more traces]

traces.py records the routing from PyTorch running the exported weights (as for
tiny-real); this runs every request of each trace through libmoepager's runner
(ctypes: mp_runner_step per token from an empty cache, resident experts, the "ref"
engine) with a source whose route() and gate() callbacks log what the runner
computes: the top-k ids and gate weights, and the router's logits (their softmax is
the trace's p columns). Per trace: rows, rows whose experts differ (in order), how
many of those are near ties (top-k+1 probabilities < 1e-4 apart, the only allowed
difference, as tests/test_tiny_real.c), and the largest weight / probability difference.
"""
import argparse
import ctypes as C
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpk  # noqa: E402

NEAR_TIE = 1e-4
ROUTE = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_uint32, C.c_uint32, C.c_uint32,
                    C.POINTER(C.c_uint32), C.POINTER(C.c_float), C.c_uint32)
GATE = C.CFUNCTYPE(None, C.c_void_p, C.c_uint32, C.c_uint32, C.c_uint32,
                   C.POINTER(C.c_float), C.c_uint32, C.POINTER(C.c_float), C.c_uint32)


class SourceOps(C.Structure):
    _fields_ = [("expert", C.c_void_p), ("route", ROUTE), ("guard", C.c_void_p),
                ("gate", GATE), ("embed", C.c_void_p)]


class EngineConfig(C.Structure):
    _fields_ = [("threads", C.c_uint32), ("plugin_dir", C.c_char_p)]


class RunnerConfig(C.Structure):
    _fields_ = [("engine", C.c_void_p), ("source", C.POINTER(SourceOps)),
                ("source_ctx", C.c_void_p), ("max_seq", C.c_uint32),
                ("trace", C.c_void_p), ("request", C.c_uint32)]


def read_trace(path):
    """meta dict, tokens per request, rows [request, token, layer, e..., w..., p...] as arrays."""
    meta, toks = {}, {}
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                header = line.strip().split(",")
                break
            kv = line[1:].strip()
            if "=" in kv:
                k, v = kv.split("=", 1)
                if k.startswith("tokens."):
                    toks[int(k[7:])] = [int(x) for x in v.split()]
                else:
                    meta[k] = v
        data = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    k, E = int(meta["topk"]), int(meta["experts"])
    assert len(header) == 3 + 2 * k + E, header
    return meta, toks, data, k, E


def check(lib, model, path, threads):
    so = lib.so
    meta, toks, data, k, E = read_trace(path)
    L = int(meta["layers"])
    store, eng, res, run = C.c_void_p(), C.c_void_p(), C.c_void_p(), C.c_void_p()
    so.mp_store_open.argtypes = [C.c_char_p, C.POINTER(C.c_void_p)]
    so.mp_engine_open.argtypes = [C.c_char_p, C.POINTER(EngineConfig), C.POINTER(C.c_void_p)]
    so.mp_resident_open.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.POINTER(C.c_void_p)]
    so.mp_resident_source_ops.restype = C.POINTER(SourceOps)
    so.mp_runner_open.argtypes = [C.c_void_p, C.POINTER(RunnerConfig), C.POINTER(C.c_void_p)]
    so.mp_runner_step.argtypes = [C.c_void_p, C.c_uint32]
    for fn in ("mp_runner_reset", "mp_runner_close", "mp_resident_close", "mp_engine_close",
               "mp_store_close"):
        getattr(so, fn).argtypes = [C.c_void_p]
        getattr(so, fn).restype = None

    def ok(rc, what):
        if rc != 0:
            raise RuntimeError("%s: %d (%s)" % (what, rc, so.mp_last_error().decode()))

    ok(so.mp_store_open(model.encode(), C.byref(store)), "mp_store_open")
    ok(so.mp_engine_open(b"ref", C.byref(EngineConfig(threads, None)), C.byref(eng)), "engine")
    ok(so.mp_resident_open(store, None, None, C.byref(res)), "mp_resident_open")
    got = {}

    def on_route(ctx, request, token, layer, ids, weights, kk):
        got.setdefault((token, layer), {})["ids"] = [ids[i] for i in range(kk)]
        got[(token, layer)]["w"] = [weights[i] for i in range(kk)]
        return 0

    def on_gate(ctx, request, token, layer, logits, experts, x, hidden):
        z = np.ctypeslib.as_array(logits, shape=(experts,)).astype(np.float64)
        p = np.exp(z - z.max())
        got.setdefault((token, layer), {})["p"] = p / p.sum()

    rfn, gfn = ROUTE(on_route), GATE(on_gate)
    base = so.mp_resident_source_ops().contents
    ops = SourceOps(base.expert, rfn, base.guard, gfn, None)
    rc = RunnerConfig(eng, C.pointer(ops), res, 0, None, 0)
    ok(so.mp_runner_open(store, C.byref(rc), C.byref(run)), "mp_runner_open")
    rows = differ = ties = 0
    wdiff = pdiff = 0.0
    try:
        for r in sorted(toks):
            so.mp_runner_reset(run)
            got.clear()
            for t in toks[r]:
                ok(so.mp_runner_step(run, t), "mp_runner_step")
            sel = data[data[:, 0] == r]
            for row in sel:
                t, l = int(row[1]), int(row[2])
                e = [int(x) for x in row[3:3 + k]]
                w = row[3 + k:3 + 2 * k]
                p = row[3 + 2 * k:]
                g = got[(t, l)]
                rows += 1
                if g["ids"] != e:
                    differ += 1
                    s = np.sort(p)[::-1]
                    ties += bool((s[:k] - s[1:k + 1] < NEAR_TIE).any())
                else:
                    wdiff = max(wdiff, float(np.abs(np.asarray(g["w"]) - w).max()))
                pdiff = max(pdiff, float(np.abs(g["p"] - p).max()))
            assert len(sel) == len(toks[r]) * L
    finally:
        so.mp_runner_close(run)
        so.mp_resident_close(res)
        so.mp_engine_close(eng)
        so.mp_store_close(store)
    return {"trace": path, "requests": len(toks), "tokens": sum(len(v) for v in toks.values()),
            "rows": rows, "rows_differ": differ, "differ_near_ties": ties,
            "max_weight_diff_same_rows": wdiff, "max_prob_diff": pdiff,
            "same_function": differ == ties}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the .mpk the traces were recorded from")
    ap.add_argument("--lib", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("traces", nargs="+")
    args = ap.parse_args()
    lib = mpk.Lib(args.lib)
    out = [check(lib, args.model, t, args.threads) for t in args.traces]
    print(json.dumps(out, indent=1))
    sys.exit(0 if all(o["same_function"] for o in out) else 1)


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: MIT
"""Routing balance of the exported model on held-out text: is expert usage collapsed?

  /usr/bin/python3 tools/train/balance.py --ckpt RUN/final.pt --corpus CORPUS \\
      --model data/models/tiny-fine.mpk [--windows 48]
  /usr/bin/python3 tools/train/balance.py --trace data/traces/tiny-real/heldout-windows.csv

Routes the first N 256-token windows of the held-out stream through the model as
exported (export.engine_model: the .mpk's weights, so the C runner's routing) and
counts, per layer, the share of routed slots (token x top-k) each expert gets.
Per layer: the normalised entropy of those shares (1 = perfectly even, 0 = one
expert takes everything), the largest share and the smallest, as multiples of the
even share 1/E, and how many experts get under a tenth of the even share.
With --trace, the same from a recorded moe-trace's expert columns instead.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpk  # noqa: E402
from export import engine_model, load_model  # noqa: E402
from train import load_ids  # noqa: E402


@torch.no_grad()
def usage(model, stream, seq, windows, batch=8):
    """counts [L, E] of routed slots over the windows."""
    cfg = model.cfg
    n = min(windows, len(stream) // seq)
    counts = np.zeros((cfg.layers, cfg.experts), dtype=np.int64)
    for i in range(0, n, batch):
        w = np.stack([stream[j * seq:(j + 1) * seq] for j in range(i, min(n, i + batch))])
        rec = []
        model(torch.from_numpy(w), record=rec)
        for L, r in enumerate(rec[1:]):
            counts[L] += np.bincount(r["ids"].reshape(-1).numpy(), minlength=cfg.experts)
    return counts, n


def summary(counts):
    L, E = counts.shape
    layers = []
    for l in range(L):
        share = counts[l] / counts[l].sum()
        nz = share[share > 0]
        layers.append({
            "layer": l,
            "entropy": round(float(-(nz * np.log(nz)).sum() / math.log(E)), 4),
            "max_share_x_even": round(float(share.max() * E), 3),
            "min_share_x_even": round(float(share.min() * E), 3),
            "under_tenth_even": int((share < 0.1 / E).sum()),
        })
    ent = [x["entropy"] for x in layers]
    mx = [x["max_share_x_even"] for x in layers]
    return {"entropy_min": min(ent), "entropy_mean": round(float(np.mean(ent)), 4),
            "max_share_x_even_max": max(mx),
            "under_tenth_even_total": sum(x["under_tenth_even"] for x in layers),
            "layers": layers}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt")
    ap.add_argument("--corpus")
    ap.add_argument("--model", help="the exported .mpk (its .json gives dtype)")
    ap.add_argument("--windows", type=int, default=48)
    ap.add_argument("--trace", help="count a moe-trace's routing instead of running the model")
    args = ap.parse_args()

    if args.trace:
        from routecheck import read_trace
        meta, toks, data, k, E = read_trace(args.trace)
        L = int(meta["layers"])
        counts = np.zeros((L, E), dtype=np.int64)
        for l in range(L):
            counts[l] = np.bincount(data[data[:, 2] == l, 3:3 + k].astype(np.int64).ravel(),
                                    minlength=E)
        res = {"trace": args.trace, "geometry": [L, E, k], "requests": len(toks),
               "tokens": sum(len(v) for v in toks.values()), **summary(counts)}
        print(json.dumps(res, indent=1))
        return
    if not (args.ckpt and args.corpus and args.model):
        ap.error("--ckpt, --corpus and --model, or --trace")
    torch.set_num_threads(2)
    side = json.load(open(args.model[:-4] + ".json"))
    model, _ = load_model(args.ckpt)
    model = engine_model(model, mpk.Lib(), side["dtype"]).set_dispatch("blocks")
    stream = load_ids(os.path.join(args.corpus, "heldout.ids"))
    counts, n = usage(model, stream, model.cfg.max_seq, args.windows)
    cfg = model.cfg
    res = {"model": side["name"], "geometry": [cfg.layers, cfg.experts, cfg.topk],
           "windows": n, "tokens": n * cfg.max_seq, **summary(counts)}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

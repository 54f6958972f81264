# SPDX-License-Identifier: MIT
"""Held-out perplexity in PyTorch of the model exactly as exported, beside the C runner's.

  /usr/bin/python3 tools/train/evaluate.py --ckpt RUN/final.pt --corpus CORPUS \\
      --model data/models/tiny-real.mpk [--max-windows N] [--json]

The PyTorch model here uses the exported weights (rounded to the file's type by
libmoepager's own conversion, Wq/Wk rows permuted to rotate-half RoPE), so both
sides compute the same function; `moepager eval` is run on the same token
windows and the two perplexities are compared (the issue asks for 1 %).
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpk  # noqa: E402
from export import engine_model, load_model  # noqa: E402
from train import heldout_nll, load_ids  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def c_eval(moepager, model, ids_path, window, max_windows):
    cmd = [moepager, "eval", "--model", model, "--ids", ids_path, "--window", str(window),
           "--json"]
    if max_windows:
        cmd += ["--max-windows", str(max_windows)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--model", required=True, help="the exported .mpk")
    ap.add_argument("--dtype", default=None, help="type the .mpk stores (default: its .json)")
    ap.add_argument("--ids", default=None, help="token stream (default CORPUS/heldout.ids)")
    ap.add_argument("--window", type=int, default=None)
    ap.add_argument("--max-windows", type=int, default=0)
    ap.add_argument("--moepager", default=os.path.join(ROOT, "build-train", "tools", "moepager"))
    ap.add_argument("--no-c", action="store_true", help="PyTorch figures only")
    ap.add_argument("--dispatch", default="loop", choices=("loop", "bmm", "blocks"),
                    help="how PyTorch runs the experts (model.py; same function, bmm or blocks faster for many experts)")
    args = ap.parse_args()

    torch.set_num_threads(2)
    lib = mpk.Lib()
    model, _ = load_model(args.ckpt)
    model.set_dispatch(args.dispatch)
    dtype = args.dtype
    if dtype is None:
        side = args.model[:-4] + ".json"
        dtype = json.load(open(side))["dtype"] if os.path.exists(side) else "bf16"
    window = args.window or model.cfg.max_seq
    ids_path = args.ids or os.path.join(args.corpus, "heldout.ids")
    stream = load_ids(ids_path)
    with torch.no_grad():
        nll_train, n = heldout_nll(model, stream, window, args.max_windows or None)
        exported = engine_model(model, lib, dtype).set_dispatch(args.dispatch)
        nll_export, _ = heldout_nll(exported, stream, window, args.max_windows or None)
    res = {"ids": ids_path, "window": window, "predicted": n,
           "torch_trained_ppl": math.exp(nll_train),
           "torch_exported_ppl": math.exp(nll_export), "dtype": dtype}
    if not args.no_c:
        c = c_eval(args.moepager, args.model, ids_path, window, args.max_windows)
        res["c_runner_ppl"] = c["perplexity"]
        res["c_predicted"] = c["predicted"]
        res["c_seconds"] = c["seconds"]
        res["ratio_c_over_torch"] = c["perplexity"] / res["torch_exported_ppl"]
        res["within_1pct"] = abs(res["ratio_c_over_torch"] - 1) < 0.01
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

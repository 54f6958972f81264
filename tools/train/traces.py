# SPDX-License-Identifier: MIT
"""Records moe-trace v1 files (with the full gate distribution) from the trained model.

  /usr/bin/python3 tools/train/traces.py --ckpt RUN/final.pt --corpus CORPUS \\
      --model data/models/tiny-real.mpk --out data/traces/tiny-real

Two traces of held-out text, teacher-forced (the tokens are the real text, not
generated), routed by the exported model:
  heldout-fortunes.csv  one request per held-out fortune (BOS + its tokens), the first N
  heldout-windows.csv   one request per 256-token window of the held-out stream
                        (long requests for replay benchmarks)
Columns: request,token,layer,e0..e{k-1},w0..w{k-1},p0..p{E-1}. Metadata `tokens.R`
holds request R's token ids (space-separated), so a reader can match routing to text.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import BOS_ID, load_fortunes  # noqa: E402
from record import exported_model, record  # noqa: E402
from train import load_ids  # noqa: E402


def write_trace(path, name, model_name, requests, recs, k, E, L, note):
    with open(path, "w") as f:
        f.write("# moe-trace v1\n")
        f.write("# name=%s\n# model=%s\n" % (name, model_name))
        f.write("# layers=%d\n# experts=%d\n# topk=%d\n# requests=%d\n" % (L, E, k, len(requests)))
        f.write("# source=%s\n" % note)
        f.write("# p0..p%d: the router's softmax over all experts (gate_probs extension)\n" % (E - 1))
        for r, ids in enumerate(requests):
            f.write("# tokens.%d=%s\n" % (r, " ".join(str(int(i)) for i in ids)))
        f.write("request,token,layer," + ",".join("e%d" % i for i in range(k)) + "," +
                ",".join("w%d" % i for i in range(k)) + "," +
                ",".join("p%d" % i for i in range(E)) + "\n")
        for r, rec in enumerate(recs):
            T = rec["ids"].shape[0]
            for t in range(T):
                for l in range(L):
                    e = rec["ids"][t, l]
                    w = rec["weights"][t, l]
                    p = rec["probs"][t, l]
                    f.write("%d,%d,%d,%s,%s,%s\n" % (
                        r, t, l, ",".join(str(int(x)) for x in e),
                        ",".join("%.6f" % x for x in w), ",".join("%.6f" % x for x in p)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--model", required=True, help="the exported .mpk (its .json gives dtype)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--fortunes", type=int, default=64)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--dispatch", default="loop", choices=("loop", "bmm", "blocks"),
                    help="how PyTorch runs the experts (model.py; same function, bmm or blocks faster for many experts)")
    args = ap.parse_args()

    torch.set_num_threads(2)
    side = json.load(open(args.model[:-4] + ".json"))
    model = exported_model(args.ckpt, side["dtype"], args.dispatch)
    cfg = model.cfg
    os.makedirs(args.out, exist_ok=True)
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.corpus, "tok.model"))
    held = load_fortunes(os.path.join(args.corpus, "heldout.txt"))
    reqs = []
    for body in held:
        ids = [BOS_ID] + sp.encode(body)
        if len(ids) <= cfg.max_seq:
            reqs.append(ids)
        if len(reqs) == args.fortunes:
            break
    recs = [record(model, ids) for ids in reqs]
    name = side["name"]
    write_trace(os.path.join(args.out, "heldout-fortunes.csv"), name + "-heldout-fortunes", name,
                reqs, recs, cfg.topk, cfg.experts, cfg.layers,
                "held-out fortunes (BOS + text), teacher-forced")
    stream = load_ids(os.path.join(args.corpus, "heldout.ids"))
    W = cfg.max_seq
    wins = [stream[i * W:(i + 1) * W].tolist() for i in range(args.windows)]
    recs = [record(model, ids) for ids in wins]
    write_trace(os.path.join(args.out, "heldout-windows.csv"), name + "-heldout-windows", name,
                wins, recs, cfg.topk, cfg.experts, cfg.layers,
                "held-out token stream in %d-token windows, teacher-forced" % W)
    for fn in ("heldout-fortunes.csv", "heldout-windows.csv"):
        p = os.path.join(args.out, fn)
        print(json.dumps({"trace": p, "bytes": os.path.getsize(p)}))


if __name__ == "__main__":
    main()

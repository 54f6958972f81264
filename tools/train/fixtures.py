# SPDX-License-Identifier: MIT
"""Writes the fixtures tests/test_tiny_real.c checks the C side against (from Python).

  /usr/bin/python3 tools/train/fixtures.py --ckpt RUN/final.pt --corpus CORPUS \\
      --model data/models/tiny-real.mpk --out tests/data/tiny-real

tokenizer.tsv   one case per line: text as hex, a tab, the ids Python's sentencepiece
                gives (held-out fortunes never seen by the tokenizer trainer, plus edge
                cases: empty text, runs of spaces, newlines, tabs, non-ASCII, malformed UTF-8)
ppl-slice.json  a slice of the held-out token stream and PyTorch's perplexity of the
                exported model on it (the CI check of the 1 % match)
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import load_fortunes  # noqa: E402
from record import exported_model  # noqa: E402
from train import heldout_nll, load_ids  # noqa: E402

EDGE_CASES = [b"", b" ", b"   ", b"\n", b"a\n\nb", b"  two  spaces  ", b"\t\t-- Larry Wall",
              "caf\u00e9 na\u00efve \u65e5\u672c \U0001F600".encode(), b"bad \xff\xfe utf8 \xc3",
              b"trailing space ", b"x" * 300, b"%\n%", b"don't  panic!\n\n\t-- Douglas Adams"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--windows", type=int, default=4)
    args = ap.parse_args()

    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.corpus, "tok.model"))
    os.makedirs(args.out, exist_ok=True)
    held = load_fortunes(os.path.join(args.corpus, "heldout.txt"))
    texts = EDGE_CASES + [h.encode() for h in held[:args.cases]]
    with open(os.path.join(args.out, "tokenizer.tsv"), "w") as f:
        f.write("# text (hex)\tids from sentencepiece %s on %s\n"
                % (spm.__version__, os.path.basename(args.model)[:-4] + ".tok"))
        for t in texts:
            f.write("%s\t%s\n" % (t.hex(), " ".join(str(i) for i in sp.encode(t))))

    torch.set_num_threads(2)
    side = json.load(open(args.model[:-4] + ".json"))
    model = exported_model(args.ckpt, side["dtype"])
    stream = load_ids(os.path.join(args.corpus, "heldout.ids"))[:args.window * args.windows]
    nll, n = heldout_nll(model, stream, args.window)
    out = {"model": os.path.basename(args.model), "window": args.window,
           "windows": args.windows, "predicted": n, "torch_nll": nll,
           "torch_perplexity": math.exp(nll), "ids": [int(i) for i in stream]}
    with open(os.path.join(args.out, "ppl-slice.json"), "w") as f:
        json.dump(out, f)
    print(json.dumps({k: v for k, v in out.items() if k != "ids"}))


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: MIT
"""ESFT adapters: per layer, fine-tune only the experts most relevant to a domain.

  nice -n 10 /usr/bin/python3 tools/train/esft.py --base build/data/models/tiny-real.mpk \\
      --domain /work/data/domains/corpus/python --out /work/data/domains/adapters \\
      [--score token|gate] [--p 0.2] [--steps 40] [--lr 2e-3]

Expert-Specialized Fine-Tuning (Wang et al., 2024). The frozen base runs over
--score-windows windows of the domain's training text; each layer's experts are
scored by
  token: the token-selection ratio, the share of the layer's routed slots (k per
         token) that go to the expert;
  gate:  the average gate score, the mean over tokens of the weight the expert's
         output gets in the token's sum (the top-k weights renormalised over the k,
         what the runner applies; 0 when the expert is not chosen).
Both sum to 1 over a layer's experts. Per layer the experts are taken by score,
highest first, until their cumulative score reaches p. Only their gate/up/down
weights are trained on the domain's training text; routers, attention, norms,
embeddings and every other expert stay frozen (bit for bit: checked before export).

token is the default: it is the share of the domain's expert computations (and,
when serving, of its expert reads) that the selected experts take, so p says
directly how much of the domain's routed work the adapter covers. The two
scores pick mostly the same experts (both are printed and recorded): over the ten
domains at p = 0.2, the gate score picks 88 experts, the token ratio 94, 67 of
them the same.

Writes OUT/NAME.mpk (the merged model: the base with the selected experts
replaced) and OUT/NAME.json (domain, experts per layer, p, score method, both
scores, steps, lr, token counts, the training log).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpk  # noqa: E402
from export import export  # noqa: E402
from finetune import (THREADS_HELP, base_tokenizer, copy_tokenizer, finetune, load_mpk,  # noqa: E402
                      torch_ppl)
from train import load_ids  # noqa: E402


@torch.no_grad()
def expert_scores(model, ids, seq, windows, batch=8):
    """Per layer and expert: token-selection ratio and average gate score, [layers, experts] each."""
    cfg = model.cfg
    n = min(windows, len(ids) // seq)
    tok = np.zeros((cfg.layers, cfg.experts))
    gate = np.zeros((cfg.layers, cfg.experts))
    tokens = 0
    model.eval()
    for i in range(0, n, batch):
        w = np.stack([ids[j * seq:(j + 1) * seq] for j in range(i, min(n, i + batch))])
        rec = []
        model(torch.from_numpy(w), record=rec)
        layers = [r for r in rec if "ids" in r]
        for L, r in enumerate(layers):
            sel = r["ids"].reshape(-1).numpy()
            wts = r["weights"].reshape(-1).double().numpy()
            tok[L] += np.bincount(sel, minlength=cfg.experts)
            gate[L] += np.bincount(sel, weights=wts, minlength=cfg.experts)
        tokens += w.size
    return {"token": tok / (tokens * cfg.topk), "gate": gate / tokens, "tokens": tokens}


def select(scores, p):
    """Per layer, the fewest experts (highest score first) whose scores sum to at least p."""
    chosen = []
    for row in scores:
        order = np.argsort(-row, kind="stable")
        cum, ids = 0.0, []
        for e in order:
            ids.append(int(e))
            cum += row[e]
            if cum >= p:
                break
        chosen.append(sorted(ids))
    return chosen


def frozen_unchanged(model, base):
    """True when every weight but the selected experts' equals the base's exactly."""
    bs = base.state_dict()
    for k, v in model.state_dict().items():
        if k.endswith((".gate", ".up", ".down")):
            continue
        if not torch.equal(v, bs[k]):
            return False
    return True


def check_experts(model, base, experts):
    """The experts that changed are exactly the selected ones (or a subset: an expert whose
    gradient stayed zero would not move). Returns the ids that changed, per layer."""
    changed = []
    for L, (b, o) in enumerate(zip(model.blocks, base.blocks)):
        diff = [e for e in range(model.cfg.experts)
                if not all(torch.equal(getattr(b, n)[e], getattr(o, n)[e])
                           for n in ("gate", "up", "down"))]
        if not set(diff) <= set(experts[L]):
            raise AssertionError("layer %d: experts %s changed, %s selected" % (L, diff, experts[L]))
        changed.append(diff)
    return changed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--domain", required=True, help="a domain directory of domains.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default=None, help="default: BASE's name + '-esft-' + the domain's")
    ap.add_argument("--score", default="token", choices=("token", "gate"))
    ap.add_argument("--p", type=float, default=0.2)
    ap.add_argument("--score-windows", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-windows", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    ap.add_argument("--score-only", action="store_true", help="print the scores and selections")
    ap.add_argument("--lib", default=None)
    args = ap.parse_args()

    tok = None if args.score_only else base_tokenizer(args.base, "esft.py")
    torch.set_num_threads(args.threads)
    lib = mpk.Lib(args.lib)
    model, dtype, base_name = load_mpk(lib, args.base)
    dom = json.load(open(os.path.join(args.domain, "domain.json")))
    name = args.name or "%s-esft-%s" % (base_name, dom["name"])
    seq = model.cfg.max_seq
    train_ids = load_ids(os.path.join(args.domain, "train.ids"))
    held = load_ids(os.path.join(args.domain, "heldout.ids"))
    sc = expert_scores(model, train_ids, seq, args.score_windows)
    experts = select(sc[args.score], args.p)
    other = "gate" if args.score == "token" else "token"
    summary = {"domain": dom["name"], "score": args.score, "p": args.p,
               "experts": experts, "per_layer": [len(e) for e in experts],
               "with_" + other: [len(e) for e in select(sc[other], args.p)],
               "same_as_" + other: select(sc[other], args.p) == experts}
    print(json.dumps(summary), flush=True)
    if args.score_only:
        return
    base, _, _ = load_mpk(lib, args.base)
    before, _ = torch_ppl(model, held, seq, args.eval_windows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name + ".log.jsonl"), "w") as log:
        records = finetune(model, train_ids, args.steps, args.lr, args.seed, batch=args.batch,
                           seq=seq, warmup=args.warmup, experts=experts, log=log,
                           threads=args.threads)
    after, n = torch_ppl(model, held, seq, args.eval_windows)
    if not frozen_unchanged(model, base):
        raise AssertionError("a frozen weight changed")
    changed = check_experts(model, base, experts)
    path = os.path.join(args.out, name + ".mpk")
    export(model, lib, path, dtype, name)
    copy_tokenizer(tok, path)
    info = {"name": name, "kind": "ESFT adapter (merged model)", "base": os.path.basename(args.base),
            "domain": dom["name"], "score": args.score, "p": args.p,
            "score_windows": args.score_windows, "score_tokens": sc["tokens"],
            "experts": experts, "experts_per_layer": [len(e) for e in experts],
            "experts_total": sum(len(e) for e in experts), "experts_changed": changed,
            "scores": {"token": sc["token"].round(5).tolist(), "gate": sc["gate"].round(5).tolist()},
            "steps": args.steps, "lr": args.lr, "batch": args.batch, "seq": seq,
            "warmup": args.warmup, "seed": args.seed, "weight_decay": 0.0,
            "tokens_seen": args.steps * args.batch * seq,
            "train_tokens": dom["tokens_train"], "heldout_tokens": dom["tokens_heldout"],
            "torch_heldout_ppl": {"windows": args.eval_windows, "predicted": n,
                                  "base": before, "tuned": after},
            "log": records, "corpus": dom}
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps({"out": path, "experts_per_layer": info["experts_per_layer"],
                      "heldout_ppl_base": before, "heldout_ppl_tuned": after}))


if __name__ == "__main__":
    main()

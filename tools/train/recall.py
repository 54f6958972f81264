# SPDX-License-Identifier: MIT
"""Expert-prediction recall on the trained model, per prefetch distance d = 1..4 (JSON).

  /usr/bin/python3 tools/train/recall.py --ckpt RUN/final.pt --corpus CORPUS \\
      --model data/models/tiny-real.mpk

Every held-out token is one iteration (teacher-forced, 256-token windows of the
held-out stream, routed by the exported model). The first 70 % of windows fill
the FineMoE expert-map store, the last 30 % are scored (the paper's 7:3 split).
Recall = |predicted set & experts actually used| / k, averaged over scored tokens
and over the layers each method can predict at distance d (layers d..L-1; FineMoE
also predicts layers 0..d-1 semantically).

Methods:
  lookahead      layer l+d's router applied to layer l's residual stream at layer l's
                 gate time (after l's attention), normalised with l+d's ffn_norm; top-k
  lookahead_out  the same on the stream leaving layer l (after its MoE: one gate later)
  finemoe        FineMoE (seed 004): layers < d from the nearest stored map by cosine of
                 the semantic embedding (the embedding layer's output of the current token,
                 and, as a variant, the mean over the window so far); layer l >= d from
                 the stored map whose gate distributions of layers 0..l-d are nearest by
                 cosine; experts picked greedily by that map's P_l until their mass
                 reaches delta = clamp(1 - score, 0, 1) and at least k (sizes reported)
  finemoe_topk   the nearest map's top-k only (same size as the others)
  previous_token the experts the previous token used in layer l (temporal locality)
  popular        the k most used experts of layer l in the store split
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import rms_norm  # noqa: E402
from record import exported_model, record  # noqa: E402
from train import load_ids  # noqa: E402


def topk_sets(scores, k):
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


def recall_of(pred_sets, actual):
    """pred_sets: list/array of index arrays per token; actual [N, k]."""
    hits = 0
    for p, a in zip(pred_sets, actual):
        hits += len(np.intersect1d(p, a))
    return hits / actual.size


def cos_matrix(a, b):
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return a @ b.T


def greedy_select(p, delta, k):
    order = np.argsort(-p, kind="stable")
    s = np.cumsum(p[order])
    # Smallest prefix with mass >= delta (capped at all experts) and at least k experts.
    n = int(np.searchsorted(s, delta - 1e-6) + 1)
    return order[:min(len(p), max(k, n))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--windows", type=int, default=40, help="256-token held-out windows used")
    ap.add_argument("--capacity", type=int, default=1024, help="FineMoE store capacity C")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dispatch", default="loop", choices=("loop", "bmm", "blocks"),
                    help="how PyTorch runs the experts (model.py; same function, bmm or blocks faster for many experts)")
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.set_grad_enabled(False)
    side = json.load(open(args.model[:-4] + ".json"))
    model = exported_model(args.ckpt, side["dtype"], args.dispatch)
    cfg = model.cfg
    L, E, K = cfg.layers, cfg.experts, cfg.topk
    stream = load_ids(os.path.join(args.corpus, "heldout.ids"))
    W = cfg.max_seq
    nwin = min(args.windows, len(stream) // W)
    recs = [record(model, stream[i * W:(i + 1) * W]) for i in range(nwin)]
    n_store = int(round(nwin * 0.7))
    store, test = recs[:n_store], recs[n_store:]

    def cat(rs, key):
        return np.concatenate([r[key] for r in rs])

    def running_mean(r):
        e = r["embd"]
        return np.cumsum(e, 0) / np.arange(1, len(e) + 1)[:, None]

    probs_s, probs_t = cat(store, "probs"), cat(test, "probs")
    ids_t = cat(test, "ids")
    sem_s = {"token": cat(store, "embd"),
             "window_mean": np.concatenate([running_mean(r) for r in store])}
    sem_t = {"token": cat(test, "embd"),
             "window_mean": np.concatenate([running_mean(r) for r in test])}
    rng = np.random.default_rng(args.seed)
    if len(probs_s) > args.capacity:
        keep = np.sort(rng.choice(len(probs_s), args.capacity, replace=False))
    else:
        keep = np.arange(len(probs_s))
    maps = probs_s[keep]                      # [C, L, E]
    N = len(probs_t)

    # Router lookahead, computed with the exported weights.
    resid_t, out_t = cat(test, "resid"), cat(test, "out")

    def lookahead(stream_l, src, dst):
        blk = model.blocks[dst]
        h = rms_norm(torch.from_numpy(stream_l[:, src]), blk.ffn_norm, cfg.norm_eps)
        logits = torch.nn.functional.linear(h, blk.router).detach().numpy()
        return topk_sets(logits, K)

    # Baselines.
    counts = np.zeros((L, E))
    for l in range(L):
        counts[l] = np.bincount(cat(store, "ids")[:, l].ravel(), minlength=E)
    popular = topk_sets(counts, K)           # [L, K]

    out = {"model": side["name"], "layers": L, "experts": E, "topk": K,
           "store_tokens": int(len(probs_s)), "store_capacity": int(len(maps)),
           "test_tokens": int(N), "windows": nwin, "window": W, "distances": {}}
    test_starts = np.cumsum([0] + [len(r["ids"]) for r in test])[:-1]
    first_of_window = np.zeros(N, bool)
    first_of_window[test_starts] = True
    for d in range(1, 5):
        if d >= L:
            break
        res = {}
        layers = list(range(d, L))
        la = [recall_of(lookahead(resid_t, l - d, l), ids_t[:, l]) for l in layers]
        lo = [recall_of(lookahead(out_t, l - d, l), ids_t[:, l]) for l in layers]
        res["lookahead"] = float(np.mean(la))
        res["lookahead_per_layer"] = {str(l): round(float(v), 4) for l, v in zip(layers, la)}
        res["lookahead_out"] = float(np.mean(lo))
        prev = [recall_of(ids_t[:-1, l][~first_of_window[1:]], ids_t[1:, l][~first_of_window[1:]])
                for l in layers]
        res["previous_token"] = float(np.mean(prev))
        res["popular"] = float(np.mean([recall_of(np.repeat(popular[l][None], N, 0), ids_t[:, l])
                                        for l in layers]))
        # FineMoE: trajectory search for layers >= d, semantic search for layers < d.
        fm, fm_topk, fm_size = [], [], []
        for l in layers:
            pre = l - d + 1                   # layers 0..l-d observed
            sim = cos_matrix(probs_t[:, :pre].reshape(N, -1), maps[:, :pre].reshape(len(maps), -1))
            best = sim.argmax(1)
            score = sim[np.arange(N), best]
            sets = [greedy_select(maps[b, l], float(np.clip(1 - s, 0, 1)), K)
                    for b, s in zip(best, score)]
            fm.append(recall_of(sets, ids_t[:, l]))
            fm_size.append(float(np.mean([len(s) for s in sets])))
            fm_topk.append(recall_of(topk_sets(maps[best, l], K), ids_t[:, l]))
        res["finemoe"] = float(np.mean(fm))
        res["finemoe_mean_set_size"] = float(np.mean(fm_size))
        res["finemoe_topk"] = float(np.mean(fm_topk))
        sem = {}
        for name in ("token", "window_mean"):
            sim = cos_matrix(sem_t[name], sem_s[name][keep])
            best = sim.argmax(1)
            score = sim[np.arange(N), best]
            r_sets, r_top, sizes = [], [], []
            for l in range(d):
                sets = [greedy_select(maps[b, l], float(np.clip(1 - s, 0, 1)), K)
                        for b, s in zip(best, score)]
                r_sets.append(recall_of(sets, ids_t[:, l]))
                sizes.append(float(np.mean([len(s) for s in sets])))
                r_top.append(recall_of(topk_sets(maps[best, l], K), ids_t[:, l]))
            sem[name] = {"layers": list(range(d)), "recall": float(np.mean(r_sets)),
                         "mean_set_size": float(np.mean(sizes)), "recall_topk": float(np.mean(r_top))}
        res["finemoe_semantic"] = sem
        out["distances"][str(d)] = res
    out["random_topk_recall"] = K / E
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

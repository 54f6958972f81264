# SPDX-License-Identifier: MIT
"""Trains the MoE language model on the prepared corpus (CPU, Debian's python3-torch).

  nice -n 19 /usr/bin/python3 tools/train/train.py --corpus /work/data/train/corpus \\
      --out /work/data/train/run1 --steps 3000

Deterministic for a seed and thread count: the model init and the batch
sampler draw from generators seeded by --seed. Writes OUT/log.jsonl (one line
per logged step), OUT/ckpt.pt (latest, resumable with --resume) and OUT/final.pt.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import DISPATCH, Config, MoEModel  # noqa: E402


def load_ids(path):
    return np.fromfile(path, dtype=np.uint16).astype(np.int64)


def batches(stream, batch, seq, rng):
    """Random windows of seq + 1 tokens (input and shifted target)."""
    hi = len(stream) - seq - 1
    while True:
        starts = rng.integers(0, hi, size=batch)
        w = np.stack([stream[s:s + seq + 1] for s in starts])
        yield torch.from_numpy(w)


@torch.no_grad()
def heldout_nll(model, stream, seq, max_windows=None, batch=8):
    """Mean NLL per predicted token over non-overlapping windows of seq tokens.

    Each window starts from an empty context and predicts its tokens 1..seq-1:
    the C runner's eval does exactly the same (tools/cmd_eval.c).
    """
    model.eval()
    n = len(stream) // seq
    if max_windows:
        n = min(n, max_windows)
    total, count = 0.0, 0
    for i in range(0, n, batch):
        w = np.stack([stream[j * seq:(j + 1) * seq] for j in range(i, min(n, i + batch))])
        ids = torch.from_numpy(w)
        logits, _ = model(ids[:, :-1])
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                              ids[:, 1:].reshape(-1), reduction="sum")
        total += nll.item()
        count += ids[:, 1:].numel()
    model.train()
    return total / count, count


def lr_at(step, steps, warmup, decay_start, peak, floor):
    """Warmup, then constant, then a linear decay to floor from decay_start to steps.

    The learning rate before decay_start does not depend on decay_start or steps, so
    a run can be resumed from any checkpoint with the decay scheduled then and
    still equals a run that planned that schedule from the start.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    if step < decay_start:
        return peak
    t = (step - decay_start) / max(1, steps - decay_start)
    return peak + (floor - peak) * min(1.0, t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--decay-start", type=int, default=None,
                    help="step where the linear decay begins (default: steps - steps/5)")
    ap.add_argument("--aux", type=float, default=0.01, help="load-balancing loss weight")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--eval-windows", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--dispatch", default="loop", choices=DISPATCH,
                    help="how the experts run (model.py): loop (tiny-real), bmm or blocks (many small experts)")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    info = json.load(open(os.path.join(args.corpus, "corpus.json")))
    cfg = Config(vocab=info["vocab"], hidden=args.hidden, layers=args.layers, heads=args.heads,
                 kv_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                 experts=args.experts, topk=args.topk, ffn=args.ffn, max_seq=args.seq)
    model = MoEModel(cfg, args.dispatch)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    train = load_ids(os.path.join(args.corpus, "train.ids"))
    held = load_ids(os.path.join(args.corpus, "heldout.ids"))
    rng = np.random.default_rng(args.seed)
    step = 0
    decay_start = args.decay_start if args.decay_start is not None else args.steps - args.steps // 5
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    if args.resume and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        rng.bit_generator.state = ck["rng"]
        torch.set_rng_state(ck["torch_rng"])
        step = ck["step"]
    gen = batches(train, args.batch, args.seq, rng)
    meta = {"config": cfg.to_dict(), "args": vars(args), "params": model.param_count(),
            "active_params": model.active_param_count(), "corpus": info}
    meta_name = "meta.json" if step == 0 else "meta-resume-%d.json" % step
    with open(os.path.join(args.out, meta_name), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps({"params": meta["params"], "active": meta["active_params"]}), flush=True)
    log = open(os.path.join(args.out, "log.jsonl"), "a")
    t0 = time.time()
    tokens = 0
    model.train()
    while step < args.steps:
        lr = lr_at(step, args.steps, args.warmup, decay_start, args.lr, args.lr * 0.05)
        for g in opt.param_groups:
            g["lr"] = lr
        w = next(gen)
        logits, aux = model(w[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, cfg.vocab), w[:, 1:].reshape(-1))
        loss = ce + args.aux * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += w[:, 1:].numel()
        if step % args.log_every == 0 or step == args.steps:
            rec = {"step": step, "loss": round(ce.item(), 4), "aux": round(aux.item(), 4),
                   "lr": lr, "gnorm": round(gnorm.item(), 3),
                   "tok_s": round(tokens / (time.time() - t0), 1), "time": round(time.time() - t0)}
            if step % args.eval_every == 0 or step == args.steps:
                nll, _ = heldout_nll(model, held, args.seq, args.eval_windows)
                rec["heldout_ppl"] = round(math.exp(nll), 3)
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
        if step % args.ckpt_every == 0 or step == args.steps:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                        "step": step, "config": cfg.to_dict()}, ckpt_path + ".tmp")
            os.replace(ckpt_path + ".tmp", ckpt_path)
    torch.save({"model": model.state_dict(), "config": cfg.to_dict(), "step": step},
               os.path.join(args.out, "final.pt"))


if __name__ == "__main__":
    main()

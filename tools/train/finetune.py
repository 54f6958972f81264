# SPDX-License-Identifier: MIT
"""Fine-tunes an exported model (.mpk) on a domain corpus (domains.py); shared by esft.py.

  nice -n 10 /usr/bin/python3 tools/train/finetune.py --base build/data/models/tiny-real.mpk \\
      --domain /work/data/domains/corpus/python --out /work/data/domains/variants/python \\
      --steps 40 --lr 1.5e-4

Without --experts every weight is trained (a full fine-tune: Multi-MoE's variants);
esft.py calls finetune() with the experts it selected and everything else frozen.
The starting point is the .mpk itself (tiny-real's PyTorch checkpoint is not kept):
its weights are read through libmoepager's reader, widened to f32 and the rows of
Wq and Wk put back in the training RoPE order, so the model computes exactly what
the file does, and weights left untouched export back to the same bytes.

Writes OUT/NAME.mpk (export.py's writer, the base's dtype), OUT/NAME.json
(the run's settings, its training log and the corpus provenance) and OUT/log.jsonl.
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpk  # noqa: E402
from export import export, rope_perm  # noqa: E402
from model import Config, MoEModel  # noqa: E402
from train import batches, heldout_nll, load_ids, lr_at  # noqa: E402

# On the shared 2-core machine (load 8-17) two threads ran an ESFT step in 18.6 s, one
# thread in 1.6 s: OpenMP threads spin while they wait for a core.
THREADS_HELP = "torch threads (default 1: two ran 10x slower on the loaded 2-core machine)"
DTYPE_NAME = {v: k for k, v in mpk.MP_DTYPE.items()}


def load_mpk(lib, path):
    """The model an .mpk holds, as a trainable MoEModel (f32), and the file's dtype name."""
    with mpk.Reader(lib, path) as r:
        g = r.geom
        t = r.tensors()
        tied = np.array_equal(t["output"], t["tok_embd"])
        cfg = Config(vocab=g.vocab, hidden=g.hidden, layers=g.layers, heads=g.heads,
                     kv_heads=g.kv_heads, head_dim=g.head_dim, experts=g.experts, topk=g.topk,
                     ffn=g.ffn, max_seq=g.max_seq, rope_theta=g.rope_theta, norm_eps=g.norm_eps,
                     rope_style="interleaved", tie_embeddings=bool(tied))
        pq, pk = rope_perm(cfg.head_dim, cfg.heads), rope_perm(cfg.head_dim, cfg.kv_heads)
        sd = {"tok_embd": t["tok_embd"], "output_norm": t["output_norm"]}
        if not tied:
            sd["output"] = t["output"]
        for L in range(cfg.layers):
            p, b = "blocks.%d." % L, "blk.%d." % L
            q, k = np.empty_like(t[b + "attn_q"]), np.empty_like(t[b + "attn_k"])
            q[pq], k[pk] = t[b + "attn_q"], t[b + "attn_k"]	# export wrote row i = trained row perm[i]
            sd.update({p + "attn_q": q, p + "attn_k": k})
            for n in ("attn_norm", "attn_v", "attn_o", "ffn_norm", "router"):
                sd[p + n] = t[b + n]
            ex = [r.expert(L, e)[0] for e in range(cfg.experts)]
            for i, n in enumerate(("gate", "up", "down")):
                sd[p + n] = np.stack([x[i] for x in ex])
        dtype = DTYPE_NAME[g.dtype]
        name = r.name
    m = MoEModel(cfg)
    m.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()})
    return m, dtype, name


def base_tokenizer(base, tool):
    """BASE.tok, which the exported model gets beside it (moepager looks for it there).
    Exits when it is missing: called before training, so no run ends in a model that
    cannot read text."""
    tok = base[:-4] + ".tok"
    if not os.path.exists(tok):
        sys.exit("%s: %s has no tokenizer beside it (%s): the tuned model would have none"
                 % (tool, base, tok))
    return tok


def copy_tokenizer(tok, path):
    """The base's tokenizer (base_tokenizer()) beside an exported model."""
    shutil.copyfile(tok, path[:-4] + ".tok")


def expert_masks(cfg, experts):
    """{layer: [E, 1, 1] float mask} with 1 for the experts to train."""
    masks = {}
    for L, ids in enumerate(experts):
        m = torch.zeros(cfg.experts, 1, 1)
        m[list(ids)] = 1.0
        masks[L] = m
    return masks


def expert_params(model):
    """Every layer's expert tensors (gate, up, down), in a fixed order."""
    return [p for b in model.blocks for p in (b.gate, b.up, b.down)]


def expert_sq_dist(model, start):
    """sum over every expert tensor of ||W - W_start||^2 (start: expert_params' copies)."""
    return sum(((p - s) ** 2).sum() for p, s in zip(expert_params(model), start))


def finetune(model, train_ids, steps, lr, seed, batch=8, seq=256, warmup=10, experts=None,
             weight_decay=0.1, aux_weight=0.01, log=None, threads=1, expert_l2=0.0):
    """Trains in place. experts (a list per layer of expert ids) restricts training to those
    experts' gate/up/down rows: every other weight is frozen (no gradient, no weight decay,
    so it keeps its exact value). expert_l2 > 0 adds L2-SP on the experts to the loss,
    expert_l2 x sum ||W_e - W_e_start||^2 over every expert tensor, so variants of one
    start stay close at each (layer, expert) position (Multi-MoE shares them). Returns the
    log records."""
    torch.set_num_threads(threads)
    start = [p.detach().clone() for p in expert_params(model)] if expert_l2 else None
    torch.manual_seed(seed)
    cfg = model.cfg
    if experts is not None:
        masks = expert_masks(cfg, experts)
        for n, p in model.named_parameters():
            p.requires_grad_(False)
        params = []
        for L, b in enumerate(model.blocks):
            for p in (b.gate, b.up, b.down):
                p.requires_grad_(True)
                p.register_hook(lambda g, m=masks[L]: g * m)
                params.append(p)
        # Decoupled weight decay would shrink frozen rows too; the router is frozen, so the
        # balance loss has nothing to train.
        groups = [{"params": params, "weight_decay": 0.0}]
        aux_weight = 0.0
    else:
        groups = [{"params": [p for p in model.parameters() if p.dim() >= 2],
                   "weight_decay": weight_decay},
                  {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    gen = batches(train_ids, batch, seq, np.random.default_rng(seed))
    decay_start = steps - steps // 5
    records, t0 = [], time.time()
    model.train()
    for step in range(1, steps + 1):
        cur = lr_at(step - 1, steps, warmup, decay_start, lr, lr * 0.05)
        for g in opt.param_groups:
            g["lr"] = cur
        w = next(gen)
        logits, aux = model(w[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, cfg.vocab), w[:, 1:].reshape(-1))
        loss = ce + aux_weight * aux if aux_weight else ce
        if start is not None:
            loss = loss + expert_l2 * expert_sq_dist(model, start)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], 1.0)
        opt.step()
        if step % 10 == 0 or step == steps:
            rec = {"step": step, "loss": round(ce.item(), 4), "lr": cur,
                   "gnorm": round(gnorm.item(), 3), "time": round(time.time() - t0, 1)}
            if start is not None:
                with torch.no_grad():
                    rec["expert_sq_dist"] = round(expert_sq_dist(model, start).item(), 4)
            records.append(rec)
            print(json.dumps(rec), flush=True)
            if log:
                log.write(json.dumps(rec) + "\n")
                log.flush()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    return records


def torch_ppl(model, ids, seq, max_windows=None):
    nll, n = heldout_nll(model, ids, seq, max_windows)
    return math.exp(nll), n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the .mpk to start from")
    ap.add_argument("--domain", required=True, help="a domain directory of domains.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default=None, help="default: BASE's name + '-' + the domain's")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=1.5e-4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-windows", type=int, default=16,
                    help="held-out windows for the PyTorch check before and after")
    ap.add_argument("--expert-l2", type=float, default=0.0,
                    help="L2-SP strength on the experts: adds LAMBDA x sum ||W_e - W_e_base||^2 "
                         "(default 0: none)")
    ap.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    ap.add_argument("--lib", default=None)
    args = ap.parse_args()
    if not args.expert_l2 >= 0:
        ap.error("--expert-l2 %r: must be >= 0 (a negative strength pushes the experts "
                 "away from the base)" % args.expert_l2)

    tok = base_tokenizer(args.base, "finetune.py")
    torch.set_num_threads(args.threads)
    lib = mpk.Lib(args.lib)
    model, dtype, base_name = load_mpk(lib, args.base)
    dom = json.load(open(os.path.join(args.domain, "domain.json")))
    name = args.name or "%s-%s" % (base_name, dom["name"])
    train_ids = load_ids(os.path.join(args.domain, "train.ids"))
    held = load_ids(os.path.join(args.domain, "heldout.ids"))
    seq = model.cfg.max_seq
    before, _ = torch_ppl(model, held, seq, args.eval_windows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "log.jsonl"), "w") as log:
        records = finetune(model, train_ids, args.steps, args.lr, args.seed, batch=args.batch,
                           seq=seq, warmup=args.warmup, log=log, threads=args.threads,
                           expert_l2=args.expert_l2)
    after, n = torch_ppl(model, held, seq, args.eval_windows)
    path = os.path.join(args.out, name + ".mpk")
    export(model, lib, path, dtype, name)
    copy_tokenizer(tok, path)
    info = {"name": name, "kind": "full fine-tune", "base": os.path.basename(args.base),
            "domain": dom["name"], "steps": args.steps, "lr": args.lr, "batch": args.batch,
            "seq": seq, "warmup": args.warmup, "seed": args.seed, "weight_decay": 0.1,
            "expert_l2": args.expert_l2,
            "tokens_seen": args.steps * args.batch * seq,
            "torch_heldout_ppl": {"windows": args.eval_windows, "predicted": n,
                                  "base": before, "tuned": after},
            "log": records, "corpus": dom}
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps({"out": path, "heldout_ppl_base": before, "heldout_ppl_tuned": after}))


if __name__ == "__main__":
    main()

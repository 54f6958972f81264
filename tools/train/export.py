# SPDX-License-Identifier: MIT
"""Exports a trained checkpoint to .mpk through libmoepager's C writer (ctypes).

  /usr/bin/python3 tools/train/export.py --ckpt /work/data/train/run1/final.pt \\
      --corpus /work/data/train/corpus --out data/models/tiny-real.mpk --dtype bf16

Writes OUT (the model), OUT minus .mpk plus .tok (the tokenizer vocabulary that
engine/tokenizer.c reads) and .json (configuration and provenance).

The engine applies RoPE to halves of each head (x[i], x[i + D/2]); the model
was trained with adjacent pairs (x[2i], x[2i+1]). Attention scores are dot
products of q and k, so permuting the rows of Wq and Wk the same way within
each head turns one convention into the other exactly.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, MoEModel  # noqa: E402
import mpk  # noqa: E402

ENGINE_ROPE = "half"


def rope_perm(head_dim, heads):
    """Row order turning interleaved-pair heads into rotate-half heads."""
    one = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    return np.concatenate([h * head_dim + one for h in range(heads)])


def load_model(ckpt_path):
    ck = torch.load(ckpt_path)
    cfg = Config(**ck["config"])
    m = MoEModel(cfg)
    m.load_state_dict(ck["model"])
    return m, ck


def engine_tensors(model):
    """Every tensor as the .mpk holds it (f32 numpy, engine conventions)."""
    cfg = model.cfg
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {"tok_embd": sd["tok_embd"], "output_norm": sd["output_norm"],
           "output": sd["tok_embd"] if cfg.tie_embeddings else sd["output"]}
    if cfg.rope_style == ENGINE_ROPE:
        pq = np.arange(cfg.heads * cfg.head_dim)
        pk = np.arange(cfg.kv_heads * cfg.head_dim)
    else:
        pq = rope_perm(cfg.head_dim, cfg.heads)
        pk = rope_perm(cfg.head_dim, cfg.kv_heads)
    experts = []
    for L in range(cfg.layers):
        p = "blocks.%d." % L
        out["blk.%d.attn_norm" % L] = sd[p + "attn_norm"]
        out["blk.%d.attn_q" % L] = sd[p + "attn_q"][pq]
        out["blk.%d.attn_k" % L] = sd[p + "attn_k"][pk]
        out["blk.%d.attn_v" % L] = sd[p + "attn_v"]
        out["blk.%d.attn_o" % L] = sd[p + "attn_o"]
        out["blk.%d.ffn_norm" % L] = sd[p + "ffn_norm"]
        out["blk.%d.router" % L] = sd[p + "router"]
        experts.append([(sd[p + "gate"][e], sd[p + "up"][e], sd[p + "down"][e])
                        for e in range(cfg.experts)])
    return out, experts


def geometry(cfg, dtype):
    return mpk.Geometry(layers=cfg.layers, experts=cfg.experts, topk=cfg.topk, hidden=cfg.hidden,
                        ffn=cfg.ffn, heads=cfg.heads, kv_heads=cfg.kv_heads,
                        head_dim=cfg.head_dim, vocab=cfg.vocab, max_seq=cfg.max_seq,
                        dtype=mpk.MP_DTYPE[dtype], rope_theta=cfg.rope_theta,
                        norm_eps=cfg.norm_eps)


def engine_model(model, lib, dtype):
    """A PyTorch model computing what the exported file computes: rotate-half RoPE,
    weights rounded to the stored types by the library's own conversion."""
    cfg = Config(**{**model.cfg.to_dict(), "rope_style": ENGINE_ROPE, "tie_embeddings": False})
    m = MoEModel(cfg)
    tensors, experts = engine_tensors(model)
    f32_names = {"output_norm"} | {n for n in tensors if n.endswith(("_norm", ".router"))}

    def rounded(name, a):
        return a if name in f32_names else lib.round_trip(a, dtype)

    sd = {"tok_embd": rounded("tok_embd", tensors["tok_embd"]),
          "output": rounded("output", tensors["output"]),
          "output_norm": tensors["output_norm"]}
    for L in range(cfg.layers):
        p, b = "blocks.%d." % L, "blk.%d." % L
        for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_o", "ffn_norm", "router"):
            sd[p + n] = rounded(b + n, tensors[b + n])
        for i, n in enumerate(("gate", "up", "down")):
            sd[p + n] = np.stack([lib.round_trip(experts[L][e][i], dtype)
                                  for e in range(cfg.experts)])
    m.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()})
    m.eval()
    return m


def export(model, lib, path, dtype, name):
    cfg = model.cfg
    tensors, experts = engine_tensors(model)
    w = mpk.Writer(lib, path, geometry(cfg, dtype), name)
    try:
        for tname, tdtype, dims, nbytes in w.tensors():
            a = tensors.get(tname)
            if a is None:
                raise KeyError("the writer's layout has a tensor this model lacks: " + tname)
            if tuple(a.shape) != tuple(int(d) for d in dims):
                raise ValueError("%s: model shape %s, layout %s" % (tname, a.shape, dims))
            tdt = {v: k for k, v in mpk.MP_DTYPE.items()}[tdtype]
            buf = lib.convert(a, tdt)
            assert len(buf) == nbytes, (tname, len(buf), nbytes)
            w.put_tensor(tname, buf)
        for L in range(cfg.layers):
            for e in range(cfg.experts):
                g, u, d = experts[L][e]
                blob = np.concatenate([g.ravel(), u.ravel(), d.ravel()])
                w.put_expert(L, e, lib.convert(blob, dtype))
        w.finish()
    except BaseException:
        w.abort()
        raise


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True, help="path of the .mpk")
    ap.add_argument("--dtype", default="bf16", choices=sorted(mpk.MP_DTYPE))
    ap.add_argument("--name", default="tiny-real")
    ap.add_argument("--lib", default=None, help="libmoepager.so (default: build-train/)")
    ap.add_argument("--run", default=None, help="training run directory (meta.json, log.jsonl)")
    ap.add_argument("--shared-tokenizer", default=None, metavar="FILE.tok",
                    help="the committed .tok this model shares (recorded in the .json as "
                         "\"tokenizer\"; the build copies it to NAME.tok)")
    args = ap.parse_args()

    torch.set_num_threads(2)
    lib = mpk.Lib(args.lib)
    model, ck = load_model(args.ckpt)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    export(model, lib, args.out, args.dtype, args.name)
    base = args.out[:-4] if args.out.endswith(".mpk") else args.out
    shutil.copyfile(os.path.join(args.corpus, "tok.vocab.txt"), base + ".tok")
    info = {"name": args.name, "dtype": args.dtype, "config": model.cfg.to_dict(),
            "exported_rope": ENGINE_ROPE, "step": ck.get("step"),
            "params": model.param_count(), "active_params": model.active_param_count(),
            "corpus": json.load(open(os.path.join(args.corpus, "corpus.json")))}
    if args.run:
        # meta.json from the start, meta-resume-STEP.json from each resumption (the last
        # one carries the final schedule).
        phases = sorted((f for f in os.listdir(args.run) if f.startswith("meta")),
                        key=lambda f: int(f[12:-5]) if f.startswith("meta-resume-") else -1)
        info["train_phases"] = [{"file": f, "args": json.load(open(os.path.join(args.run, f)))["args"]}
                                for f in phases]
        log = os.path.join(args.run, "log.jsonl")
        if os.path.exists(log):
            last = [json.loads(l) for l in open(log) if "heldout_ppl" in l][-1]
            info["final_train_log"] = last
    if args.shared_tokenizer:
        with open(base + ".tok", "rb") as mine, open(args.shared_tokenizer, "rb") as shared:
            if mine.read() != shared.read():
                sys.exit("export.py: the corpus's tokenizer is not " + args.shared_tokenizer)
        info["tokenizer"] = os.path.basename(args.shared_tokenizer)
    with open(base + ".json", "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps({"out": args.out, "apparent_bytes": os.path.getsize(args.out),
                      "disk_bytes": os.stat(args.out).st_blocks * 512}))


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: MIT
"""Held-out perplexity of the base, the ESFT merged models and the variants, by the C runner.

  /usr/bin/python3 tools/train/domaineval.py --work /work/data/domains \\
      --base build/data/models/tiny-real.mpk --moepager build/tools/moepager \\
      --out tools/train/results/domains-eval.json

For every domain: the base and its adapter's merged model on the domain's held-out
text (all of it), the adapter on the next domain's held-out text (does it help
where it was not trained?), base and adapter on the first --fortunes-windows
windows of tiny-real's own held-out fortunes (forgetting). Every variant on its
domain and on the fortunes. One domain (--cross-check) is also scored in PyTorch
from the merged .mpk as read back (finetune.load_mpk) and compared with the C
runner. `moepager eval` runs each (256-token windows from an empty cache, as
train.py: heldout_nll). Results already in OUT are reused; prints Markdown tables.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import load_fortunes, write_fortunes  # noqa: E402
from domains import DOMAINS  # noqa: E402
from esft import select  # noqa: E402

ORDER = list(DOMAINS)
SLICE_BYTES = 4096


def other_domain(d):
    return ORDER[(ORDER.index(d) + 1) % len(ORDER)]


class Evaluator:
    def __init__(self, moepager, path):
        self.moepager = moepager
        self.path = path
        self.res = json.load(open(path)) if os.path.exists(path) else {}
        self.res.setdefault("runs", {})

    def ppl(self, model, ids, max_windows=0, text=None):
        """Perplexity of model on a token stream (ids) or on fortune-format text (text,
        encoded by the tokenizer given)."""
        key = "%s|%s|%d" % (os.path.basename(model), ids or text[0], max_windows)
        if key not in self.res["runs"]:
            cmd = ["nice", "-n", "10", self.moepager, "eval", "--model", model, "--json"]
            cmd += ["--ids", ids] if ids else ["--text", text[0], "--tokenizer", text[1]]
            if max_windows:
                cmd += ["--max-windows", str(max_windows)]
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            self.res["runs"][key] = {k: out[k] for k in ("perplexity", "predicted", "windows")}
            self.save()
            print(key, round(out["perplexity"], 3), file=sys.stderr, flush=True)
        return self.res["runs"][key]["perplexity"]

    def save(self):
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path + ".tmp", "w") as f:
            json.dump(self.res, f, indent=1, sort_keys=True)
        os.replace(self.path + ".tmp", self.path)


def pct(a, b):
    return "%+.1f %%" % (100.0 * (b / a - 1))


def adapters(ev, args, fortunes):
    rows = []
    for d in ORDER:
        meta_path = os.path.join(args.work, "adapters", "tiny-real-esft-%s.json" % d)
        if not os.path.exists(meta_path):
            continue
        meta = json.load(open(meta_path))
        merged = meta_path[:-5] + ".mpk"
        held = os.path.join(args.work, "corpus", d, "heldout.ids")
        o = other_domain(d)
        oheld = os.path.join(args.work, "corpus", o, "heldout.ids")
        by_gate = select(np.array(meta["scores"]["gate"]), meta["p"])
        r = {"domain": d, "experts": meta["experts"], "experts_per_layer": meta["experts_per_layer"],
             "experts_by_gate_score": by_gate,
             "layers_same_by_gate_score": sum(a == b for a, b in zip(by_gate, meta["experts"])),
             "experts_total": meta["experts_total"], "p": meta["p"], "score": meta["score"],
             "steps": meta["steps"], "lr": meta["lr"],
             "train_tokens": meta["train_tokens"], "heldout_tokens": meta["heldout_tokens"],
             "base": ev.ppl(args.base, held), "adapter": ev.ppl(merged, held),
             "other_domain": o, "other_base": ev.ppl(args.base, oheld),
             "other_adapter": ev.ppl(merged, oheld),
             "fortunes_base": ev.ppl(args.base, fortunes, args.fortunes_windows),
             "fortunes_adapter": ev.ppl(merged, fortunes, args.fortunes_windows)}
        rows.append(r)
    return rows


def variants(ev, args, fortunes):
    rows = []
    vdir = os.path.join(args.work, "variants")
    for d in ORDER:
        meta_path = os.path.join(vdir, "tiny-real-%s.json" % d)
        if not os.path.exists(meta_path):
            continue
        meta = json.load(open(meta_path))
        held = os.path.join(args.work, "corpus", d, "heldout.ids")
        model = meta_path[:-5] + ".mpk"
        rows.append({"domain": d, "steps": meta["steps"], "lr": meta["lr"],
                     "base": ev.ppl(args.base, held), "variant": ev.ppl(model, held),
                     "fortunes_base": ev.ppl(args.base, fortunes, args.fortunes_windows),
                     "fortunes_variant": ev.ppl(model, fortunes, args.fortunes_windows)})
    return rows


def cross_check(ev, args):
    import torch
    import mpk
    from finetune import load_mpk, torch_ppl
    from train import load_ids
    d = args.cross_check
    merged = os.path.join(args.work, "adapters", "tiny-real-esft-%s.mpk" % d)
    held = os.path.join(args.work, "corpus", d, "heldout.ids")
    key = "cross_check_" + d
    if key not in ev.res:
        torch.set_num_threads(1)
        model, _, _ = load_mpk(mpk.Lib(args.lib), merged)
        t, n = torch_ppl(model, load_ids(held), model.cfg.max_seq)
        c = ev.ppl(merged, held)
        ev.res[key] = {"model": os.path.basename(merged), "torch_ppl": t, "c_runner_ppl": c,
                       "predicted": n, "ratio_c_over_torch": c / t}
        ev.save()
    return ev.res[key]


def cut(texts, budget):
    """The first texts, the last one cut at a line end, within budget bytes (separators counted)."""
    out = []
    for t in texts:
        room = budget - sum(len(x.encode()) + 3 for x in out) - 1
        if room < 200:
            break
        b = t.encode()
        if len(b) > room:
            t = b[:room].decode("utf-8", errors="ignore")
            t = t[:t.rfind("\n")] if "\n" in t else t
        out.append(t)
    return out


def slices(ev, args, rows):
    """Held-out slices of the adapters with the fewest experts, for a CI test through the
    C runner, with the base's and the merged model's perplexity on them."""
    tok = args.base[:-4] + ".tok"
    picked = sorted(rows, key=lambda r: (r["experts_total"], ORDER.index(r["domain"])))[:args.slices]
    os.makedirs(args.slice_dir, exist_ok=True)
    info = {"bytes_max": SLICE_BYTES, "tokenizer": "tiny-real.tok", "slices": {}}
    for r in picked:
        d = r["domain"]
        path = os.path.join(args.slice_dir, d + ".txt")
        write_fortunes(path, cut(load_fortunes(os.path.join(args.work, "corpus", d, "heldout.txt")),
                                 SLICE_BYTES))
        merged = os.path.join(args.work, "adapters", "tiny-real-esft-%s.mpk" % d)
        info["slices"][d] = {"file": d + ".txt", "adapter": "tiny-real-esft-" + d,
                             "experts": r["experts"], "bytes": os.path.getsize(path),
                             "base_ppl": ev.ppl(args.base, None, text=(path, tok)),
                             "merged_ppl": ev.ppl(merged, None, text=(path, tok))}
    with open(os.path.join(args.slice_dir, "slices.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def print_tables(rows, vrows, cc, fw):
    print("| domain | train / held-out tokens | experts per layer (total of 96) | base ppl | "
          "adapter ppl | change | other domain: base -> adapter | fortunes (%d windows): "
          "base -> adapter |" % fw)
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %s / %s | %s (%d) | %.2f | %.2f | %s | %s: %.2f -> %.2f (%s) | %.2f -> %.2f (%s) |"
              % (r["domain"], format(r["train_tokens"], ","), format(r["heldout_tokens"], ","),
                 " ".join(map(str, r["experts_per_layer"])), r["experts_total"], r["base"],
                 r["adapter"], pct(r["base"], r["adapter"]), r["other_domain"], r["other_base"],
                 r["other_adapter"], pct(r["other_base"], r["other_adapter"]),
                 r["fortunes_base"], r["fortunes_adapter"],
                 pct(r["fortunes_base"], r["fortunes_adapter"])))
    if vrows:
        print()
        print("| variant (full fine-tune) | steps, lr | base ppl | variant ppl | change | "
              "fortunes: base -> variant |")
        print("|---|---|---|---|---|---|")
        for r in vrows:
            print("| %s | %d, %g | %.2f | %.2f | %s | %.2f -> %.2f (%s) |"
                  % (r["domain"], r["steps"], r["lr"], r["base"], r["variant"],
                     pct(r["base"], r["variant"]), r["fortunes_base"], r["fortunes_variant"],
                     pct(r["fortunes_base"], r["fortunes_variant"])))
    if cc:
        print()
        print("PyTorch vs C runner, %s (%d predicted tokens): %.6f vs %.6f (ratio %.9f)"
              % (cc["model"], cc["predicted"], cc["torch_ppl"], cc["c_runner_ppl"],
                 cc["ratio_c_over_torch"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--moepager", required=True)
    ap.add_argument("--out", required=True, help="results JSON (runs already there are reused)")
    ap.add_argument("--fortunes", default=None, help="default WORK/fortunes/heldout.ids")
    ap.add_argument("--fortunes-windows", type=int, default=96)
    ap.add_argument("--cross-check", default="python", help="domain scored in PyTorch too")
    ap.add_argument("--slices", type=int, default=0,
                    help="write held-out slices of this many adapters (the fewest experts)")
    ap.add_argument("--slice-dir", default=None)
    ap.add_argument("--lib", default=None)
    args = ap.parse_args()

    fortunes = args.fortunes or os.path.join(args.work, "fortunes", "heldout.ids")
    ev = Evaluator(args.moepager, args.out)
    rows = adapters(ev, args, fortunes)
    vrows = variants(ev, args, fortunes)
    cc = cross_check(ev, args) if args.cross_check else None
    ev.res["adapters"] = rows
    ev.res["variants"] = vrows
    ev.res["fortunes_windows"] = args.fortunes_windows
    ev.save()
    print_tables(rows, vrows, cc, args.fortunes_windows)
    if args.slices:
        print(json.dumps(slices(ev, args, rows), indent=1))
    assert all(not math.isnan(r["adapter"]) for r in rows)


if __name__ == "__main__":
    main()

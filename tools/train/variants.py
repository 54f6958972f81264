# SPDX-License-Identifier: MIT
"""L2 distances of expert weights between fine-tuned variants: Multi-MoE's Fig. 2 analogue.

  /usr/bin/python3 tools/train/variants.py build/data/models/tiny-real.mpk \\
      /work/data/domains/variants/tiny-real-{python,bible,policy}.mpk \\
      --out tools/train/results/variants-l2.json

An expert's weights are its gate, up and down matrices as the file stores them
(widened to f32), flattened into one vector; distances are Euclidean (Frobenius).
  same position:    ||W_a[l, e] - W_b[l, e]|| for every pair of models (a, b) and
                    every expert e of layer l (models = the base and the variants;
                    variant pairs are also reported apart);
  across positions: ||W_a[l, e] - W_a[l, f]|| for every model a and e != f.
Reports per layer and over all layers the median, p10, p90, min and max of each,
and the ratio of the medians (Multi-MoE: 3.6-4.9 same position against 150-250
across positions, Mixtral 8x7B base vs Instruct). The non-expert tensors'
relative changes are reported too (what a variant swaps in).
"""
import argparse
import itertools
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpk  # noqa: E402


def load(lib, path):
    with mpk.Reader(lib, path) as r:
        g = r.geom
        experts = np.stack([np.stack([np.concatenate([m.ravel() for m in r.expert(L, e)[0]])
                                      for e in range(g.experts)]) for L in range(g.layers)])
        return {"name": r.name, "path": path, "experts": experts, "tensors": r.tensors(),
                "geom": (g.layers, g.experts, g.hidden, g.ffn)}


def stats(values):
    v = np.asarray(values, dtype=np.float64)
    q = np.quantile(v, [0.1, 0.5, 0.9])
    return {"n": int(v.size), "p10": float(q[0]), "median": float(q[1]), "p90": float(q[2]),
            "min": float(v.min()), "max": float(v.max())}


def ratio(a, b):
    return a["median"] / b["median"] if b["median"] else None


def report(models):
    layers = models[0]["experts"].shape[0]
    E = models[0]["experts"].shape[1]
    pairs = list(itertools.combinations(range(len(models)), 2))
    vpairs = [(a, b) for a, b in pairs if a > 0]	# models[0] is the base
    out = {"models": [m["name"] for m in models], "layers": []}
    all_same, all_var, all_across = [], [], []
    for L in range(layers):
        same = [np.linalg.norm(models[a]["experts"][L, e] - models[b]["experts"][L, e])
                for a, b in pairs for e in range(E)]
        var = [np.linalg.norm(models[a]["experts"][L, e] - models[b]["experts"][L, e])
               for a, b in vpairs for e in range(E)]
        across = [np.linalg.norm(m["experts"][L, e] - m["experts"][L, f])
                  for m in models for e, f in itertools.combinations(range(E), 2)]
        norms = [np.linalg.norm(m["experts"][L, e]) for m in models for e in range(E)]
        row = {"layer": L, "same_position": stats(same), "across_positions": stats(across),
               "expert_norm": stats(norms)}
        if var:
            row["same_position_variants"] = stats(var)
        row["ratio_of_medians"] = ratio(row["across_positions"], row["same_position"])
        out["layers"].append(row)
        all_same += same
        all_var += var
        all_across += across
    out["all_layers"] = {"same_position": stats(all_same), "across_positions": stats(all_across)}
    if all_var:
        out["all_layers"]["same_position_variants"] = stats(all_var)
    out["all_layers"]["ratio_of_medians"] = ratio(out["all_layers"]["across_positions"],
                                                  out["all_layers"]["same_position"])
    # Non-expert weights: relative change of each variant from the base.
    base = models[0]["tensors"]
    out["non_expert_relative_change"] = {
        m["name"]: stats([np.linalg.norm(m["tensors"][k] - base[k]) / np.linalg.norm(base[k])
                          for k in base]) for m in models[1:]}
    return out


def print_table(rep):
    print("| layer | same position: median (p10-p90) | variant pairs only: median (p10-p90) | "
          "across positions: median (p10-p90) | across / same |")
    print("|---|---|---|---|---|")
    rows = rep["layers"] + [dict(rep["all_layers"], layer="all")]
    for r in rows:
        s, a = r["same_position"], r["across_positions"]
        v = r.get("same_position_variants")
        print("| %s | %.3f (%.3f-%.3f) | %s | %.2f (%.2f-%.2f) | %s |"
              % (r["layer"], s["median"], s["p10"], s["p90"],
                 "%.3f (%.3f-%.3f)" % (v["median"], v["p10"], v["p90"]) if v else "-",
                 a["median"], a["p10"], a["p90"],
                 "%.0f" % r["ratio_of_medians"] if r["ratio_of_medians"] else "-"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", help="the base model (.mpk)")
    ap.add_argument("variants", nargs="+", help="its fine-tuned variants (.mpk)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--lib", default=None)
    args = ap.parse_args()

    lib = mpk.Lib(args.lib)
    models = [load(lib, p) for p in [args.base] + args.variants]
    for m in models[1:]:
        if m["geom"] != models[0]["geom"]:
            sys.exit("%s: geometry %s differs from the base's %s" % (m["path"], m["geom"],
                                                                   models[0]["geom"]))
    rep = report(models)
    rep["models_paths"] = [os.path.basename(m["path"]) for m in models]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rep, f, indent=1)
    print_table(rep)


if __name__ == "__main__":
    main()

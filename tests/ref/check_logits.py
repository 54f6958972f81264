# SPDX-License-Identifier: MIT
"""Compares `moepager run --dump-logits` with the numpy reference (forward.py).

For tiny models in f32, f16, bf16, q8_0 and q4_0, several engines and trace-forced routing,
the logits of every generated token must match the float64 reference, which is
fed the same prompt and generated ids (teacher forcing, so a greedy choice can
never make the two diverge). The norm is the relative max-abs error per token:
max_i |c_i - r_i| / max_i |r_i| <= 1e-4 for f32, q8_0 and q4_0 (the reference
dequantises the blocks to exactly the engine's floats), <= 1e-2 for f16 and bf16.

    check_logits.py MOEPAGER_BINARY WORKDIR
"""
import json
import os
import random
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forward  # noqa: E402

TOLERANCE = {"f32": 1e-4, "f16": 1e-2, "bf16": 1e-2, "q8_0": 1e-4, "q4_0": 1e-4}
PROMPT, WARMUP, TOKENS = 12, 1, 5


class Checker:
    def __init__(self, moepager, workdir):
        self.moepager = moepager
        self.workdir = workdir
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, detail=""):
        print(f"{'ok' if ok else 'FAIL'}: {name}{': ' + detail if detail else ''}")
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def run(self, *args):
        return subprocess.run([self.moepager, *args], check=True, capture_output=True,
                              text=True).stdout

    def gen(self, dtype):
        path = os.path.join(self.workdir, f"tiny-{dtype}.mpk")
        self.run("gen", "--preset", "tiny", "--dtype", dtype, "--seed", "3", "--out", path,
                 "--quiet")
        return path

    def compare(self, name, model, dtype, engine, threads, trace=None, request=0):
        dump = os.path.join(self.workdir, "logits.bin")
        args = ["run", "--model", model, "--prompt-tokens", str(PROMPT), "--warmup",
                str(WARMUP), "--tokens", str(TOKENS), "--engine", engine, "--threads",
                str(threads), "--json", "--dump-logits", dump, "--membw-bytes", "8M"]
        if trace:
            args += ["--trace", trace, "--request", str(request)]
        try:
            res = json.loads(self.run(*args))
        except subprocess.CalledProcessError as e:
            self.check(name, False, f"moepager run failed: {e.stderr.strip()}")
            return
        m = forward.Model(model)
        gen = res["tokens"]
        got = np.fromfile(dump, dtype="<f4").reshape(-1, m.vocab)
        if len(gen) != 1 + WARMUP + TOKENS or got.shape[0] != len(gen):
            self.check(name, False, f"{len(gen)} tokens, {got.shape[0]} logit rows")
            return
        argmax_ok = all(int(np.argmax(got[i])) == gen[i] for i in range(len(gen)))
        tr = forward.read_trace(trace) if trace else None
        want = forward.forward(m, res["prompt"] + gen[:-1], PROMPT, tr, request)
        err = max(float(np.max(np.abs(got[i] - want[i])) / np.max(np.abs(want[i])))
                  for i in range(len(gen)))
        tol = TOLERANCE[dtype]
        forced = not trace or res["trace_overrides"] > 0
        self.check(name, argmax_ok and forced and err <= tol,
                   f"max relative error {err:.2e} (tolerance {tol:g})"
                   + ("" if argmax_ok else "; tokens are not the argmax of the dumped logits")
                   + ("" if forced else "; the trace overrode no routing decision"))


def write_trace(path, layers, experts, topk, requests, tokens, weights, seed):
    """A moe-trace v1 file of random routing for the tiny geometry."""
    rnd = random.Random(seed)
    with open(path, "w") as f:
        f.write(f"# moe-trace v1\n# name=check\n# layers={layers}\n# experts={experts}\n"
                f"# topk={topk}\n# requests={requests}\n")
        cols = ["request", "token", "layer"] + [f"e{i}" for i in range(topk)]
        if weights:
            cols += [f"w{i}" for i in range(topk)]
        f.write(",".join(cols) + "\n")
        for r in range(requests):
            for t in range(tokens):
                for l in range(layers):
                    ids = rnd.sample(range(experts), topk)
                    row = [r, t, l] + ids
                    if weights:
                        w = [rnd.random() + 0.1 for _ in ids]
                        row += [f"{x / sum(w):.6f}" for x in w]
                    f.write(",".join(str(x) for x in row) + "\n")


def main(argv):
    moepager, workdir = argv[1], argv[2]
    os.makedirs(workdir, exist_ok=True)
    c = Checker(moepager, workdir)
    engines = [("ref", 2), ("ref-scalar", 1), ("ref-avx2", 3)]
    if "openblas" in os.environ.get("MOEPAGER_TEST_PLUGINS", ""):
        engines.append(("openblas", 2))
    models = {dtype: c.gen(dtype) for dtype in ("f32", "f16", "bf16", "q8_0", "q4_0")}
    for dtype, model in models.items():
        for engine, threads in engines:
            c.compare(f"{dtype} logits match numpy ({engine}, {threads} threads)", model,
                      dtype, engine, threads)

    m = forward.Model(models["f32"])
    for weights in (True, False):
        trace = os.path.join(workdir, f"trace-{'w' if weights else 'ids'}.csv")
        write_trace(trace, m.layers, m.experts, m.topk, 2, WARMUP + TOKENS, weights, 11)
        kind = "experts and weights" if weights else "experts only"
        for dtype in ("f32", "bf16"):
            c.compare(f"{dtype} trace replay ({kind}, request 1) matches numpy",
                      models[dtype], dtype, "ref", 2, trace, 1)
    print(f"{c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

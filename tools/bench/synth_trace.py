#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes a synthetic moe-trace v1 to stdout, to check that policy rankings are not a
property of the shipped traces (docs/prefetch.md, "Measured here").

Routing: each request has a topic (changing with probability 0.1 per token); a layer's
logits are the topic's per-layer preferences, Gaussian noise, and a pull from the previous
layer's chosen experts (a random transition matrix). Deterministic for a seed.

usage: bench_synth_trace.py LAYERS EXPERTS TOPK REQUESTS TOKENS SEED PROBS(0|1) > trace.csv
"""
import sys

import numpy as np


def main():
    if len(sys.argv) != 8:
        sys.exit(__doc__)
    L, J, K, R, T, seed = (int(x) for x in sys.argv[1:7])
    probs = sys.argv[7] == '1'
    rng = np.random.default_rng(seed)
    topics = rng.normal(0, 2.0, (8, L, J))
    trans = rng.normal(0, 1.0, (L, J, J))
    out = sys.stdout
    out.write('# moe-trace v1\n# name=synthetic-%dx%d-top%d-seed%d\n' % (L, J, K, seed))
    out.write('# layers=%d\n# experts=%d\n# topk=%d\n# requests=%d\n' % (L, J, K, R))
    hdr = ['request', 'token', 'layer'] + ['e%d' % i for i in range(K)]
    hdr += ['w%d' % i for i in range(K)]
    if probs:
        hdr += ['p%d' % i for i in range(J)]
    out.write(','.join(hdr) + '\n')
    for r in range(R):
        topic = rng.integers(8)
        for t in range(T):
            if rng.random() < 0.1:
                topic = rng.integers(8)
            prev = None
            for layer in range(L):
                lg = topics[topic, layer] + rng.normal(0, 1.5, J)
                if prev is not None:
                    lg = lg + trans[layer][prev].mean(0)
                p = np.exp(lg - lg.max())
                p /= p.sum()
                ids = np.argsort(-p)[:K]
                w = p[ids] / p[ids].sum()
                row = [r, t, layer] + list(ids) + ['%.6f' % x for x in w]
                if probs:
                    row += ['%.6f' % x for x in p]
                out.write(','.join(map(str, row)) + '\n')
                prev = ids


if __name__ == '__main__':
    main()

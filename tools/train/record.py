# SPDX-License-Identifier: MIT
"""Routing and hidden states of the exported model over token sequences (PyTorch side).

The model is export.engine_model(): the weights exactly as the .mpk stores them, so
the routing here is the C runner's (tests/test_tiny_real.c checks it against a trace).
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpk  # noqa: E402
from export import engine_model, load_model  # noqa: E402


def exported_model(ckpt, dtype, dispatch="loop"):
    model, _ = load_model(ckpt)
    return engine_model(model, mpk.Lib(), dtype).set_dispatch(dispatch)


@torch.no_grad()
def record(model, ids):
    """ids: 1-D token sequence (one request, from an empty context).

    Returns a dict of numpy arrays, T = len(ids), L layers, E experts, k top-k, H hidden:
      probs [T, L, E]   router softmax over all experts
      ids   [T, L, k]   chosen experts in router order (descending weight)
      weights [T, L, k] their gate weights (renormalised over the k)
      embd  [T, H]      the embedding layer's output
      resid [T, L, H]   residual stream entering layer l's MoE (after its attention)
      out   [T, L, H]   residual stream leaving layer l
    """
    rec = []
    x = torch.as_tensor(np.asarray(ids, dtype=np.int64))[None, :]
    model(x, record=rec)
    L = model.cfg.layers
    layers = rec[1:]
    assert len(layers) == L
    resid = np.stack([r["resid"].numpy() for r in layers], 1)
    # The stream leaving layer l is the one entering layer l+1's attention; rebuild it
    # as resid + MoE output: resid[l] + (out[l] - resid[l]).
    outs = []
    for li, r in enumerate(layers):
        blk = model.blocks[li]
        y, _, _, _ = blk.moe(r["moe_in"])
        outs.append((r["resid"] + y).numpy())
    return {
        "probs": np.stack([r["probs"].numpy() for r in layers], 1),
        "ids": np.stack([r["ids"].numpy() for r in layers], 1),
        "weights": np.stack([r["weights"].numpy() for r in layers], 1),
        "embd": rec[0]["embd"].numpy(),
        "resid": resid,
        "out": np.stack(outs, 1),
    }

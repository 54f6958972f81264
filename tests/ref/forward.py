# SPDX-License-Identifier: MIT
"""Reference forward pass of a moepager .mpk model in numpy (float64).

Parses the file itself (docs/mpk-format.md) and computes, for a token sequence,
the logits the runner produces for every generated token: the Mixtral-style
decoder of engine/runner.c (RMSNorm, GQA attention with "rotate half" RoPE,
router top-k with softmax over the selected experts, SwiGLU experts, final
RMSNorm and LM head), optionally with decode routing forced from a moe-trace v1
file. Run it with Debian's /usr/bin/python3 (python3-numpy).

    forward.py MODEL --prompt 1,2,3 --tokens 4,5,6 [--trace F --request R] --out logits.bin
"""
import argparse
import struct
import sys

import numpy as np

MAGIC = b"MOEPAGER"
HEADER = struct.Struct("<8sIIQ10IIIffQIIQIIQQQ64s")
TENSOR = struct.Struct("<64sII4QQQQ")
EXPERT = struct.Struct("<IIQQQI28x")
F32, F16, BF16, Q8_0, Q4_0 = 0, 1, 2, 3, 4


def to_f64(raw, dtype):
    """Widens little-endian weights of a moepager dtype to float64, exactly."""
    if dtype == F32:
        return np.frombuffer(raw, dtype="<f4").astype(np.float64)
    if dtype == F16:
        return np.frombuffer(raw, dtype="<f2").astype(np.float64)
    if dtype == BF16:
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    if dtype in (Q8_0, Q4_0):
        # blocks of 32: an f16 scale d, then the quants; value = q * d rounded to f32
        blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 34 if dtype == Q8_0 else 18)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32)
        if dtype == Q8_0:
            q = blocks[:, 2:].view(np.int8).astype(np.float32)
        else:
            nib = blocks[:, 2:]
            q = np.concatenate([nib & 15, nib >> 4], axis=1).astype(np.float32) - 8
        return (q * d).astype(np.float64).reshape(-1)
    raise ValueError(f"unknown dtype {dtype}")


class Model:
    """The geometry, every non-expert tensor and lazily widened experts of one .mpk file."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        h = HEADER.unpack_from(self.data, 0)
        if h[0] != MAGIC or h[1] != 1:
            raise ValueError(f"{path}: not an .mpk version 1 file")
        (self.layers, self.experts, self.topk, self.hidden, self.ffn, self.heads,
         self.kv_heads, self.head_dim, self.vocab, self.max_seq) = h[4:14]
        self.dtype, _flags, self.rope_theta, self.norm_eps = h[14:18]
        tensor_off, n_tensors, _teb, expert_off, n_experts, _eeb = h[18:24]
        self.expert_bytes = h[25]
        self.tensors = {}
        for i in range(n_tensors):
            name, dtype, ndim, d0, d1, _d2, _d3, off, size, _ck = TENSOR.unpack_from(
                self.data, tensor_off + i * TENSOR.size)
            name = name.rstrip(b"\0").decode()
            shape = (d0, d1)[:ndim]
            self.tensors[name] = to_f64(self.data[off:off + size], dtype).reshape(shape)
        self.expert_at = {}
        for i in range(n_experts):
            layer, expert, off, size, _ck, _flags = EXPERT.unpack_from(
                self.data, expert_off + i * EXPERT.size)
            self.expert_at[(layer, expert)] = (off, size)
        self._experts = {}

    def expert(self, layer, expert):
        """(gate [ffn, hidden], up [ffn, hidden], down [hidden, ffn]) of one expert."""
        key = (layer, expert)
        if key not in self._experts:
            off, size = self.expert_at[key]
            w = to_f64(self.data[off:off + size], self.dtype)
            m = self.ffn * self.hidden
            self._experts[key] = (w[:m].reshape(self.ffn, self.hidden),
                                  w[m:2 * m].reshape(self.ffn, self.hidden),
                                  w[2 * m:].reshape(self.hidden, self.ffn))
        return self._experts[key]


def read_trace(path):
    """{(request, token, layer): (ids, weights or None)} of a moe-trace v1 file."""
    routes = {}
    k = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            cols = line.split(",")
            if cols[0] == "request":
                k = sum(1 for c in cols if c.startswith("e"))
                has_w = any(c.startswith("w") for c in cols)
                continue
            v = cols
            ids = [int(x) for x in v[3:3 + k]]
            w = [float(x) for x in v[3 + k:3 + 2 * k]] if has_w else None
            routes[(int(v[0]), int(v[1]), int(v[2]))] = (ids, w)
    return routes


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, heads, head_dim, positions, theta):
    """Rotates pairs (j, j + head_dim/2) of every head by pos * theta^(-2j/head_dim)."""
    half = head_dim // 2
    inv = theta ** (-2.0 * np.arange(half) / head_dim)
    ang = positions[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x = x.reshape(len(positions), heads, head_dim)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1).reshape(len(positions), -1)


def softmax(v):
    e = np.exp(v - np.max(v))
    return e / e.sum()


def forward(m, tokens, prompt_len, trace=None, request=0):
    """Logits [len(tokens) - prompt_len + 1, vocab] at positions prompt_len-1 .. end.

    Decode step t (position prompt_len + t) uses trace token t of `request` when a
    trace is given; prompt positions are routed by the router.
    """
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    hd, heads, kvh = m.head_dim, m.heads, m.kv_heads
    group = heads // kvh
    x = m.tensors["tok_embd"][tokens].copy()
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(m.layers):
        b = f"blk.{l}."
        xn = rmsnorm(x, m.tensors[b + "attn_norm"], m.norm_eps)
        q = rope(xn @ m.tensors[b + "attn_q"].T, heads, hd, pos, m.rope_theta)
        k = rope(xn @ m.tensors[b + "attn_k"].T, kvh, hd, pos, m.rope_theta)
        v = xn @ m.tensors[b + "attn_v"].T
        att = np.empty((T, heads * hd))
        for h in range(heads):
            g = h // group
            qh, kh, vh = (q[:, h * hd:(h + 1) * hd], k[:, g * hd:(g + 1) * hd],
                          v[:, g * hd:(g + 1) * hd])
            s = qh @ kh.T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, h * hd:(h + 1) * hd] = (s / s.sum(axis=1, keepdims=True)) @ vh
        x = x + att @ m.tensors[b + "attn_o"].T

        xn = rmsnorm(x, m.tensors[b + "ffn_norm"], m.norm_eps)
        logits = xn @ m.tensors[b + "router"].T
        moe = np.zeros_like(x)
        for t in range(T):
            ids = list(np.argsort(-logits[t], kind="stable")[:m.topk])
            w = softmax(logits[t][ids])
            if trace is not None and t >= prompt_len:
                ids, tw = trace[(request, t - prompt_len, l)]
                w = np.array(tw) if tw is not None else softmax(logits[t][ids])
            for e, we in zip(ids, w):
                gate, up, down = m.expert(l, int(e))
                gx = gate @ xn[t]
                h = gx / (1.0 + np.exp(-gx)) * (up @ xn[t])
                moe[t] += we * (down @ h)
        x = x + moe
    xn = rmsnorm(x[prompt_len - 1:], m.tensors["output_norm"], m.norm_eps)
    return xn @ m.tensors["output"].T


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompt", required=True, help="prompt ids, comma-separated")
    ap.add_argument("--tokens", required=True,
                    help="generated ids, comma-separated (the last one is not fed back)")
    ap.add_argument("--trace")
    ap.add_argument("--request", type=int, default=0)
    ap.add_argument("--out", required=True, help="raw f32 logits, one row per generated id")
    a = ap.parse_args(argv)
    prompt = [int(t) for t in a.prompt.split(",")]
    gen = [int(t) for t in a.tokens.split(",")]
    m = Model(a.model)
    trace = read_trace(a.trace) if a.trace else None
    out = forward(m, prompt + gen[:-1], len(prompt), trace, a.request)
    out.astype("<f4").tofile(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

# SPDX-License-Identifier: MIT
"""The Mixtral-style MoE decoder, in PyTorch, exactly as the C runner computes it.

Per layer: x += Wo attn(rope(Wq n1(x)), rope(Wk n1(x)), Wv n1(x)) with n1 = RMSNorm,
causal GQA; then h = n2(x), p = softmax(router h) over all experts, the top-k
experts by p with weights renormalised over the k, x += sum_k w_k down_k(silu(gate_k h) * up_k h).
Final RMSNorm, LM head. Weights are [out, in]: y = W x.

Three ways to run the experts, the same function (to float rounding): "loop" (one
Python iteration per expert over its tokens; the default, what tiny-real was trained
with), "bmm" (every expert's tokens padded to the busiest expert's count, three batched
matmuls) and "blocks" (every expert's tokens in blocks of 64 rows, padded to a whole
block, three batched matmuls with each block's expert matrices gathered). With many
small experts (26 layers x 64 x ffn 64) blocks is the fastest: bmm pads 2-3x (the
busiest expert has 2-3 times the mean count at init), the loop runs 1,664 tiny matmul
groups per pass.

RoPE rotates adjacent pairs (x[2i], x[2i+1]) of each head by pos * theta^(-2i/head_dim)
("interleaved"); rope_style="half" rotates (x[i], x[i + head_dim/2]) instead.
export.py permutes the rows of Wq and Wk when the engine uses the other style.
"""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 4096
    hidden: int = 128
    layers: int = 6
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    experts: int = 16
    topk: int = 2
    ffn: int = 256
    max_seq: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    rope_style: str = "interleaved"
    tie_embeddings: bool = True

    def to_dict(self):
        return asdict(self)


def rms_norm(x, w, eps):
    # Same order of operations as the C engine: x * (1 / sqrt(mean(x^2) + eps)) * w.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(cfg, seq, device=None):
    half = cfg.head_dim // 2
    inv = cfg.rope_theta ** (-torch.arange(0, half, dtype=torch.float64) * 2.0 / cfg.head_dim)
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin, style):
    # x: [B, H, T, D]; cos/sin: [T, D/2]
    if style == "interleaved":
        x0, x1 = x[..., 0::2], x[..., 1::2]
        r0 = x0 * cos - x1 * sin
        r1 = x0 * sin + x1 * cos
        return torch.stack((r0, r1), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)


DISPATCH = ("loop", "bmm", "blocks")
BLOCK = 64      # rows of a "blocks" dispatch block


class Layer(nn.Module):
    def __init__(self, cfg, dispatch="loop"):
        super().__init__()
        h, E = cfg.hidden, cfg.experts
        assert dispatch in DISPATCH, dispatch
        self.cfg = cfg
        self.dispatch = dispatch
        self.attn_norm = nn.Parameter(torch.ones(h))
        self.attn_q = nn.Parameter(torch.empty(cfg.heads * cfg.head_dim, h))
        self.attn_k = nn.Parameter(torch.empty(cfg.kv_heads * cfg.head_dim, h))
        self.attn_v = nn.Parameter(torch.empty(cfg.kv_heads * cfg.head_dim, h))
        self.attn_o = nn.Parameter(torch.empty(h, cfg.heads * cfg.head_dim))
        self.ffn_norm = nn.Parameter(torch.ones(h))
        self.router = nn.Parameter(torch.empty(E, h))
        self.gate = nn.Parameter(torch.empty(E, cfg.ffn, h))
        self.up = nn.Parameter(torch.empty(E, cfg.ffn, h))
        self.down = nn.Parameter(torch.empty(E, h, cfg.ffn))

    def attention(self, x, cos, sin):
        cfg = self.cfg
        B, T, _ = x.shape
        q = F.linear(x, self.attn_q).view(B, T, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = F.linear(x, self.attn_k).view(B, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = F.linear(x, self.attn_v).view(B, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin, cfg.rope_style)
        k = apply_rope(k, cos, sin, cfg.rope_style)
        rep = cfg.heads // cfg.kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(cfg.head_dim))
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, cfg.heads * cfg.head_dim)
        return F.linear(y, self.attn_o)

    def moe(self, h):
        """h: [N, hidden]. Returns (output, probs [N, E], top-k ids [N, k], top-k weights)."""
        cfg = self.cfg
        N = h.shape[0]
        probs = F.linear(h, self.router).softmax(-1)
        topw, topi = probs.topk(cfg.topk, dim=-1)
        topw = topw / topw.sum(-1, keepdim=True)
        if self.dispatch == "bmm":
            return self.experts_bmm(h, topi, topw), probs, topi, topw
        if self.dispatch == "blocks":
            return self.experts_blocks(h, topi, topw), probs, topi, topw
        flat = topi.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=cfg.experts).tolist()
        tok = order // cfg.topk
        wts = topw.reshape(-1)[order]
        out = torch.zeros_like(h)
        # unbind once: indexing the stacked parameter per expert would make autograd
        # build (and zero) a full-size gradient for every expert.
        gates, ups, downs = self.gate.unbind(0), self.up.unbind(0), self.down.unbind(0)
        start = 0
        # One loop over experts (not tokens): each expert gets its tokens as one matrix.
        for e, n in enumerate(counts):
            if n == 0:
                continue
            idx = tok[start:start + n]
            xe = h.index_select(0, idx)
            a = F.silu(F.linear(xe, gates[e])) * F.linear(xe, ups[e])
            ye = F.linear(a, downs[e]) * wts[start:start + n, None]
            out.index_add_(0, idx, ye)
            start += n
        return out, probs, topi, topw

    def experts_bmm(self, h, topi, topw):
        """The experts as three batched matmuls: expert e's tokens are rows
        e*C .. e*C+count_e-1 of an [E*C, hidden] matrix (C = the largest count, the
        rest zeros), in the loop's order (sorted by expert, stable)."""
        cfg = self.cfg
        E, k = cfg.experts, cfg.topk
        flat = topi.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        C = int(counts.max())
        se = flat[order]
        starts = torch.cumsum(counts, 0) - counts
        slot = se * C + (torch.arange(flat.numel()) - starts[se])
        tok = order // k
        wts = topw.reshape(-1)[order]
        xe = h.new_zeros(E * C, h.shape[1]).index_copy(0, slot, h.index_select(0, tok))
        xe = xe.view(E, C, h.shape[1])
        a = F.silu(torch.bmm(xe, self.gate.transpose(1, 2))) * torch.bmm(xe, self.up.transpose(1, 2))
        y = torch.bmm(a, self.down.transpose(1, 2)).reshape(E * C, -1).index_select(0, slot)
        return torch.zeros_like(h).index_add_(0, tok, y * wts[:, None])

    def experts_blocks(self, h, topi, topw, R=BLOCK):
        """The experts as batched matmuls over blocks of R rows: expert e's tokens fill
        ceil(count_e / R) blocks (the last one padded with zeros), each block is
        multiplied by its expert's matrices (gathered per block). Padding is under R
        rows per expert, whatever the imbalance (bmm pads every expert to the busiest)."""
        cfg = self.cfg
        E, k = cfg.experts, cfg.topk
        flat = topi.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        nblk = (counts + R - 1) // R
        pstart = (torch.cumsum(nblk, 0) - nblk) * R
        se = flat[order]
        starts = torch.cumsum(counts, 0) - counts
        slot = pstart[se] + (torch.arange(flat.numel()) - starts[se])
        tok = order // k
        wts = topw.reshape(-1)[order]
        nb = int(nblk.sum())
        bexp = torch.repeat_interleave(torch.arange(E), nblk)
        xe = h.new_zeros(nb * R, h.shape[1]).index_copy(0, slot, h.index_select(0, tok))
        xe = xe.view(nb, R, h.shape[1])
        g = self.gate.index_select(0, bexp).transpose(1, 2)
        u = self.up.index_select(0, bexp).transpose(1, 2)
        d = self.down.index_select(0, bexp).transpose(1, 2)
        a = F.silu(torch.bmm(xe, g)) * torch.bmm(xe, u)
        y = torch.bmm(a, d).reshape(nb * R, -1).index_select(0, slot)
        return torch.zeros_like(h).index_add_(0, tok, y * wts[:, None])

    def forward(self, x, cos, sin, record=None):
        cfg = self.cfg
        x = x + self.attention(rms_norm(x, self.attn_norm, cfg.norm_eps), cos, sin)
        B, T, H = x.shape
        h = rms_norm(x, self.ffn_norm, cfg.norm_eps).reshape(B * T, H)
        if record is not None:
            record.append({"moe_in": h.detach(), "resid": x.detach().reshape(B * T, H)})
        y, probs, topi, topw = self.moe(h)
        if record is not None:
            record[-1].update(probs=probs.detach(), ids=topi.detach(), weights=topw.detach())
        return x + y.view(B, T, H), probs, topi


class MoEModel(nn.Module):
    def __init__(self, cfg, dispatch="loop"):
        super().__init__()
        self.cfg = cfg
        self.tok_embd = nn.Parameter(torch.empty(cfg.vocab, cfg.hidden))
        self.blocks = nn.ModuleList(Layer(cfg, dispatch) for _ in range(cfg.layers))
        self.output_norm = nn.Parameter(torch.ones(cfg.hidden))
        if not cfg.tie_embeddings:
            self.output = nn.Parameter(torch.empty(cfg.vocab, cfg.hidden))
        self.reset_parameters()

    def reset_parameters(self):
        cfg = self.cfg
        std = 0.02
        out_std = std / math.sqrt(2 * cfg.layers)
        nn.init.normal_(self.tok_embd, std=std)
        if not cfg.tie_embeddings:
            nn.init.normal_(self.output, std=std)
        for b in self.blocks:
            for p in (b.attn_q, b.attn_k, b.attn_v, b.gate, b.up, b.router):
                nn.init.normal_(p, std=std)
            for p in (b.attn_o, b.down):
                nn.init.normal_(p, std=out_std)

    def set_dispatch(self, dispatch):
        assert dispatch in DISPATCH, dispatch
        for b in self.blocks:
            b.dispatch = dispatch
        return self

    def lm_head(self):
        return self.tok_embd if self.cfg.tie_embeddings else self.output

    def forward(self, ids, record=None):
        """ids [B, T] -> logits [B, T, vocab], aux load-balancing loss, z-loss."""
        cfg = self.cfg
        B, T = ids.shape
        cos, sin = rope_tables(cfg, T)
        x = self.tok_embd[ids]
        if record is not None:
            record.append({"embd": x.detach().reshape(B * T, -1)})
        aux = x.new_zeros(())
        for b in self.blocks:
            x, probs, topi = b(x, cos, sin, record)
            # Switch/Mixtral balance loss: E * sum_e (share of routed slots) * (mean prob).
            frac = torch.bincount(topi.reshape(-1), minlength=cfg.experts).float() / topi.numel()
            aux = aux + cfg.experts * (frac * probs.mean(0)).sum()
        x = rms_norm(x, self.output_norm, cfg.norm_eps)
        logits = F.linear(x, self.lm_head())
        return logits, aux / cfg.layers

    def param_count(self):
        return sum(p.numel() for p in self.parameters())

    def active_param_count(self):
        cfg = self.cfg
        per_expert = 3 * cfg.hidden * cfg.ffn
        total = self.param_count()
        return total - cfg.layers * (cfg.experts - cfg.topk) * per_expert

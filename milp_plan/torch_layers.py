"""A milp_plan Model's layer kinds in plain torch.nn, at tensor-parallel-sharded shapes.

This module imports torch at the top: only milp_plan.profiler imports it, and only inside
its functions, so the core package never needs torch.

One GPU of a tp group of size t holds (Megatron's column/row-parallel split):

* attention: a/t query heads; g/t query groups when g >= t, else one group replicated
  on every rank (g < t); the fused QKV projection is column-parallel
  h -> (a/t + 2 g_t) x head_dim, the output projection row-parallel (a/t) x head_dim -> h;
* MLP: column-parallel h -> f/t (2f/t for SwiGLU: gate and up), row-parallel f/t -> h;
* embedding and head: ceil(V/t) vocabulary rows (vocab-parallel), the cross-entropy over
  the local logits;
* norms, residual adds and dropout: the full hidden size (no sequence parallelism).

The collectives that join the shards (the all-reduce after each row-parallel GEMM, the
reductions of the vocab-parallel embedding and cross-entropy) are not run: their time
comes from the cost model. Attention uses torch's scaled_dot_product_attention (a fused
kernel where the device has one), causal for GPT, Llama and the T5 decoder's
self-attention, bidirectional for BERT, the T5 encoder and cross-attention; attention
dropout is off (as with FlashAttention), hidden dropout (p = 0.1) follows model.dropout.
T5's relative position bias is not modelled (a small per-head additive term).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from milp_plan.model import Model

DROPOUT_P = 0.1
BLOCK_KINDS = ("block", "encoder_block", "decoder_block")


@dataclass(frozen=True)
class Shard:
    """Per-rank sizes of a tp-sharded layer."""

    hidden: int
    head_dim: int
    heads: int          # a / t
    groups: int         # g / t, or 1 (replicated) when g < t
    ffn: int            # f / t
    vocab: int          # ceil(V / t)

    @staticmethod
    def of(model: Model, tp: int) -> "Shard":
        g = model.num_query_groups
        return Shard(model.hidden_size, model.head_dim, model.num_attention_heads // tp,
                     g // tp if g >= tp else 1, model.ffn_hidden_size // tp, math.ceil(model.vocab_size / tp))


def norm(model: Model) -> nn.Module:
    h = model.hidden_size
    return nn.LayerNorm(h) if model.norm == "layernorm" else nn.RMSNorm(h)


def dropout(model: Model) -> nn.Module:
    return nn.Dropout(DROPOUT_P) if model.dropout else nn.Identity()


def causal_self_attention(model: Model, kind: str) -> bool:
    return model.arch in ("gpt", "llama") or kind == "decoder_block"


def rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (rotate-half form) of x [b, heads, s, d]."""
    s, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v with q [b, heads, s, d] and k, v [b, groups, s_kv, d]:
    the part selective recompute recomputes. Each group serves heads/groups query heads
    (GQA, without materialising the repeated keys and values)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])


class Attention(nn.Module):
    """Self- or cross-attention of one rank: column-parallel QKV, row-parallel output."""

    def __init__(self, model: Model, sh: Shard, causal: bool, cross: bool = False):
        super().__init__()
        self.sh, self.causal, self.cross = sh, causal, cross
        self.rope = model.position == "rope"
        q_out, kv_out = sh.heads * sh.head_dim, 2 * sh.groups * sh.head_dim
        if cross:
            self.q = nn.Linear(sh.hidden, q_out, bias=model.bias)
            self.kv = nn.Linear(sh.hidden, kv_out, bias=model.bias)
        else:
            self.qkv = nn.Linear(sh.hidden, q_out + kv_out, bias=model.bias)
        self.proj = nn.Linear(q_out, sh.hidden, bias=model.bias)

    def qkv_heads(self, x: torch.Tensor, memory: torch.Tensor | None = None):
        """q [b, heads, s, d], k and v [b, groups, s_kv, d] of the inputs."""
        sh, b = self.sh, x.shape[0]
        q_out = sh.heads * sh.head_dim
        if self.cross:
            q, kv = self.q(x), self.kv(memory)
        else:
            qkv = self.qkv(x)
            q, kv = qkv[..., :q_out], qkv[..., q_out:]
        q = q.view(b, x.shape[1], sh.heads, sh.head_dim).transpose(1, 2)
        kv = kv.view(b, kv.shape[1], 2, sh.groups, sh.head_dim)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        if self.rope:
            q, k = rope(q), rope(k)
        return q, k, v

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.qkv_heads(x, memory)
        ctx = attention_core(q, k, v, self.causal)
        b, s = x.shape[0], x.shape[1]
        return self.proj(ctx.transpose(1, 2).reshape(b, s, self.sh.heads * self.sh.head_dim))


class MLP(nn.Module):
    """Column-parallel up (and gate), activation, row-parallel down."""

    def __init__(self, model: Model, sh: Shard):
        super().__init__()
        self.kind = model.mlp
        up = 2 * sh.ffn if model.mlp == "swiglu" else sh.ffn
        self.fc1 = nn.Linear(sh.hidden, up, bias=model.bias)
        self.fc2 = nn.Linear(sh.ffn, sh.hidden, bias=model.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        if self.kind == "swiglu":
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y) if self.kind == "gelu" else F.relu(y)
        return self.fc2(y)


class Block(nn.Module):
    """Pre-norm Transformer block: attention (+ cross-attention for decoder_block), MLP."""

    def __init__(self, model: Model, sh: Shard, kind: str):
        super().__init__()
        self.decoder = kind == "decoder_block"
        self.norm1, self.attn = norm(model), Attention(model, sh, causal_self_attention(model, kind))
        if self.decoder:
            self.norm_x, self.cross = norm(model), Attention(model, sh, causal=False, cross=True)
        self.norm2, self.mlp, self.drop = norm(model), MLP(model, sh), dropout(model)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        if self.decoder:
            x = x + self.drop(self.cross(self.norm_x(x), memory))
        return x + self.drop(self.mlp(self.norm2(x)))

    def core_inputs(self, b: int, s: int, **kw) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]]:
        """Random (q, k, v, causal) at this rank's shapes for each attention core of the block."""
        attns = [self.attn] + ([self.cross] if self.decoder else [])
        out = []
        for a in attns:
            sh = a.sh
            q = torch.randn(b, sh.heads, s, sh.head_dim, requires_grad=True, **kw)
            k = torch.randn(b, sh.groups, s, sh.head_dim, requires_grad=True, **kw)
            v = torch.randn(b, sh.groups, s, sh.head_dim, requires_grad=True, **kw)
            out.append((q, k, v, a.causal))
        return out


class Embedding(nn.Module):
    """Vocab-parallel word embedding (+ learned positions, + BERT token types and norm), dropout."""

    def __init__(self, model: Model, sh: Shard, max_seq: int):
        super().__init__()
        self.word = nn.Embedding(sh.vocab, sh.hidden)
        self.pos = nn.Embedding(max_seq, sh.hidden) if model.position == "learned" else None
        self.types = nn.Embedding(2, sh.hidden) if model.arch == "bert" else None
        self.norm = norm(model) if model.arch == "bert" else None
        self.drop = dropout(model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.word(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))
        if self.types is not None:
            x = self.norm(x + self.types(torch.zeros_like(ids)))
        return self.drop(x)


class Head(nn.Module):
    """Final norm (+ BERT's MLM transform), vocab-parallel projection, cross-entropy (fp32)."""

    def __init__(self, model: Model, sh: Shard):
        super().__init__()
        self.norm = norm(model)
        bert = model.arch == "bert"
        self.transform = nn.Sequential(nn.Linear(sh.hidden, sh.hidden), nn.GELU(), norm(model)) if bert else None
        self.proj = nn.Linear(sh.hidden, sh.vocab, bias=bert)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        if self.transform is not None:
            x = self.transform(x)
        logits = self.proj(x).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def build_layer(model: Model, kind: str, tp: int, max_seq: int) -> nn.Module:
    """One layer of `kind` as one rank of a tp group holds it."""
    sh = Shard.of(model, tp)
    if kind == "embedding":
        return Embedding(model, sh, max_seq)
    if kind == "head":
        return Head(model, sh)
    if kind in BLOCK_KINDS:
        return Block(model, sh, kind)
    raise KeyError(kind)


def layer_inputs(model: Model, kind: str, tp: int, b: int, s: int, **kw) -> list[torch.Tensor]:
    """Fresh inputs of one micro-batch [b, s]: token ids for the embedding; hidden states
    (requiring grad) for blocks, with the encoder output as the second input of a
    decoder_block; hidden states and targets for the head."""
    sh = Shard.of(model, tp)
    device = kw.get("device")
    if kind == "embedding":
        return [torch.randint(0, sh.vocab, (b, s), device=device)]
    x = torch.randn(b, s, sh.hidden, requires_grad=True, **kw)
    if kind == "head":
        return [x, torch.randint(0, sh.vocab, (b, s), device=device)]
    if kind == "decoder_block":
        return [x, torch.randn(b, s, sh.hidden, requires_grad=True, **kw)]
    return [x]


def block_kinds(model: Model, n: int) -> list[str]:
    """The kinds of the first n blocks of a model truncated to n blocks; a truncated T5
    keeps the encoder/decoder proportion of the full model (at least one encoder block)."""
    if model.arch != "t5":
        return [model.block_kind(i) for i in range(n)]
    n_enc = max(1, min(n - 1, round(n * model.encoder_layers / model.num_layers))) if n > 1 else n
    return ["encoder_block"] * n_enc + ["decoder_block"] * (n - n_enc)


class WholeModel(nn.Module):
    """Embedding, `num_blocks` blocks in model order, head: the layers chained into one model
    (a T5 decoder embeds the same ids again and attends to the encoder's output)."""

    def __init__(self, model: Model, tp: int, max_seq: int, num_blocks: int | None = None):
        super().__init__()
        self.kinds = block_kinds(model, model.num_layers if num_blocks is None else num_blocks)
        self.embedding = build_layer(model, "embedding", tp, max_seq)
        self.blocks = nn.ModuleList(build_layer(model, k, tp, max_seq) for k in self.kinds)
        self.head = build_layer(model, "head", tp, max_seq)

    def layer_kinds(self) -> list[str]:
        """The layer kinds the forward runs, in order (T5 runs the embedding twice)."""
        emb = ["embedding"] * (2 if "decoder_block" in self.kinds else 1)
        return emb + self.kinds + ["head"]

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids)
        memory = None
        for kind, block in zip(self.kinds, self.blocks):
            if kind == "decoder_block":
                if memory is None:
                    memory, x = x, self.embedding(ids)
                x = block(x, memory)
            else:
                x = block(x)
        return self.head(x, targets)

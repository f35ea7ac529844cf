"""Transformer architectures: parameter counts, FLOPs and activation memory per layer.

Notation (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models"): s sequence length, b micro-batch size, h hidden size, a
attention heads, t tensor-parallel size, f ffn hidden size, kv = query groups x head
dim, L layers, V vocabulary. Activations are 2-byte (bf16/fp16); dropout masks 1 byte.

The per-layer activation memory is written term by term (section 4.1 of the paper) so
that it reproduces the paper's closed forms exactly for a GPT layer (f = 4h, kv = h,
GeLU, dropout), and generalises to GQA, SwiGLU and dropout-free models:

    no recompute, no TP:           sbh (34 + 5as/h)
    TP, no sequence parallelism:   sbh (10 + 24/t + 5as/(ht))
    TP + sequence parallelism:     sbh/t (34 + 5as/h)
    selective recompute:           the 5as^2b term disappears (core attention recomputed)
    full recompute:                2sbh (only the layer input; /t with sequence parallelism)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from milp_plan.errors import InputError
from milp_plan.fileio import check_fields, load_yaml, number, sha256_text
from milp_plan.resources import catalog_file

ARCHS = ("gpt", "bert", "t5", "llama")
RECOMPUTE = ("none", "selective", "full")

_ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt": dict(mlp="gelu", norm="layernorm", bias=True, dropout=True, tied_embeddings=True, position="learned"),
    "bert": dict(mlp="gelu", norm="layernorm", bias=True, dropout=True, tied_embeddings=True, position="learned"),
    "t5": dict(mlp="relu", norm="rmsnorm", bias=False, dropout=True, tied_embeddings=True, position="relative"),
    "llama": dict(mlp="swiglu", norm="rmsnorm", bias=False, dropout=False, tied_embeddings=False, position="rope"),
}


@dataclass(frozen=True)
class Model:
    name: str
    arch: str
    num_layers: int            # transformer blocks (encoder + decoder for t5)
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int
    seq_length: int
    encoder_layers: int = 0    # t5: the first `encoder_layers` blocks are encoder blocks
    mlp: str = "gelu"          # gelu | relu | swiglu
    norm: str = "layernorm"    # layernorm | rmsnorm
    bias: bool = True
    dropout: bool = True
    tied_embeddings: bool = True
    position: str = "learned"  # learned | rope | relative
    source: str = "catalog"

    def __hash__(self) -> int:  # cached: the per-layer functions below are memoised on (self, args)
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        return hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))

    def __reduce__(self):  # pickled without the cached hash: another process salts str hashes anew
        return Model, tuple(getattr(self, f) for f in self.__dataclass_fields__)

    # ---- structure -------------------------------------------------------------
    @functools.cached_property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @functools.cached_property
    def kv_size(self) -> int:
        return self.num_query_groups * self.head_dim

    def tp_violations(self, tp: int) -> list[str]:
        """Why tensor parallelism of size tp cannot split this model (the one place of the rule):
        the attention heads must divide by tp, the query groups be a multiple or divisor of it."""
        out = []
        if self.num_attention_heads % tp:
            out.append(f"{self.num_attention_heads} attention heads are not divisible by tp {tp}")
        g = self.num_query_groups
        if g % tp and tp % g:
            out.append(f"{g} query groups are neither a multiple nor a divisor of tp {tp}")
        return out

    def block_kind(self, layer: int) -> str:
        """Layer kind of block `layer` (0-based): block, encoder_block or decoder_block."""
        if self.arch == "bert":
            return "encoder_block"
        if self.arch == "t5":
            return "encoder_block" if layer < self.encoder_layers else "decoder_block"
        return "block"

    def kinds(self) -> tuple[str, ...]:
        """Every layer kind the model has, in model order: embedding, blocks, head."""
        blocks = []
        for i in range(self.num_layers):
            k = self.block_kind(i)
            if k not in blocks:
                blocks.append(k)
        return ("embedding", *blocks, "head")

    # ---- parameters ------------------------------------------------------------
    def _norm_params(self) -> int:
        return (2 if self.norm == "layernorm" else 1) * self.hidden_size

    def _attention_params(self) -> int:
        h, kv = self.hidden_size, self.kv_size
        weights = h * h + 2 * h * kv + h * h
        return weights + ((h + 2 * kv + h) if self.bias else 0)

    def _mlp_params(self) -> int:
        h, f = self.hidden_size, self.ffn_hidden_size
        if self.mlp == "swiglu":
            return 3 * h * f + ((2 * f + h) if self.bias else 0)
        return 2 * h * f + ((f + h) if self.bias else 0)

    @functools.lru_cache(maxsize=None)
    def layer_params(self, kind: str) -> int:
        """Parameters of one layer of `kind`. The head counts its vocab projection even when
        tied, because with pipeline parallelism the last stage holds its own copy."""
        h, v = self.hidden_size, self.vocab_size
        if kind in ("block", "encoder_block"):
            return self._attention_params() + self._mlp_params() + 2 * self._norm_params()
        if kind == "decoder_block":
            return 2 * self._attention_params() + self._mlp_params() + 3 * self._norm_params()
        if kind == "embedding":
            p = v * h
            if self.position == "learned":
                p += self.seq_length * h
            if self.arch == "bert":
                p += 2 * h + self._norm_params()  # token types + embedding LayerNorm
            return p
        if kind == "head":
            p = self._norm_params() + v * h
            if self.arch == "bert":
                p += h * h + h + self._norm_params() + v  # MLM transform + output bias
            return p
        raise KeyError(kind)

    @functools.cached_property
    def num_parameters(self) -> int:
        """Unique parameters (a tied output projection counted once)."""
        total = self.layer_params("embedding") + self.layer_params("head")
        total += sum(self.layer_params(self.block_kind(i)) for i in range(self.num_layers))
        if self.tied_embeddings:
            total -= self.vocab_size * self.hidden_size
        return total

    # ---- FLOPs -----------------------------------------------------------------
    def _matmul_weights(self, kind: str) -> int:
        h, kv, f = self.hidden_size, self.kv_size, self.ffn_hidden_size
        attn = 2 * h * h + 2 * h * kv
        mlp = (3 if self.mlp == "swiglu" else 2) * h * f
        if kind in ("block", "encoder_block"):
            return attn + mlp
        if kind == "decoder_block":
            return 2 * attn + mlp
        if kind == "head":
            return self.vocab_size * h + (h * h if self.arch == "bert" else 0)
        return 0

    def forward_flops_per_token(self, kind: str, seq_length: int | None = None) -> float:
        """Forward FLOPs per token of one layer: 2 x matmul weights, plus the attention
        score and context products 2 x 2 x s x h (full, not causal-halved, as in
        Narayanan et al. 2021). Backward is twice the forward."""
        s = seq_length or self.seq_length
        flops = 2.0 * self._matmul_weights(kind)
        n_attn = {"block": 1, "encoder_block": 1, "decoder_block": 2}.get(kind, 0)
        flops += n_attn * 4.0 * s * self.hidden_size
        return flops

    def attention_core_flops_per_token(self, kind: str, seq_length: int | None = None) -> float:
        s = seq_length or self.seq_length
        n_attn = {"block": 1, "encoder_block": 1, "decoder_block": 2}.get(kind, 0)
        return n_attn * 4.0 * s * self.hidden_size

    def flops_per_token(self, seq_length: int | None = None) -> float:
        """Forward + backward FLOPs per token of the whole model (no recompute)."""
        fwd = sum(self.forward_flops_per_token(self.block_kind(i), seq_length) for i in range(self.num_layers))
        fwd += self.forward_flops_per_token("head", seq_length)
        return 3.0 * fwd

    # ---- activations -----------------------------------------------------------
    def _attention_activation(self, s: int, b: int, t: int, sp: bool, recompute: str,
                              flash: bool) -> float:
        h, a, kv = self.hidden_size, self.num_attention_heads, self.kv_size
        rep = 1.0 / t if sp else 1.0     # tensors that TP replicates unless sequence-parallel
        mask = 1.0 if self.dropout else 0.0
        sbh = s * b * h
        out = 2 * sbh * rep                               # QKV input (LayerNorm output)
        out += (2 * sbh + 2 * s * b * kv) / t             # Q and K for QK^T
        out += 2 * s * b * kv / t                         # V
        out += 2 * sbh / t                                # output projection input
        out += mask * sbh * rep                           # output dropout mask
        if recompute == "none" and not flash:
            out += (2 + mask + 2 * mask) * a * s * s * b / t  # softmax out, dropout mask, dropout out
        return out

    def _mlp_activation(self, s: int, b: int, t: int, sp: bool) -> float:
        h, f = self.hidden_size, self.ffn_hidden_size
        rep = 1.0 / t if sp else 1.0
        mask = 1.0 if self.dropout else 0.0
        inner = (6 if self.mlp == "swiglu" else 4) * s * b * f / t  # fc1 out + activation out (+ gate)
        return 2 * s * b * h * rep + inner + mask * s * b * h * rep

    @functools.lru_cache(maxsize=None)
    def layer_activation_bytes(self, kind: str, *, micro_batch: int, tp: int = 1, seq_length: int | None = None,
                               sequence_parallel: bool = False, recompute: str = "none",
                               flash_attention: bool = False) -> float:
        """Bytes one micro-batch keeps alive in one layer of `kind` until its backward.

        recompute: none | selective (core attention recomputed) | full (only the input kept).
        With flash attention the s^2 terms are never stored (as with selective recompute).
        """
        s, b, t, h = seq_length or self.seq_length, micro_batch, tp, self.hidden_size
        sp = sequence_parallel and t > 1
        rep = 1.0 / t if sp else 1.0
        if recompute not in RECOMPUTE:
            raise ValueError(recompute)
        if kind == "embedding":
            return (s * b * h * rep) if self.dropout else 0.0  # embedding dropout mask
        if kind == "head":
            return 2 * s * b * h * rep + 2 * s * b * h / t + 4.0 * s * b * self.vocab_size / t  # norm in, proj in, fp32 logits
        if recompute == "full":
            return 2.0 * s * b * h * rep
        n_attn = 2 if kind == "decoder_block" else 1
        n_norm = 3 if kind == "decoder_block" else 2
        out = n_attn * self._attention_activation(s, b, t, sp, recompute, flash_attention)
        out += self._mlp_activation(s, b, t, sp)
        out += n_norm * 2 * s * b * h * rep
        return out

    # ---- serialisation ---------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        d = asdict(self)
        d.pop("source")
        return d

    def content_hash(self) -> str:
        import json
        return sha256_text(json.dumps(self.to_dict(), sort_keys=True))


_REQUIRED = ["num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size", "seq_length"]
# The largest value of each integer field milp-plan plans for (larger is refused, naming the limit):
# 100000 layers or a 2^40 hidden size is a typo, and the search grows with the layer count.
MAX_FIELD = {"num_layers": 1024, "hidden_size": 2**17, "ffn_hidden_size": 2**19, "num_attention_heads": 2**12,
             "vocab_size": 2**22, "seq_length": 2**20, "num_query_groups": 2**12, "encoder_layers": 1024}
_BOOLS = ("bias", "dropout", "tied_embeddings")
_CHOICES = {"mlp": ("gelu", "relu", "swiglu"), "norm": ("layernorm", "rmsnorm"),
            "position": ("learned", "rope", "relative")}
_OPTIONAL = ["name", "arch", "num_query_groups", "encoder_layers", "mlp", "norm", "bias", "dropout",
             "tied_embeddings", "position", "description"]


def model_from_mapping(name: str, data: Any, source: str) -> Model:
    where = f"model '{name}'"
    check_fields(data, source=source, where=where, required=_REQUIRED, optional=_OPTIONAL)
    arch = data.get("arch", "gpt")
    if arch not in ARCHS:
        raise InputError(f"{where}: field 'arch' must be one of {', '.join(ARCHS)}, got {arch!r}", source=source)
    ints = {k: number(data, k, source=source, where=where, integer=True, maximum=MAX_FIELD[k]) for k in _REQUIRED}
    heads = ints["num_attention_heads"]
    groups = number(data, "num_query_groups", source=source, where=where, integer=True, default=heads,
                    maximum=MAX_FIELD["num_query_groups"])
    enc = number(data, "encoder_layers", source=source, where=where, integer=True, allow_zero=True, default=0,
                 maximum=MAX_FIELD["encoder_layers"])
    if "name" in data and not isinstance(data["name"], (str, int)):
        raise InputError(f"{where}: field 'name' must be a string, got {data['name']!r}", source=source)
    if ints["hidden_size"] % heads:
        raise InputError(f"{where}: hidden_size {ints['hidden_size']} must be divisible by num_attention_heads "
                         f"{heads}", source=source)
    if heads % groups:
        raise InputError(f"{where}: num_attention_heads {heads} must be divisible by num_query_groups {groups}",
                         source=source)
    if arch == "t5" and not 0 < enc < ints["num_layers"]:
        raise InputError(f"{where}: t5 needs 0 < encoder_layers < num_layers, got {enc}", source=source)
    defaults = dict(_ARCH_DEFAULTS[arch])
    for key in defaults:
        if key in data:
            defaults[key] = data[key]
    for key in _BOOLS:
        if not isinstance(defaults[key], bool):
            raise InputError(f"{where}: field '{key}' must be true or false, got {defaults[key]!r}", source=source)
    for key, choices in _CHOICES.items():
        if not isinstance(defaults[key], str) or defaults[key] not in choices:
            raise InputError(f"{where}: field '{key}' must be one of {', '.join(choices)}, got {defaults[key]!r}",
                             source=source)
    return Model(name=str(data.get("name", name)), arch=arch, num_query_groups=groups, encoder_layers=enc,
                 source=source, **ints, **defaults)


@functools.lru_cache(maxsize=1)
def model_catalog() -> dict[str, Model]:
    path = catalog_file("models.yaml")
    data = load_yaml(path, "model catalog")
    return {name: model_from_mapping(name, spec, "catalog") for name, spec in data.items()}


def load_model(spec: str | Path | None, default: str = "gpt3-1.3b") -> Model:
    """A catalog name or a model YAML file."""
    text = str(spec) if spec is not None else default
    catalog = model_catalog()
    if text in catalog:
        return catalog[text]
    path = Path(text)
    if not (path.exists() or path.is_symlink()):  # a broken link or a loop: read_text names it
        raise InputError(f"unknown model; use a catalog name ({', '.join(catalog)}) or a model YAML file",
                         source=text)
    data = load_yaml(path, "model file")
    name = data.get("name", path.stem) if isinstance(data, Mapping) else path.stem
    if isinstance(data, Mapping) and "base" in data:
        data = with_base(data, catalog, str(path))
    return replace(model_from_mapping(str(name), data, str(path)), source=str(path))


def with_base(data: Mapping[str, Any], catalog: Mapping[str, Model], source: str) -> dict[str, Any]:
    """`base: <catalog model>` in a model YAML: the catalog model's fields, overridden by the
    file's (e.g. `num_attention_heads: 16` to reproduce FASOP's GPT-2 XL). When the heads
    change and the file names no `num_query_groups`, a base with one group per head keeps
    one per head (multi-head attention stays multi-head); a grouped base keeps its groups."""
    base = data["base"]
    if not isinstance(base, str) or base not in catalog:
        raise InputError(f"field 'base' must name a catalog model ({', '.join(catalog)}), got {base!r:.40}",
                         source=source)
    parent = catalog[base]
    out = {k: v for k, v in parent.to_dict().items() if k != "name"}
    out.update({k: v for k, v in data.items() if k != "base"})
    if ("num_attention_heads" in data and "num_query_groups" not in data
            and parent.num_query_groups == parent.num_attention_heads):
        out["num_query_groups"] = data["num_attention_heads"]
    return out

"""Model catalog: parameter counts against published figures, FLOPs against Narayanan et al.
2021, activation memory against Korthikanti et al. 2022, and bad model YAMLs."""
from __future__ import annotations

from pathlib import Path

import pytest

from milp_plan.errors import InputError
from milp_plan.model import load_model, model_catalog, model_from_mapping

CAT = model_catalog()


# ---- parameter counts -----------------------------------------------------------------
# Published counts (the `num_parameters()` of the Hugging Face reference implementations,
# which include the final norm and count a tied output projection once):
#   meta-llama/Llama-2-7b-hf        6,738,415,616  (LlamaForCausalLM, untied lm_head)
#   meta-llama/Meta-Llama-3-8B      8,030,261,248
#   meta-llama/Llama-2-70b-hf      68,976,648,192
#   openai-community/gpt2-xl        1,557,611,200  (GPT2LMHeadModel, tied lm_head, incl. ln_f)
# Llama 2 paper (Touvron et al. 2023) rounds these to 7B / 70B; Llama 3 model card to 8B.
@pytest.mark.parametrize("name, published", [
    ("llama2-7b", 6_738_415_616),
    ("llama3-8b", 8_030_261_248),
    ("llama2-70b", 68_976_648_192),
    ("gpt2-xl", 1_557_611_200),
])
def test_parameter_counts_match_published(name, published):
    assert CAT[name].num_parameters == published


def test_bert_large_against_hf_bert_large_uncased():
    # HF bert-large-uncased BertModel: 335,141,888 parameters, which include the pooler
    # (dense h x h + bias: 1024^2 + 1024 = 1,049,600) and no pre-training head.
    # Our model is BERT as Megatron-LM trains it (masked-LM): no pooler, plus
    #   MLM head transform dense h x h + h and its LayerNorm 2h  = 1,049,600 + 2,048
    #   output bias V                                          = 30,522
    #   the final LayerNorm of Megatron's (pre-LN) transformer = 2,048
    # (the decoder weight is tied to the word embeddings: counted once).
    hf_bert_model = 335_141_888
    expected = hf_bert_model - 1_049_600 + (1_049_600 + 2_048) + 30_522 + 2_048
    assert expected == 335_176_506
    assert CAT["bert-large"].num_parameters == expected
    # the encoder blocks alone agree with HF exactly: per BertLayer
    #   attention q,k,v,o 4(h^2 + h) + LayerNorm 2h + intermediate h f + f + output f h + h + LayerNorm 2h
    h, f = 1024, 4096
    assert CAT["bert-large"].layer_params("encoder_block") == 4 * (h * h + h) + 2 * h + h * f + f + f * h + h + 2 * h


def test_t5_770m_against_hf_t5_large():
    # HF t5-large T5Model / T5ForConditionalGeneration (tied): 737,668,096 parameters.
    # Per HF: shared embedding 32128 x 1024; 24 encoder blocks (self-attention q,k,v,o 4h^2 and
    # its RMS norm h, feed-forward wi, wo 2hf and its norm h); 24 decoder blocks (self- and
    # cross-attention 8h^2 with 2 norms 2h, feed-forward 2hf and its norm h); no biases; plus
    #   - relative_attention_bias (32 buckets x 16 heads = 512) in the first encoder block and
    #     in the first decoder block: 1,024 in all;
    #   - the encoder's final_layer_norm: 1,024.
    # Our model has no relative-position bias table (the bias is a per-head scalar lookup, no
    # FLOPs or activations worth modelling) and counts one final norm (the decoder's, in the
    # head), so it is exactly 2,048 smaller.
    h, f, V, L = 1024, 4096, 32128, 24
    enc_block = 4 * h * h + h + 2 * h * f + h
    dec_block = 8 * h * h + 2 * h + 2 * h * f + h
    hf = V * h + L * enc_block + L * dec_block + 2 * 512 + 2 * h
    assert hf == 737_668_096
    m = CAT["t5-770m"]
    assert m.layer_params("encoder_block") == enc_block
    assert m.layer_params("decoder_block") == dec_block
    assert m.num_parameters == hf - 1024 - 1024


@pytest.mark.parametrize("name", ["gpt3-1.3b", "gpt3-6.7b", "gpt3-175b"])
def test_gpt_parameter_closed_form(name):
    # Narayanan et al. 2021 (eq. 2): P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)),
    # i.e. 12h^2 + 13h per block plus (V + s) h of embeddings; it omits the final LayerNorm (2h).
    m = CAT[name]
    l, h, V, s = m.num_layers, m.hidden_size, m.vocab_size, m.seq_length
    assert m.num_parameters == 12 * l * h * h + 13 * l * h + (V + s) * h + 2 * h


# ---- FLOPs ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt2-xl", "gpt3-1.3b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b"])
@pytest.mark.parametrize("seq", [None, 1024, 4096])
def test_flops_per_token_narayanan(name, seq):
    # Narayanan et al. 2021, eq. 3: F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) FLOPs per iteration
    # without activation recomputation (96 with full recompute). Per token divide by B s:
    #   per layer forward: matmuls 2 x (3h^2 QKV + h^2 proj + 8h^2 MLP) = 24 h^2, attention
    #   scores + context 2 x 2 s h = 4 s h  ->  24 h^2 (1 + s/(6h));
    #   logits forward 2 V h = 24 h^2 x V/(12 h);  forward + backward = 3 x forward ->
    #   72 l h^2 (1 + s/(6h) + V/(12 l h)) per token.
    m = CAT[name]
    s = seq or m.seq_length
    l, h, V = m.num_layers, m.hidden_size, m.vocab_size
    expected = 72 * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    assert m.flops_per_token(seq) == pytest.approx(expected, rel=1e-12)


def test_forward_flops_of_a_block_by_hand():
    # gpt3-6.7b, s = 2048, h = 4096: 24 h^2 + 4 s h per token
    m = CAT["gpt3-6.7b"]
    assert m.forward_flops_per_token("block", 2048) == 24 * 4096**2 + 4 * 2048 * 4096
    assert m.attention_core_flops_per_token("block", 2048) == 4 * 2048 * 4096
    assert m.forward_flops_per_token("embedding") == 0


def test_forward_flops_gqa_swiglu_by_hand():
    # llama3-8b: h 4096, 8 query groups x 128 = kv 1024, f 14336 (SwiGLU: 3 matrices)
    # 2 x (2 h^2 + 2 h kv + 3 h f) + 4 s h
    m = CAT["llama3-8b"]
    h, kv, f, s = 4096, 1024, 14336, 8192
    assert m.forward_flops_per_token("block", s) == 2 * (2 * h * h + 2 * h * kv + 3 * h * f) + 4 * s * h


# ---- activation memory (Korthikanti et al. 2022) ----------------------------------------
def gpt_layer(h: int, a: int, s: int):
    """A GPT layer as in the paper: f = 4h, kv = h (a heads, a query groups), GeLU, dropout."""
    return model_from_mapping("k", {"arch": "gpt", "num_layers": 2, "hidden_size": h, "ffn_hidden_size": 4 * h,
                                    "num_attention_heads": a, "vocab_size": 1000, "seq_length": s}, "test")


CASES = [  # (s, b, h, a, t)
    (2048, 1, 4096, 32, 1),
    (2048, 1, 4096, 32, 8),
    (2048, 4, 12288, 96, 8),   # GPT-3 175B layer, as in the paper's Table 4/5 settings
    (1024, 2, 1600, 25, 5),
    (512, 8, 1024, 16, 2),
    (4096, 1, 8192, 64, 4),
]


@pytest.mark.parametrize("s, b, h, a, t", CASES)
def test_korthikanti_no_recompute(s, b, h, a, t):
    m = gpt_layer(h, a, s)
    sbh = s * b * h
    kw = dict(micro_batch=b, tp=t, seq_length=s, flash_attention=False, recompute="none")
    # Table 2: no parallelism sbh(34 + 5as/h)
    no_tp = m.layer_activation_bytes("block", micro_batch=b, tp=1, seq_length=s, flash_attention=False)
    assert no_tp == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-12)
    # tensor parallel, no sequence parallelism: sbh(10 + 24/t + 5as/(ht))
    assert m.layer_activation_bytes("block", sequence_parallel=False, **kw) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    # tensor + sequence parallel: sbh/t (34 + 5as/h)
    assert m.layer_activation_bytes("block", sequence_parallel=True, **kw) == pytest.approx(
        sbh / t * (34 + 5 * a * s / h), rel=1e-12)


@pytest.mark.parametrize("s, b, h, a, t", CASES)
def test_korthikanti_selective_recompute(s, b, h, a, t):
    m = gpt_layer(h, a, s)
    sbh = s * b * h
    kw = dict(micro_batch=b, tp=t, seq_length=s, flash_attention=False, recompute="selective")
    # Table 2: TP + selective recompute sbh(10 + 24/t); TP + SP + selective 34 sbh/t
    assert m.layer_activation_bytes("block", sequence_parallel=False, **kw) == pytest.approx(
        sbh * (10 + 24 / t), rel=1e-12)
    assert m.layer_activation_bytes("block", sequence_parallel=True, **kw) == pytest.approx(34 * sbh / t, rel=1e-12)
    # flash attention stores no s^2 term either: the same bytes with recompute none
    assert m.layer_activation_bytes("block", micro_batch=b, tp=t, seq_length=s, flash_attention=True,
                                    sequence_parallel=True) == pytest.approx(34 * sbh / t, rel=1e-12)


@pytest.mark.parametrize("s, b, h, a, t", CASES)
def test_korthikanti_full_recompute(s, b, h, a, t):
    m = gpt_layer(h, a, s)
    sbh = s * b * h
    kw = dict(micro_batch=b, tp=t, seq_length=s, flash_attention=False, recompute="full")
    # Section 4.3: full recompute keeps only the layer input, 2sbh (sharded with SP: 2sbh/t)
    assert m.layer_activation_bytes("block", sequence_parallel=False, **kw) == pytest.approx(2 * sbh, rel=1e-12)
    assert m.layer_activation_bytes("block", sequence_parallel=True, **kw) == pytest.approx(2 * sbh / t, rel=1e-12)


@pytest.mark.parametrize("s, b, h, a, t", CASES)
def test_korthikanti_embedding_and_output_layer(s, b, h, a, t):
    # Section 4.3 with sequence parallelism: embedding dropout mask sbh/t; output layer
    # (final LayerNorm input, projection input, fp32 logits for the cross-entropy) 4sbh/t (1 + v/h).
    m = gpt_layer(h, a, s)
    v, sbh = m.vocab_size, s * b * h
    kw = dict(micro_batch=b, tp=t, seq_length=s, sequence_parallel=True)
    assert m.layer_activation_bytes("embedding", **kw) == pytest.approx(sbh / t, rel=1e-12)
    assert m.layer_activation_bytes("head", **kw) == pytest.approx(4 * sbh / t * (1 + v / h), rel=1e-12)


def test_activation_without_dropout_gqa_swiglu_by_hand():
    # llama2-70b layer (no dropout, SwiGLU, kv = 8 x 128 = 1024), s 4096, b 1, t 8, SP, selective:
    #   attention: LN-out 2sbh/t, Q 2sbh/t + K 2 s b kv/t, V 2 s b kv/t, proj input 2sbh/t
    #   MLP: input 2sbh/t, gate+up outputs and activation 6 s b f / t
    #   norms: 2 x 2sbh/t
    m = CAT["llama2-70b"]
    s, b, h, kv, f, t = 4096, 1, 8192, 1024, 28672, 8
    expect = (2 * s * b * h + 2 * s * b * h + 4 * s * b * kv + 2 * s * b * h) / t \
        + 2 * s * b * h / t + 6 * s * b * f / t + 4 * s * b * h / t
    got = m.layer_activation_bytes("block", micro_batch=b, tp=t, seq_length=s, sequence_parallel=True,
                                   recompute="selective")
    assert got == pytest.approx(expect, rel=1e-12)


# ---- bad model YAMLs --------------------------------------------------------------------
GOOD = {"name": "mine", "num_layers": 4, "hidden_size": 512, "ffn_hidden_size": 2048, "num_attention_heads": 8,
        "vocab_size": 1000, "seq_length": 128}


def write_model(tmp_path: Path, **changes) -> Path:
    import yaml
    data = {**GOOD, **changes}
    data = {k: v for k, v in data.items() if v is not None}
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_custom_model_yaml_loads(tmp_path):
    m = load_model(write_model(tmp_path))
    assert (m.name, m.num_layers, m.hidden_size, m.num_query_groups) == ("mine", 4, 512, 8)
    assert m.source.endswith("mine.yaml")


@pytest.mark.parametrize("changes, words", [
    ({"colour": "red"}, ["unknown field 'colour'"]),
    ({"hidden_size": 500}, ["hidden_size 500", "num_attention_heads 8"]),
    ({"num_query_groups": 3}, ["num_attention_heads 8", "num_query_groups 3"]),
    ({"num_layers": -2}, ["field 'num_layers'", "> 0", "-2"]),
    ({"num_layers": 0}, ["field 'num_layers'", "> 0"]),
    ({"hidden_size": 51.5}, ["field 'hidden_size'", "whole number"]),
    ({"vocab_size": "many"}, ["field 'vocab_size'", "number"]),
    ({"seq_length": None}, ["missing required field 'seq_length'"]),
    ({"arch": "rnn"}, ["field 'arch'"]),
    ({"mlp": "tanh"}, ["field 'mlp'"]),
    ({"arch": "t5", "encoder_layers": 0}, ["encoder_layers"]),
])
def test_bad_model_yaml(tmp_path, changes, words):
    path = write_model(tmp_path, **changes)
    with pytest.raises(InputError) as err:
        load_model(path)
    msg = str(err.value)
    assert str(path) in msg
    for w in words:
        assert w in msg
    assert "\n" not in msg


def test_unknown_model_name():
    with pytest.raises(InputError, match="unknown model.*gpt3-6.7b"):
        load_model("gpt5-huge")


def test_model_yaml_syntax_error(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("num_layers: [4\n")
    with pytest.raises(InputError, match="YAML syntax error") as err:
        load_model(p)
    assert str(p) in str(err.value)

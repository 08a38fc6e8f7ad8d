#!/usr/bin/env python3
"""Golden fixtures from real transformers, for hone's parity tests.

Run where torch and transformers are installed (it forces the CPU):
    python3 tools/make_fixtures.py tests/fixtures                      every case
    python3 tools/make_fixtures.py tests/fixtures --cases roberta_cls,electra_cls

For each case it builds a small <Family>ForSequenceClassification (hidden size not a power
of two, padding at the end of rows in the attention mask with the family's pad token id in
input_ids there, dropout off), saves it with save_pretrained (config.json +
model.safetensors), then computes in float64 (so the reference has no float32 rounding of
its own) and writes golden.safetensors:
  input_ids, attention_mask, token_type_ids, labels        the batch
  logits, loss                                             forward
  grad.<parameter name>                                    backward, every parameter
  train.<field>.<k> for k < STEPS                          the batches of a short run
  train.loss, train.grad_norm, train.lr                    per optimizer step
  final.<parameter name>                                   weights after the run
The short run applies what Trainer applies per step: loss.backward(), clip_grad_norm_,
AdamW with Trainer's weight-decay grouping, then the linear schedule with warmup.
train_args.json records the arguments, the decay group and the parameter names in
named_parameters order. After writing, each case reloads its directory with
AutoModelForSequenceClassification and checks that it gives the same logits.

Every batch has the same fields, so one loader reads them all: token_type_ids is written
for every family, but it is only passed to models whose forward takes it.

The families (tests/fixtures/FAMILIES.md has the parameter names and config fields):
  bert_cls, bert_reg (BertForSequenceClassification): sentence pairs (token type 1 on the
    second half of each row), absolute positions 0..seq-1, pooler (dense + tanh on [CLS]),
    then dropout and classifier. Pad id 0.
  roberta_cls (RobertaForSequenceClassification), xlm_roberta_reg
    (XLMRobertaForSequenceClassification, the same code under other names; regression with
    gelu_new): position ids come from the input ids, not from the mask:
    padding_idx + cumsum(input_ids != padding_idx) at real tokens and padding_idx (1) at
    pad tokens, so the first token has position 2 and max_position_embeddings must be at
    least seq + 2 (15 here, the tightest). The real tokens never hold the pad id 1.
    type_vocab_size 1 and all-zero token_type_ids (RoBERTa tokenizers give no types),
    layer_norm_eps 1e-5 as in the released checkpoints. No pooler: the head is
    dropout -> dense -> tanh -> dropout -> out_proj on the first token.
  distilbert_cls (DistilBertForSequenceClassification): its config says dim, n_layers,
    n_heads, hidden_dim, activation, dropout, attention_dropout, seq_classif_dropout;
    no token types at all (forward takes no token_type_ids: zeros are written, not
    passed), every LayerNorm has eps 1e-12 whatever the config, no pooler: the head is
    pre_classifier -> ReLU -> dropout -> classifier on the first token.
  electra_cls (ElectraForSequenceClassification): embedding_size (24) differs from
    hidden_size (48), so embeddings_project (a Linear 24 -> 48) follows the embeddings'
    LayerNorm; BERT's sentence pairs and positions otherwise. No pooler: the head is
    dropout -> dense -> gelu (exact, erf; not the config's hidden_act) -> dropout ->
    out_proj on the first token.
  modernbert_cls, modernbert_mean_reg (ModernBertForSequenceClassification, eager attention):
    pre-LN layers (layer 0 has no attn_norm), one fused Wqkv, rotary positions on q and k,
    GeGLU MLP (Wi gives input and gate), final_norm, then the head pooling -> dense -> act
    -> LayerNorm -> dropout -> classifier. Layers alternate between global attention and a
    bidirectional band |q - k| <= local_attention // 2 (layer_types, from
    global_attn_every_n_layers), each type with its own rope theta; the band cuts keys at
    this sequence length, which the script asserts (zero attention weights beyond it, and
    logits that change when the band is widened to the whole row). No token types, no
    position embeddings. The special ids are not 0: at the end of the vocabulary in
    modernbert_cls (pad 99 of 101), as in the released checkpoints, and pad 3 in
    modernbert_mean_reg. Every attn.Wqkv.weight is scaled by 8 after init, so that the
    rotary angles and the band move the logits well beyond the parity tests' tolerances.
    modernbert_cls: transformers' defaults (no biases, exact gelu, CLS pooling),
    4 layers (layers 0 and 3 global), band half-width 2. modernbert_mean_reg: regression,
    mean pooling over the attention mask, every bias on, gelu_pytorch_tanh in the GeGLU,
    the Hub's global_rope_theta/local_rope_theta keys (10000, 500) and
    global_attn_every_n_layers 2 over 3 layers, band half-width 3.
    transformers computes ModernBERT's rotary cos/sin, the rotation of q and k and the
    eager softmax in float32 whatever the model's dtype; while a ModernBERT case runs,
    modernbert_float64() makes those three float64 too (the same formulas, see there),
    and the script checks that transformers' own float32 forward agrees with the result.
"""
import argparse
import contextlib
import inspect
import json
import math
import os
import sys

os.environ["CUDA_VISIBLE_DEVICES"] = ""  # float64 on the CPU; Trainer must not move the model
import torch
from safetensors.torch import save_file
from transformers import (AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification,
                          DistilBertConfig, DistilBertForSequenceClassification, ElectraConfig,
                          ElectraForSequenceClassification, ModernBertConfig, ModernBertForSequenceClassification,
                          RobertaConfig, RobertaForSequenceClassification, TrainingArguments, Trainer,
                          XLMRobertaConfig, XLMRobertaForSequenceClassification)
from transformers.models.modernbert import modeling_modernbert

STEPS = 3
ARGS = dict(learning_rate=1e-3, weight_decay=0.01, warmup_steps=1, max_grad_norm=0.5,
            adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, lr_scheduler_type="linear",
            max_steps=STEPS)
BATCH, SEQ = 3, 13

# Shared by the BERT-like families (BertConfig's field names).
BERT_LIKE = dict(vocab_size=101, hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
                 intermediate_size=80, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
ROBERTA_LIKE = dict(BERT_LIKE, max_position_embeddings=SEQ + 2, type_vocab_size=1, layer_norm_eps=1e-5,
                    pad_token_id=1, bos_token_id=0, eos_token_id=2)

# family: (config class, model class, base config fields, token types: "pair" or "zeros")
FAMILIES = {
    "bert": (BertConfig, BertForSequenceClassification,
             dict(BERT_LIKE, max_position_embeddings=40, type_vocab_size=2), "pair"),
    "roberta": (RobertaConfig, RobertaForSequenceClassification, ROBERTA_LIKE, "zeros"),
    "xlm-roberta": (XLMRobertaConfig, XLMRobertaForSequenceClassification, ROBERTA_LIKE, "zeros"),
    "distilbert": (DistilBertConfig, DistilBertForSequenceClassification,
                   dict(vocab_size=101, dim=48, n_layers=3, n_heads=3, hidden_dim=80, max_position_embeddings=40,
                        dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, pad_token_id=0,
                        sinusoidal_pos_embds=False), "zeros"),
    "electra": (ElectraConfig, ElectraForSequenceClassification,
                dict(BERT_LIKE, embedding_size=24, max_position_embeddings=40, type_vocab_size=2), "pair"),
    # Eager attention (an additive float mask, attention weights to check the band with);
    # not saved in config.json. Dropouts are 0 by default in ModernBertConfig; they are
    # written out all the same.
    "modernbert": (ModernBertConfig, ModernBertForSequenceClassification,
                   dict(vocab_size=101, hidden_size=48, num_attention_heads=3, intermediate_size=40,
                        max_position_embeddings=32, attention_dropout=0.0, embedding_dropout=0.0, mlp_dropout=0.0,
                        classifier_dropout=0.0, attn_implementation="eager"), "zeros"),
}

CASES = {
    # name: (family, config overrides)
    "bert_cls": ("bert", dict(num_labels=3, hidden_act="gelu")),
    "bert_reg": ("bert", dict(num_labels=1, hidden_act="gelu_new")),
    "roberta_cls": ("roberta", dict(num_labels=3, hidden_act="gelu")),
    "xlm_roberta_reg": ("xlm-roberta", dict(num_labels=1, hidden_act="gelu_new")),
    "distilbert_cls": ("distilbert", dict(num_labels=3, activation="gelu")),
    "electra_cls": ("electra", dict(num_labels=3, hidden_act="gelu")),
    # Layers 0 and 3 global, 1 and 2 banded (|q - k| <= 2: local_attention 4); special ids at the
    # end of the vocabulary as in the released checkpoints (pad 50283, cls 50281, sep 50282).
    "modernbert_cls": ("modernbert", dict(num_labels=3, num_hidden_layers=4, global_attn_every_n_layers=3,
                                          local_attention=4, classifier_pooling="cls", pad_token_id=99,
                                          bos_token_id=97, cls_token_id=97, eos_token_id=98, sep_token_id=98)),
    # Layers 0 and 2 global, 1 banded (|q - k| <= 3); every bias; the thetas as Hub config.json files
    # give them (transformers turns them into rope_parameters).
    "modernbert_mean_reg": ("modernbert", dict(num_labels=1, num_hidden_layers=3, global_attn_every_n_layers=2,
                                               local_attention=6, classifier_pooling="mean",
                                               hidden_activation="gelu_pytorch_tanh", classifier_activation="gelu",
                                               norm_bias=True, attention_bias=True, mlp_bias=True,
                                               classifier_bias=True, global_rope_theta=10000.0,
                                               local_rope_theta=500.0, pad_token_id=3, bos_token_id=1,
                                               cls_token_id=1, eos_token_id=2, sep_token_id=2)),
}


def make_batch(gen, vocab, batch, seq, num_labels, pad_id=0, types_kind="pair"):
    if pad_id == 0:
        ids = torch.randint(1, vocab, (batch, seq), generator=gen)
    else:  # every id but the pad id, which would change RoBERTa's positions
        ids = torch.randint(0, vocab - 1, (batch, seq), generator=gen)
        ids += (ids >= pad_id).long()
    mask = torch.ones(batch, seq, dtype=torch.long)
    types = torch.zeros(batch, seq, dtype=torch.long)
    for b in range(batch):
        length = seq - 4 * b  # 13, 9, 5: padding at the end of all but the first
        mask[b, length:] = 0
        ids[b, length:] = pad_id
        if types_kind == "pair":
            types[b, length // 2:length] = 1  # a sentence pair: second segment has type 1
    if num_labels == 1:
        # float32 values, so that the saved labels are exactly what was used
        labels = torch.randn(batch, generator=gen).double()
    else:
        labels = torch.randint(0, num_labels, (batch,), generator=gen)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)


@contextlib.contextmanager
def modernbert_float64():
    """ModernBERT in float64 throughout. transformers computes the rotary angles as float32
    (position_ids.float() * inv_freq.float(), inv_freq itself from a float32 arange), rotates
    q.float() and k.float() before casting back, and the eager softmax has dtype=float32:
    in a float64 model these round to float32, and a query whose band holds only padding
    (its float64 mask value becomes -inf in float32) gives NaN, which the padded rows' values
    carry into every row of the next layer. Inside this block the same three formulas run
    in the model's dtype: inv_freq = 1 / theta^(arange(0, d, 2) / d),
    angle = position * inv_freq, emb = cat(angle, angle); q*cos + rotate_half(q)*sin; softmax
    of scores + mask (a fully masked row is uniform, as in a float32 run)."""
    mb = modeling_modernbert
    saved = mb.eager_attention_forward, mb.apply_rotary_pos_emb, mb.ModernBertRotaryEmbedding.forward

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        weights = torch.matmul(query, key.transpose(2, 3)) * scaling
        if attention_mask is not None:
            weights = weights + attention_mask
        weights = torch.nn.functional.softmax(weights, dim=-1)
        weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    def rotary(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + mb.rotate_half(q) * sin, k * cos + mb.rotate_half(k) * sin

    def rope(self, x, position_ids, layer_type):
        params = self.config.rope_parameters[layer_type]
        assert params["rope_type"] == "default", params
        dim = self.config.hidden_size // self.config.num_attention_heads
        inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        angle = position_ids[..., None].to(torch.float64) * inv_freq.to(x.device)
        emb = torch.cat((angle, angle), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    mb.eager_attention_forward, mb.apply_rotary_pos_emb, mb.ModernBertRotaryEmbedding.forward = eager, rotary, rope
    try:
        yield
    finally:
        mb.eager_attention_forward, mb.apply_rotary_pos_emb, mb.ModernBertRotaryEmbedding.forward = saved


def modernbert_reference(model, ids, mask, window=None, rotation="half", thetas=None):
    """ModernBertForSequenceClassification's logits written out from FAMILIES.md, independent
    of transformers' modules (its parameters only): the check that the description is right.
    The other choices are the mistakes the fixture must catch: window, the band's half width
    (default config.local_attention // 2); rotation "half" (transformers' rotate_half, the
    pairs (i, i + d/2)), "interleaved" (the pairs (2i, 2i + 1)) or "none"; thetas, a layer
    type -> rope theta dict (default config.rope_parameters)."""
    cfg = model.config
    F = torch.nn.functional
    P = dict(model.named_parameters())
    B, S = ids.shape
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    d = H // nh
    window = cfg.local_attention // 2 if window is None else window

    def lin(x, name):
        return F.linear(x, P[name + ".weight"], P.get(name + ".bias"))

    def norm(x, name):
        return F.layer_norm(x, (H,), P[name + ".weight"], P.get(name + ".bias"), cfg.norm_eps)

    act = {"gelu": lambda x: F.gelu(x), "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}
    x = norm(P["model.embeddings.tok_embeddings.weight"][ids], "model.embeddings.norm")
    pos = torch.arange(S, dtype=torch.float64)
    near = (pos[:, None] - pos[None, :]).abs() <= window
    real_key = mask.bool()[:, None, None, :]
    for i, kind in enumerate(cfg.layer_types):
        pre = f"model.layers.{i}."
        theta = (thetas or {}).get(kind, cfg.rope_parameters[kind]["rope_theta"])
        angle = pos[:, None] / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # [S, d/2]

        def rope(t):
            if rotation == "half":  # (t_i, t_{i+d/2}) turned by angle_i
                a = torch.cat((angle, angle), -1)
                return t * a.cos() + torch.cat((-t[..., d // 2:], t[..., :d // 2]), -1) * a.sin()
            if rotation == "interleaved":  # (t_{2i}, t_{2i+1}) turned by angle_i
                a = angle.repeat_interleave(2, -1)
                turned = torch.stack((-t[..., 1::2], t[..., 0::2]), -1).flatten(-2)
                return t * a.cos() + turned * a.sin()
            return t

        h = x if i == 0 else norm(x, pre + "attn_norm")
        q, k, v = lin(h, pre + "attn.Wqkv").view(B, S, 3, nh, d).permute(2, 0, 3, 1, 4)
        scores = rope(q) @ rope(k).transpose(-1, -2) / math.sqrt(d)
        allowed = real_key & (near if kind == "sliding_attention" else True)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, H)
        x = x + lin(a, pre + "attn.Wo")
        inp, gate = lin(norm(x, pre + "mlp_norm"), pre + "mlp.Wi").chunk(2, dim=-1)
        x = x + lin(act[cfg.hidden_activation](inp) * gate, pre + "mlp.Wo")
    x = norm(x, "model.final_norm")
    if cfg.classifier_pooling == "cls":
        pooled = x[:, 0]
    else:
        m = mask.to(x.dtype)[..., None]
        pooled = (x * m).sum(1) / m.sum(1)
    head = norm(act[cfg.classifier_activation](lin(pooled, "head.dense")), "head.norm")
    return lin(head, "classifier")


def check_modernbert(model, batch, logits):
    """What the ModernBERT fixture must exercise, asserted on the float64 model (inside
    modernbert_float64) and its logits for the batch."""
    cfg = model.config
    ids, mask = batch["input_ids"], batch["attention_mask"]
    seq = ids.shape[1]
    w = cfg.local_attention // 2
    assert seq > 2 * w + 1, f"a band of {2 * w + 1} keys cuts nothing at {seq} tokens"
    assert not (ids[mask.bool()] == cfg.pad_token_id).any(), "a real token holds the pad id"
    assert (ids[~mask.bool()] == cfg.pad_token_id).all(), "padding without the pad id"
    with torch.no_grad():
        # The description in FAMILIES.md gives the same logits.
        diff = (modernbert_reference(model, ids, mask) - logits).abs().max().item()
        assert diff < 1e-12, f"the written-out ModernBERT differs from transformers' by {diff:.3e}"
        # Eager attention weights: zero beyond the band (and on padding) in sliding layers,
        # and some weight there in the global ones.
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        pos = torch.arange(seq)
        far = (pos[:, None] - pos[None, :]).abs() > w
        real_q = mask.bool()[:, None, :, None]
        for i, (kind, att) in enumerate(zip(cfg.layer_types, out.attentions)):
            beyond = att.masked_select(far & real_q)
            pad_keys = att.masked_select(~mask.bool()[:, None, None, :] & real_q)
            assert (pad_keys == 0).all(), f"layer {i}: weight on padding keys"
            if kind == "sliding_attention":
                assert (beyond == 0).all(), f"layer {i} ({kind}): weight beyond the band"
            else:
                assert beyond.abs().max() > 1e-3, f"layer {i} ({kind}): no weight beyond the band"
        # The band changes the logits: the same weights with a band as wide as the row differ,
        # and the written-out model with that wide band gives them too.
        wide_cfg = type(cfg).from_dict(dict(cfg.to_dict(), local_attention=2 * seq), attn_implementation="eager")
        wide = type(model)(wide_cfg).double().eval()
        wide.load_state_dict(model.state_dict())
        wide_logits = wide(**model_inputs(wide, batch)).logits
        change = (wide_logits - logits).abs().max().item()
        assert change > 1e-4, f"widening the band changes the logits by {change:.3e} only"
        assert (modernbert_reference(model, ids, mask, window=seq) - wide_logits).abs().max() < 1e-12
        # The rotary details move the logits beyond any tolerance of the parity tests.
        scale = logits.abs().max()
        moved = {"band": change / scale.item()}
        for what, kwargs in (("no rotary", dict(rotation="none")), ("interleaved pairs", dict(rotation="interleaved")),
                             ("one theta", dict(thetas={k: cfg.rope_parameters["full_attention"]["rope_theta"]
                                                        for k in ("full_attention", "sliding_attention")})),
                             ("thetas swapped", dict(thetas={
                                 "full_attention": cfg.rope_parameters["sliding_attention"]["rope_theta"],
                                 "sliding_attention": cfg.rope_parameters["full_attention"]["rope_theta"]}))):
            moved[what] = ((modernbert_reference(model, ids, mask, **kwargs) - logits).abs().max() / scale).item()
        # 1e-5 is the float32 parity tests' relative tolerance for the logits; bf16's are wider.
        weak = {k: v for k, v in moved.items() if v < (1e-4 if "theta" in k else 1e-3)}
        assert not weak, f"too small a change of the logits (relative) with {weak}"
    # transformers' own float32 forward (float32 rotary and softmax, eager and sdpa), outside
    # modernbert_float64, is the float64 result rounded.
    worst = {}
    with modernbert_float64_off():
        for impl in ("eager", "sdpa"):
            f32 = type(model)(type(cfg).from_dict(cfg.to_dict(), attn_implementation=impl)).eval()
            f32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
            with torch.no_grad():
                got = f32(**model_inputs(f32, batch)).logits.double()
            worst[impl] = ((got - logits).abs().max() / logits.abs().max()).item()
            assert worst[impl] < 1e-5, f"transformers' float32 {impl} forward differs by {worst[impl]:.3e} (relative)"
    # The pad row of the embeddings: random (ModernBERT's init overwrites nn.Embedding's zero
    # row), and no gradient reaches it (padding_idx).
    emb = model.model.embeddings.tok_embeddings
    assert emb.padding_idx == cfg.pad_token_id and emb.weight[cfg.pad_token_id].abs().max() > 0
    return (f"band {2 * w + 1} keys; written-out model within {diff:.1e}; relative change of the logits with "
            + ", ".join(f"{k} {v:.1e}" for k, v in moved.items())
            + f"; transformers' float32 eager/sdpa within {worst['eager']:.1e}/{worst['sdpa']:.1e} relative")


@contextlib.contextmanager
def modernbert_float64_off():
    """transformers' own ModernBERT functions for the duration, inside modernbert_float64."""
    mb = modeling_modernbert
    patched = mb.eager_attention_forward, mb.apply_rotary_pos_emb, mb.ModernBertRotaryEmbedding.forward
    mb.eager_attention_forward, mb.apply_rotary_pos_emb, mb.ModernBertRotaryEmbedding.forward = ORIGINAL_MODERNBERT
    try:
        yield
    finally:
        mb.eager_attention_forward, mb.apply_rotary_pos_emb, mb.ModernBertRotaryEmbedding.forward = patched


ORIGINAL_MODERNBERT = (modeling_modernbert.eager_attention_forward, modeling_modernbert.apply_rotary_pos_emb,
                       modeling_modernbert.ModernBertRotaryEmbedding.forward)


def model_inputs(model, batch):
    """The batch less the fields the model's forward does not take (DistilBERT: token_type_ids)."""
    accepted = inspect.signature(model.forward).parameters
    return {k: v for k, v in batch.items() if k in accepted}


def as_saved(v):
    return (v.float() if v.is_floating_point() else v).contiguous()


def decay_names(model):
    # Trainer's own grouping (needs accelerate, as Trainer does).
    args = TrainingArguments(output_dir="/tmp/hone_fixture_trainer", report_to="none", **ARGS)
    trainer = Trainer(model=model, args=args)
    return set(trainer.get_decay_parameter_names(model))


def check_reload(case_dir, batch, want_logits, **load_kwargs):
    """The saved directory, loaded the way a user would, gives the logits of the fixture."""
    model, info = AutoModelForSequenceClassification.from_pretrained(case_dir, dtype=torch.float32,
                                                                     output_loading_info=True, **load_kwargs)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"{case_dir}: loading info {bad}"
    model = model.double().eval()
    with torch.no_grad():
        logits = model(**model_inputs(model, batch)).logits
    diff = (logits - want_logits).abs().max().item()
    assert diff < 1e-10, f"{case_dir}: reloaded logits differ by {diff:.3e}"
    return type(model).__name__, diff


def make_case(out_dir, name, family, overrides):
    if family == "modernbert":
        with modernbert_float64():
            _make_case(out_dir, name, family, overrides)
    else:
        _make_case(out_dir, name, family, overrides)


def _make_case(out_dir, name, family, overrides):
    config_class, model_class, base, types_kind = FAMILIES[family]
    torch.manual_seed(0)
    cfg = config_class(**base, **overrides)
    model = model_class(cfg)
    # Non-trivial LayerNorm and bias values, so that their gradients are exercised.
    with torch.no_grad():
        if family == "modernbert":
            # ModernBERT's init (std 0.02) leaves the attention scores near zero: nearly uniform
            # attention, where the rotary angles move the logits by 1e-5 and the band by 1e-3.
            # Scores of order one make both count (check_modernbert asserts it).
            for pname, p in model.named_parameters():
                if pname.endswith("attn.Wqkv.weight"):
                    p.mul_(8.0)
        for pname, p in model.named_parameters():
            if ("LayerNorm" in pname or "layer_norm" in pname or pname.endswith("bias")
                    or (family == "modernbert" and "norm" in pname)):
                p.add_(0.1 * torch.randn_like(p))
    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    model.save_pretrained(case_dir, safe_serialization=True)

    model = model.double()
    model.eval()  # dropout is 0 anyway; eval keeps it out of the question
    names = [n for n, _ in model.named_parameters()]
    gen = torch.Generator().manual_seed(1)
    golden = {}

    def batch_of():
        return make_batch(gen, cfg.vocab_size, BATCH, SEQ, cfg.num_labels, cfg.pad_token_id, types_kind)

    batch = batch_of()
    out = model(**model_inputs(model, batch))
    out.loss.backward()
    ref_logits = out.logits.detach().clone()
    golden.update({k: as_saved(v) for k, v in batch.items()})
    golden["logits"] = out.logits.detach().float()
    golden["loss"] = out.loss.detach().float().reshape(1)
    for n, p in model.named_parameters():
        golden["grad." + n] = p.grad.detach().float().contiguous()
    if family == "modernbert":
        print(f"{name}: {check_modernbert(model, batch, ref_logits)}")
        pad_grad = model.model.embeddings.tok_embeddings.weight.grad[cfg.pad_token_id]
        assert (pad_grad == 0).all(), "the pad row of the embeddings has a gradient"
    model.zero_grad(set_to_none=True)

    decay = decay_names(model)
    groups = [
        {"params": [p for n, p in model.named_parameters() if n in decay], "weight_decay": ARGS["weight_decay"]},
        {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=ARGS["learning_rate"], betas=(ARGS["adam_beta1"], ARGS["adam_beta2"]),
                            eps=ARGS["adam_epsilon"])
    from transformers import get_scheduler
    sched = get_scheduler("linear", opt, num_warmup_steps=ARGS["warmup_steps"], num_training_steps=STEPS)
    losses, norms, lrs = [], [], []
    for k in range(STEPS):
        b = batch_of()
        for f, v in b.items():
            golden[f"train.{f}.{k}"] = as_saved(v)
        loss = model(**model_inputs(model, b)).loss
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), ARGS["max_grad_norm"])))
        lrs.append(sched.get_last_lr()[0])
        losses.append(float(loss))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    golden["train.loss"] = torch.tensor(losses, dtype=torch.float32)
    golden["train.grad_norm"] = torch.tensor(norms, dtype=torch.float32)
    golden["train.lr"] = torch.tensor(lrs, dtype=torch.float32)
    for n, p in model.named_parameters():
        golden["final." + n] = p.detach().float().contiguous()
    save_file(golden, os.path.join(case_dir, "golden.safetensors"))
    with open(os.path.join(case_dir, "train_args.json"), "w") as f:
        json.dump(dict(ARGS, decay_parameters=sorted(decay), parameters=names), f, indent=1)
    print(f"{name}: loss {float(golden['loss'][0]):.6f}, train losses {losses}, grad norms {norms}, lrs {lrs}")
    if family == "modernbert":  # config.json names no attention implementation: eager, and the default
        for impl in ("eager", None):
            kwargs = {"attn_implementation": impl} if impl else {}
            cls, diff = check_reload(case_dir, batch, ref_logits, **kwargs)
            print(f"{name}: reloaded as {cls} ({impl or 'default attention'}) by AutoModelForSequenceClassification, "
                  f"logits within {diff:.1e}")
        return
    cls, diff = check_reload(case_dir, batch, ref_logits)
    print(f"{name}: reloaded as {cls} by AutoModelForSequenceClassification, logits within {diff:.1e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", nargs="?", default="tests/fixtures")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated cases to write (default: all of {','.join(CASES)})")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {','.join(unknown)}; known: {','.join(CASES)}")
    import transformers
    print("transformers", transformers.__version__, "torch", torch.__version__)
    for name in cases:
        family, overrides = CASES[name]
        make_case(args.out_dir, name, family, overrides)


if __name__ == "__main__":
    main()

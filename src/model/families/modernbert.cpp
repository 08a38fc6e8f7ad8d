// ModernBERT (ModernBertForSequenceClassification): LayerNorms before the blocks (none
// before the first layer's attention) and one after the last layer, no biases by default,
// rotary positions instead of a position table, one fused Wqkv projection, a GeGLU
// feed-forward layer, local (sliding window) attention in the layers config.json's
// layer_types names, and a head of dense, activation and LayerNorm on the first token or
// on the mean of the attended tokens.
#include "hone/family.h"

namespace hone {

const ModelFamily& modernbert_family() {
  static const ModelFamily f = [] {
    ModelFamily f;
    f.model_type = "modernbert";
    f.architecture = "ModernBertForSequenceClassification";
    f.base = "model";
    f.embeddings = "model.embeddings";
    f.embedding_norm = "norm";
    f.word_table = "tok_embeddings";
    f.layer_prefix = "model.layers";
    f.layer = {"attn.Wqkv", "", "", "attn.Wo", "attn_norm", "mlp.Wi", "mlp.Wo", "mlp_norm"};
    f.token_types = false;
    f.positions = PositionIds::Rotary;
    f.norm = NormPlacement::Pre;
    f.final_norm = "model.final_norm";
    f.gated_ffn = true;
    f.depth_scaled_init = true;
    f.head = {"head.dense", "classifier", HeadActivation::Config, false, "head.norm"};
    f.renamed_fields = {{"hidden_activation", "hidden_act"},
                        {"norm_eps", "layer_norm_eps"},
                        {"mlp_dropout", "hidden_dropout_prob"},
                        {"attention_dropout", "attention_probs_dropout_prob"}};
    f.absent_fields = {"type_vocab_size", "position_embedding_type"};
    f.fields = {"norm_bias",       "attention_bias",        "mlp_bias",      "classifier_bias",
                "classifier_pooling", "classifier_activation", "local_attention", "layer_types",
                "rope_parameters", "embedding_dropout",     "global_attn_every_n_layers", "global_rope_theta",
                "local_rope_theta"};
    // ModernBertConfig's defaults (transformers 5), under its names.
    f.defaults = {{"vocab_size", 50368},       {"hidden_size", 768},         {"intermediate_size", 1152},
                  {"num_hidden_layers", 22},   {"num_attention_heads", 12},  {"hidden_activation", "gelu"},
                  {"max_position_embeddings", 8192}, {"norm_eps", 1e-5},     {"pad_token_id", 50283},
                  {"bos_token_id", 50281},     {"eos_token_id", 50282},      {"cls_token_id", 50281},
                  {"sep_token_id", 50282},     {"attention_dropout", 0.0},   {"mlp_dropout", 0.0},
                  {"embedding_dropout", 0.0},  {"classifier_dropout", 0.0},  {"local_attention", 128},
                  {"classifier_pooling", "cls"}, {"classifier_activation", "gelu"}, {"norm_bias", false},
                  {"attention_bias", false},   {"mlp_bias", false},          {"classifier_bias", false}};
    return f;
  }();
  return f;
}

}  // namespace hone

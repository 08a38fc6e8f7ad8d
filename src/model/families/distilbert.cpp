// DistilBERT (DistilBertForSequenceClassification): BERT's post-LayerNorm layers under
// other names ("distilbert.transformer.layer.N.attention.q_lin", "sa_layer_norm", "ffn.lin1"),
// no token types, no dropout after the attention's output projection, LayerNorm eps fixed
// at 1e-12, and a head of pre_classifier, ReLU, dropout (seq_classif_dropout), classifier.
// Its config.json names the fields its own way (dim, n_layers, hidden_dim, ...).
#include "hone/family.h"

namespace hone {

const ModelFamily& distilbert_family() {
  static const ModelFamily f = [] {
    ModelFamily f;
    f.model_type = "distilbert";
    f.architecture = "DistilBertForSequenceClassification";
    f.base = "distilbert";
    f.embeddings = "distilbert.embeddings";
    f.embedding_norm = "LayerNorm";
    f.layer_prefix = "distilbert.transformer.layer";
    f.layer = {"attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin",
               "sa_layer_norm",   "ffn.lin1",        "ffn.lin2",        "output_layer_norm"};
    f.token_types = false;
      f.attention_output_dropout = false;
    f.head = {"pre_classifier", "classifier", HeadActivation::Relu, false, ""};
    f.renamed_fields = {{"dim", "hidden_size"},
                        {"n_layers", "num_hidden_layers"},
                        {"n_heads", "num_attention_heads"},
                        {"hidden_dim", "intermediate_size"},
                        {"activation", "hidden_act"},
                        {"dropout", "hidden_dropout_prob"},
                        {"attention_dropout", "attention_probs_dropout_prob"},
                        {"seq_classif_dropout", "classifier_dropout"}};
    f.absent_fields = {"type_vocab_size", "layer_norm_eps", "position_embedding_type"};
    f.defaults = {{"n_layers", 6},          {"n_heads", 12},      {"dim", 768},
                  {"hidden_dim", 3072},     {"qa_dropout", 0.1},  {"seq_classif_dropout", 0.2},
                  {"sinusoidal_pos_embds", false}};
    f.required = {{"sinusoidal_pos_embds", false}};  // fixed sinusoidal positions: not implemented
    return f;
  }();
  return f;
}

}  // namespace hone

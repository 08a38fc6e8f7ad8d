// BERT (transformers' BertForSequenceClassification): the family the others are told
// apart from. Its head is the pooler (dense and tanh on [CLS]) and a dropout before the
// classifier; ModelConfig's fields and defaults are BertConfig's.
#include "hone/family.h"

namespace hone {

const LayerNames& bert_layer_names() {
  static const LayerNames names{"attention.self.query", "attention.self.key", "attention.self.value",
                                "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
                                "output.dense", "output.LayerNorm"};
  return names;
}

const ModelFamily& bert_family() {
  static const ModelFamily f = [] {
    ModelFamily f;
    f.model_type = "bert";
    f.architecture = "BertForSequenceClassification";
    f.base = "bert";
    f.embeddings = "bert.embeddings";
    f.embedding_norm = "LayerNorm";
    f.layer_prefix = "bert.encoder.layer";
    f.layer = bert_layer_names();
    f.head = {"bert.pooler.dense", "classifier", HeadActivation::Tanh, false, ""};
    return f;
  }();
  return f;
}

}  // namespace hone

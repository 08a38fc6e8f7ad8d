// RoBERTa (RobertaForSequenceClassification): BERT's layers under "roberta.", position ids
// that count from after the padding index (so max_position_embeddings is 514 for 512
// tokens), one token type in its checkpoints (its tokenizers give none), and a head of its own on <s>:
// dropout, dense, tanh, dropout, out_proj.
#include "hone/family.h"

namespace hone {

const LayerNames& bert_layer_names();

// XLM-RoBERTa is RoBERTa's model under another model_type and vocabulary.
ModelFamily roberta_like(const char* model_type, const char* architecture) {
  ModelFamily f;
  f.model_type = model_type;
  f.architecture = architecture;
  f.base = "roberta";
  f.embeddings = "roberta.embeddings";
  f.embedding_norm = "LayerNorm";
  f.layer_prefix = "roberta.encoder.layer";
  f.layer = bert_layer_names();
  f.positions = PositionIds::AfterPadding;
  f.head = {"classifier.dense", "classifier.out_proj", HeadActivation::Tanh, true, ""};
  f.position_table_last = true;
  f.defaults = {{"pad_token_id", 1}, {"bos_token_id", 0}, {"eos_token_id", 2}};
  return f;
}

const ModelFamily& roberta_family() {
  static const ModelFamily f = [] {
    ModelFamily f = roberta_like("roberta", "RobertaForSequenceClassification");
    f.defaults["vocab_size"] = 50265;
    return f;
  }();
  return f;
}

}  // namespace hone

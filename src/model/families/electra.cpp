// ELECTRA's discriminator (ElectraForSequenceClassification): BERT's layers under
// "electra.", embeddings of embedding_size projected to hidden_size by
// "electra.embeddings_project" when the two differ (electra-small: 128 -> 256), no pooler,
// and a head of dropout, dense, exact GELU, dropout, out_proj on [CLS].
#include "hone/family.h"

namespace hone {

const LayerNames& bert_layer_names();

const ModelFamily& electra_family() {
  static const ModelFamily f = [] {
    ModelFamily f;
    f.model_type = "electra";
    f.architecture = "ElectraForSequenceClassification";
    f.base = "electra";
    f.embeddings = "electra.embeddings";
    f.embedding_norm = "LayerNorm";
    f.layer_prefix = "electra.encoder.layer";
    f.layer = bert_layer_names();
    f.projection = "electra.embeddings_project";
    f.head = {"classifier.dense", "classifier.out_proj", HeadActivation::Gelu, true, ""};
    f.defaults = {{"embedding_size", 128},
                  {"hidden_size", 256},
                  {"num_attention_heads", 4},
                  {"intermediate_size", 1024}};
    return f;
  }();
  return f;
}

}  // namespace hone

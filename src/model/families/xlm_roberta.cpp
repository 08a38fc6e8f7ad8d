// XLM-RoBERTa (XLMRobertaForSequenceClassification): RoBERTa's model and checkpoint names
// ("roberta.") under model_type "xlm-roberta", with a 250k SentencePiece vocabulary.
#include "hone/family.h"

namespace hone {

ModelFamily roberta_like(const char* model_type, const char* architecture);

const ModelFamily& xlm_roberta_family() {
  static const ModelFamily f = [] {
    ModelFamily f = roberta_like("xlm-roberta", "XLMRobertaForSequenceClassification");
    f.head_first = true;
    return f;
  }();
  return f;
}

}  // namespace hone

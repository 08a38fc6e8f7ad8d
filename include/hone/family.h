#pragma once
// Model families: the encoders that transformers names by config.json's model_type and
// that hone runs with one model (hone/model.h). BERT, RoBERTa, XLM-RoBERTa, DistilBERT
// and ELECTRA share its blocks (embeddings, post-LayerNorm attention and feed-forward
// layers, a classification head on the first token); a family says what differs: the
// parameters' names, the embeddings' inputs, the head, and the config.json fields.
// ModernBERT normalizes before its blocks instead, with rotary positions, a gated
// feed-forward layer and local attention in some layers, over the same ops.
// Each family is one file in src/model/families/, listed in src/model/families/families.cpp.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hone {

// Where each token's position embedding row comes from.
enum class PositionIds : uint8_t {
  Column,        // the token's column in its padded sequence (BERT)
  AfterPadding,  // pad_token_id + 1 + the count of non-padding tokens up to it, padding tokens pad_token_id (RoBERTa)
  Rotary,        // no position table: query and key turn by the token's column (ModernBERT)
};

// Where a layer normalizes. Post: LN(x + attention(x)), then LN(y + ffn(y)) (BERT). Pre:
// y = x + attention(LN(x)), out = y + ffn(LN(y)), with no LayerNorm before the first
// layer's attention (the embeddings end in one) and a final LayerNorm after the last
// layer (ModernBERT).
enum class NormPlacement : uint8_t { Post, Pre };

// Config: config.json's classifier_activation (ModernBERT).
enum class HeadActivation : uint8_t { Tanh, Gelu, Relu, Config };

// The names, under one layer's prefix, of the parameters of an encoder layer (each a
// Linear's or a LayerNorm's, with ".weight" and ".bias"). An empty key means one fused
// [3H, H] projection named by query (ModernBERT's Wqkv).
struct LayerNames {
  std::string query, key, value, attention_output, attention_norm, ffn_up, ffn_down, ffn_norm;
};

// The classification head on the pooled hidden state (the first token's, or with
// config.json's classifier_pooling "mean" the mean of the attended tokens'):
// [dropout] -> dense [H, H] -> activation -> [LayerNorm] -> dropout -> out [labels, H].
struct HeadSpec {
  std::string dense, out;  // full parameter names without ".weight"/".bias"
  HeadActivation activation = HeadActivation::Tanh;
  bool dropout_first = false;  // a dropout on the first token before the dense layer
  std::string norm;            // the LayerNorm after the activation (ModernBERT's); empty: none
};

struct ModelFamily {
  std::string model_type;    // config.json's
  std::string architecture;  // what transformers builds: "RobertaForSequenceClassification"
  std::string base;          // the encoder's prefix in checkpoints: "roberta"
  std::string embeddings;    // the embeddings' prefix: "roberta.embeddings"
  std::string embedding_norm;  // its LayerNorm, under that prefix: "LayerNorm"
  std::string word_table = "word_embeddings";  // the token table, under that prefix
  std::string layer_prefix;    // layer l is `layer_prefix` + "." + l: "roberta.encoder.layer"
  LayerNames layer;
  // token_type_embeddings (DistilBERT has none). Whether a batch has token types is the
  // tokenizer's to say (RoBERTa's give none: type 0 throughout).
  bool token_types = true;
  bool attention_output_dropout = true;  // dropout after the attention's output projection (not DistilBERT)
  PositionIds positions = PositionIds::Column;
  NormPlacement norm = NormPlacement::Post;
  std::string final_norm;   // Pre: the LayerNorm after the last layer ("model.final_norm")
  bool gated_ffn = false;   // the FFN's up projection is [2I, H]: input and gate of a GLU (GeGLU)
  // ModernBERT's initialisation: output projections (the attention's and the FFN's, the
  // head's dense layer) at initializer_range / sqrt(2 L), the classifier at H^-1/2.
  bool depth_scaled_init = false;
  std::string projection;  // Linear from embedding_size to hidden_size when they differ (ELECTRA); empty: none
  HeadSpec head;
  // transformers' parameter order, which saved checkpoints follow: RoBERTa declares the
  // position table after the embeddings' LayerNorm; XLM-RoBERTa its head before the encoder.
  bool position_table_last = false;
  bool head_first = false;
  // config.json: the family's field names that differ from BertConfig's (DistilBERT's
  // "dim" for hidden_size), as {file, hone}; the fields the family lacks, not written; and
  // transformers' class defaults where they differ from BertConfig's, under the file's names.
  std::vector<std::pair<std::string, std::string>> renamed_fields;
  std::vector<std::string> absent_fields;
  nlohmann::json defaults = nlohmann::json::object();
  // Fields the family has that hone does not implement, with the value hone runs: another
  // value is an error naming the field (DistilBERT's sinusoidal_pos_embds: false).
  nlohmann::json required = nlohmann::json::object();
  // config.json fields beyond BertConfig's that the family has (ModernBERT's biases,
  // pooling, local attention and rotary settings: hone/config.h); another family carries
  // such a field unread.
  std::vector<std::string> fields;

  // The name config.json gives hone's field `name`.
  std::string file_name(std::string_view name) const;
};

// The family of a model_type, or a hone::Error naming `source` and the families hone has.
const ModelFamily& find_family(std::string_view model_type, const std::string& source);
std::vector<std::string> family_names();  // model_types, in the registry's order

// The families, each defined in its own file under src/model/families/.
const ModelFamily& bert_family();
const ModelFamily& roberta_family();
const ModelFamily& xlm_roberta_family();
const ModelFamily& distilbert_family();
const ModelFamily& electra_family();
const ModelFamily& modernbert_family();

}  // namespace hone

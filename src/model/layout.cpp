// The parameters' layout in the flat buffers, as each family names and orders them
// (hone/model.h, hone/family.h).
#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "hone/model.h"

namespace hone {

ParamLayout::ParamLayout(const ModelConfig& c) {
  const ModelFamily& f = c.family();
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.embedding_width();
  const bool pre = f.norm == NormPlacement::Pre;
  int group = 0;
  auto add = [&](std::string name, Shape s, ParamKind kind, int64_t zero_row = -1, float init_std = 0.0f) {
    const bool decay = kind == ParamKind::Embedding || kind == ParamKind::Weight;
    entries_.push_back({std::move(name), s, 0, decay, group, kind, zero_row, init_std});
  };
  auto linear = [&](const std::string& p, int64_t out, int64_t in, bool bias = true, float init_std = 0.0f) {
    add(p + ".weight", {out, in}, ParamKind::Weight, -1, init_std);
    if (bias) add(p + ".bias", {out}, ParamKind::Bias);
  };
  auto norm = [&](const std::string& p, int64_t width) {
    add(p + ".weight", {width}, ParamKind::NormWeight);
    if (c.norm_bias) add(p + ".bias", {width}, ParamKind::NormBias);
  };
  // ModernBERT's scaled initialisation of the output projections and the classifier.
  const float out_std = f.depth_scaled_init ? c.initializer_range / std::sqrt(2.0f * float(c.num_hidden_layers)) : 0.0f;
  const float classifier_std = f.depth_scaled_init ? 1.0f / std::sqrt(float(H)) : 0.0f;
  // transformers' Embedding(padding_idx=pad_token_id): that row starts at zero.
  const int64_t pad = c.pad_token_id;
  const std::string emb = f.embeddings + ".";
  auto position_table = [&] {
    if (f.positions == PositionIds::Rotary) return;
    add(emb + "position_embeddings.weight", {c.max_position_embeddings, E}, ParamKind::Embedding,
        f.positions == PositionIds::AfterPadding ? pad : -1);
  };
  add(emb + f.word_table + ".weight", {c.vocab_size, E}, ParamKind::Embedding, pad);
  if (!f.position_table_last) position_table();
  if (f.token_types) add(emb + "token_type_embeddings.weight", {c.type_vocab_size, E}, ParamKind::Embedding);
  norm(emb + f.embedding_norm, E);
  if (f.position_table_last) position_table();
  if (c.projects_embeddings()) linear(f.projection, H, E);
  const LayerNames& n = f.layer;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    group = 1 + l;
    const std::string p = fmt::format("{}.{}.", f.layer_prefix, l);
    if (pre && l > 0) norm(p + n.attention_norm, H);
    if (n.key.empty()) {
      linear(p + n.query, 3 * H, H, c.attention_bias);
    } else {
      linear(p + n.query, H, H, c.attention_bias);
      linear(p + n.key, H, H, c.attention_bias);
      linear(p + n.value, H, H, c.attention_bias);
    }
    linear(p + n.attention_output, H, H, c.attention_bias, out_std);
    norm(p + (pre ? n.ffn_norm : n.attention_norm), H);
    linear(p + n.ffn_up, f.gated_ffn ? 2 * I : I, H, c.mlp_bias);
    linear(p + n.ffn_down, H, I, c.mlp_bias, out_std);
    if (!pre) norm(p + n.ffn_norm, H);
  }
  group = 1 + c.num_hidden_layers;
  const size_t encoder_entries = entries_.size();
  if (pre) norm(f.final_norm, H);  // the head's group: its gradient comes first in backward
  linear(f.head.dense, H, H, c.classifier_bias, out_std);
  if (!f.head.norm.empty()) norm(f.head.norm, H);
  linear(f.head.out, c.num_labels, H, true, classifier_std);
  // XLM-RoBERTa declares its head before the encoder; the final norm is the encoder's.
  if (f.head_first) std::rotate(entries_.begin(), entries_.begin() + encoder_entries, entries_.end());
  // Group by group; within a group the decayed parameters first, each in transformers' order.
  groups_.resize(size_t(group + 1));
  for (int k = 0; k <= group; ++k) {
    ParamGroup& g = groups_[size_t(k)];
    g.begin = count_;
    for (bool decay : {true, false}) {
      for (auto& e : entries_)
        if (e.group == k && e.decay == decay) {
          e.offset = count_;
          count_ += e.shape.numel();
        }
      if (decay) g.decayed_end = count_;
    }
    g.end = count_;
  }
  // The tables are group 0's first decayed parameters (word, then positions and types).
  for (const ParamEntry& e : entries_)
    if (e.kind == ParamKind::Embedding) tables_end_ = std::max(tables_end_, e.offset + e.shape.numel());
  for (const ParamEntry& e : entries_)
    HONE_CHECK(e.kind == ParamKind::Embedding || e.offset >= tables_end_, "{} lies among the embedding tables",
               e.name);
}

const ParamEntry* ParamLayout::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const ParamEntry& ParamLayout::at(const std::string& name) const {
  const ParamEntry* e = find(name);
  HONE_CHECK(e, "no parameter {}", name);
  return *e;
}

ParamLayout ParamLayout::shard(int first, int end) const {
  HONE_CHECK(0 <= first && first < end && end <= int(groups_.size()), "shard of groups [{}, {}) of {}", first, end,
             groups_.size());
  ParamLayout s;
  const int64_t base = groups_[size_t(first)].begin;
  for (const ParamEntry& e : entries_)
    if (e.group >= first && e.group < end) {
      ParamEntry r = e;
      r.offset -= base;
      r.group -= first;
      s.entries_.push_back(std::move(r));
    }
  for (int k = first; k < end; ++k) {
    const ParamGroup& g = groups_[size_t(k)];
    s.groups_.push_back({g.begin - base, g.decayed_end - base, g.end - base});
  }
  s.count_ = groups_[size_t(end - 1)].end - base;
  s.tables_end_ = first == 0 ? tables_end_ : 0;
  return s;
}

}  // namespace hone

#pragma once
// The small BERT of the GPU training tests and its batches.
#include <cstdint>
#include <random>
#include <vector>

#include "hone/config.h"

namespace hone::test {

// A model with BERT's head size (64), the shape the fused attention is built for.
inline ModelConfig small_bert(double dropout = 0) {
  ModelConfig c = *builtin_config("bert-tiny");
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.num_attention_heads = 2;
  c.intermediate_size = 256;
  c.num_hidden_layers = 2;
  c.max_position_embeddings = 64;
  c.hidden_dropout_prob = dropout;
  c.attention_probs_dropout_prob = dropout;
  return c;
}

// Sequences of random tokens after [CLS], right-padded to random lengths; label 1 sequences
// draw from the lower half of the vocabulary, label 0 from the upper: a task the tokens
// decide, which a small BERT learns in tens of steps.
struct TaskBatch {
  std::vector<int32_t> ids, mask, types;
  std::vector<float> labels;
};
inline TaskBatch task_batch(std::mt19937& g, int batch, int seq, int vocab) {
  TaskBatch b;
  std::uniform_int_distribution<int> low(5, vocab / 2 - 1), high(vocab / 2, vocab - 1), len(seq / 2, seq), coin(0, 1);
  for (int r = 0; r < batch; ++r) {
    const int n = len(g), label = coin(g);
    for (int t = 0; t < seq; ++t) {
      b.ids.push_back(t == 0 ? 2 : t >= n ? 0 : label ? low(g) : high(g));
      b.mask.push_back(t < n ? 1 : 0);
      b.types.push_back(0);
    }
    b.labels.push_back(float(label));
  }
  return b;
}

// Random tokens and random labels: a batch whose examples' gradients do not share one
// direction, for comparing the arithmetic of two precisions.
inline TaskBatch random_batch(std::mt19937& g, int batch, int seq, int vocab) {
  TaskBatch b;
  std::uniform_int_distribution<int> tok(5, vocab - 1), len(seq / 2, seq), coin(0, 1);
  for (int r = 0; r < batch; ++r) {
    const int n = len(g);
    for (int t = 0; t < seq; ++t) {
      b.ids.push_back(t == 0 ? 2 : t < n ? tok(g) : 0);
      b.mask.push_back(t < n ? 1 : 0);
      b.types.push_back(0);
    }
    b.labels.push_back(float(coin(g)));
  }
  return b;
}

}  // namespace hone::test

// Datasets, collation, the length-grouped order, the batch loader, text files and labels.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/data.h"
#include "hone/error.h"
#include "hone/tokenizer.h"
#include "test_util.h"

namespace hone {
namespace {

using test::TempDir;
using namespace std::string_literals;

// The message of the hone::Error that f throws ("" and a test failure when none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no hone::Error thrown";
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "\"" << (text) << "\" lacks \"" << (part) << "\""

std::string write_file(const TempDir& dir, const std::string& name, const std::string& content) {
  const std::string path = dir.path + "/" + name;
  std::ofstream f(path, std::ios::binary);
  f << content;
  return path;
}

// Example i: lens[i] tokens i * 1000 + t + 1, token types t % 2, label i; optionally
// throwing at one index or slow.
class VecDataset final : public Dataset {
 public:
  VecDataset(std::vector<int> lens, int max_len, int32_t pad = 0) : lens_(std::move(lens)), max_(max_len), pad_(pad) {}
  int64_t size() const override { return int64_t(lens_.size()); }
  int max_seq_len() const override { return max_; }
  bool float_labels() const override { return false; }
  int32_t pad_id() const override { return pad_; }
  int example(int64_t i, int32_t* ids, int32_t* types, float* label) const override {
    if (i == throw_at) fail("bad example {}", i);
    if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    calls.fetch_add(1);
    const int n = lens_[size_t(i)];
    for (int t = 0; t < n; ++t) {
      ids[t] = int32_t(i * 1000 + t + 1);
      types[t] = t % 2;
    }
    *label = float(i);
    return n;
  }
  std::string description() const override { return "vec"; }

  int64_t throw_at = -1;
  int delay_us = 0;
  mutable std::atomic<int64_t> calls{0};

 private:
  std::vector<int> lens_;
  int max_;
  int32_t pad_;
};

// A batch with its own buffers of batch_size x max_len.
struct OwnedBatch {
  std::vector<int32_t> ids, mask, types;
  std::vector<float> labels;
  Batch b;
  OwnedBatch(int batch_size, int max_len)
      : ids(size_t(batch_size * max_len)), mask(ids.size()), types(ids.size()), labels(size_t(batch_size)) {
    b.ids = ids.data();
    b.mask = mask.data();
    b.types = types.data();
    b.labels = labels.data();
  }
};

void expect_same_batch(const Batch& got, const Batch& want, const std::string& what) {
  ASSERT_EQ(got.rows, want.rows) << what;
  ASSERT_EQ(got.seq, want.seq) << what;
  EXPECT_EQ(got.indices, want.indices) << what;
  const size_t n = size_t(got.rows) * size_t(got.seq);
  EXPECT_TRUE(std::equal(got.ids, got.ids + n, want.ids)) << what;
  EXPECT_TRUE(std::equal(got.mask, got.mask + n, want.mask)) << what;
  EXPECT_TRUE(std::equal(got.types, got.types + n, want.types)) << what;
  EXPECT_TRUE(std::equal(got.labels, got.labels + got.rows, want.labels)) << what;
}

std::vector<int> lengths_of(int64_t n, int lo, int hi, uint64_t salt) {
  std::vector<int> lens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) lens[size_t(i)] = lo + int((uint64_t(i) * 2654435761u + salt) % uint64_t(hi - lo + 1));
  return lens;
}

std::vector<std::vector<int64_t>> chunks(const std::vector<int64_t>& order, int batch_size) {
  std::vector<std::vector<int64_t>> out;
  for (size_t lo = 0; lo < order.size(); lo += size_t(batch_size))
    out.emplace_back(order.begin() + lo, order.begin() + std::min(order.size(), lo + size_t(batch_size)));
  return out;
}

// ---------------------------------------------------------------- collation

TEST(DataCollate, PadsToTheLongestRoundedUpToTheMultiple) {
  VecDataset d({3, 5, 2}, 32, /*pad=*/7);
  OwnedBatch ob(4, 32);
  collate(d, {2, 0, 1}, 8, ob.b);
  const Batch& b = ob.b;
  EXPECT_EQ(b.rows, 3);
  EXPECT_EQ(b.seq, 8);
  EXPECT_EQ(b.indices, (std::vector<int64_t>{2, 0, 1}));
  const int64_t idx[3] = {2, 0, 1};
  const int len[3] = {2, 3, 5};
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(b.labels[r], float(idx[r]));
    for (int t = 0; t < b.seq; ++t) {
      const int o = r * b.seq + t;
      if (t < len[r]) {
        EXPECT_EQ(b.ids[o], int32_t(idx[r] * 1000 + t + 1)) << r << "," << t;
        EXPECT_EQ(b.mask[o], 1);
        EXPECT_EQ(b.types[o], t % 2);
      } else {
        EXPECT_EQ(b.ids[o], 7) << r << "," << t;
        EXPECT_EQ(b.mask[o], 0);
        EXPECT_EQ(b.types[o], 0);
      }
    }
  }
}

TEST(DataCollate, CapsAtMaxSeqLenAndHonoursNoMultiple) {
  VecDataset d({10, 9, 1}, 10);
  OwnedBatch ob(3, 10);
  collate(d, {1, 2}, 8, ob.b);
  EXPECT_EQ(ob.b.seq, 10);  // 9 rounds to 16, capped at 10
  EXPECT_EQ(ob.b.mask[9], 0);
  EXPECT_EQ(ob.b.mask[8], 1);
  EXPECT_EQ(ob.b.ids[10], 2001);
  EXPECT_EQ(ob.b.mask[11], 0);
  collate(d, {0, 1, 2}, 8, ob.b);
  EXPECT_EQ(ob.b.seq, 10);
  EXPECT_EQ(std::accumulate(ob.mask.begin(), ob.mask.begin() + 30, 0), 20);
  collate(d, {2, 1}, 0, ob.b);
  EXPECT_EQ(ob.b.seq, 9);
  collate(d, {2}, 1, ob.b);
  EXPECT_EQ(ob.b.seq, 1);
  EXPECT_EQ(ob.b.ids[0], 2001);
  collate(d, {2}, 8, ob.b);
  EXPECT_EQ(ob.b.seq, 8);
}

TEST(DataCollate, SyntheticRowsAreFull) {
  SyntheticDataset d(6, 12, 3, false);
  OwnedBatch ob(4, 12);
  collate(d, {5, 1, 3}, 8, ob.b);
  EXPECT_EQ(ob.b.seq, 12);
  EXPECT_TRUE(std::all_of(ob.mask.begin(), ob.mask.begin() + 36, [](int32_t m) { return m == 1; }));
  std::vector<int32_t> ids(12), types(12);
  float label;
  d.example(3, ids.data(), types.data(), &label);
  EXPECT_TRUE(std::equal(ids.begin(), ids.end(), ob.b.ids + 24));
}

TEST(DataCollate, DefaultLengthGoesThroughExample) {
  VecDataset d({4, 0, 17}, 20);
  EXPECT_EQ(d.length(0), 4);
  EXPECT_EQ(d.length(1), 0);
  EXPECT_EQ(d.length(2), 17);
  EXPECT_EQ(d.calls.load(), 3);
}

// ---------------------------------------------------------------- length-grouped order

TEST(DataOrder, LengthGroupedIsADeterministicPermutation) {
  const std::vector<int> lens = lengths_of(1000, 1, 300, 17);
  const auto a = length_grouped_order(lens, 4, 42, 0);
  const auto b = length_grouped_order(lens, 4, 42, 0);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, length_grouped_order(lens, 4, 42, 1));
  EXPECT_NE(a, length_grouped_order(lens, 4, 43, 0));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(lens.size());
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
}

TEST(DataOrder, LongestFirstAndMegabatchesSorted) {
  for (int n : {1000, 37, 5}) {
    for (uint64_t seed : {1ull, 2ull, 3ull}) {
      const std::vector<int> lens = lengths_of(n, 1, 300, seed * 7);
      const int bs = 4;
      const auto o = length_grouped_order(lens, bs, seed, 5);
      ASSERT_EQ(o.size(), size_t(n));
      const int longest = *std::max_element(lens.begin(), lens.end());
      EXPECT_EQ(lens[size_t(o[0])], longest) << n;
      // Megabatches of min(n / (4 bs), 50) batches, at least one, each sorted longest
      // first but for the one element swapped with the front.
      const int mega = std::clamp(n / (4 * bs), 1, 50) * bs;
      int out_of_order = 0;
      for (int k = 0; k + 1 < n; ++k)
        if ((k + 1) % mega != 0 && lens[size_t(o[size_t(k + 1)])] > lens[size_t(o[size_t(k)])]) ++out_of_order;
      EXPECT_LE(out_of_order, 1) << n;
      // So batches hold similar lengths: far less spread than in a shuffled order.
      if (n == 1000) {
        auto spread = [&](const std::vector<int64_t>& order) {
          int64_t s = 0;
          for (size_t lo = 0; lo < order.size(); lo += size_t(bs)) {
            int mn = 1 << 30, mx = 0;
            for (size_t k = lo; k < std::min(order.size(), lo + size_t(bs)); ++k) {
              mn = std::min(mn, lens[size_t(order[k])]);
              mx = std::max(mx, lens[size_t(order[k])]);
            }
            s += mx - mn;
          }
          return s;
        };
        EXPECT_LT(spread(o) * 10, spread(epoch_order(n, seed, 5)));
      }
    }
  }
  EXPECT_TRUE(length_grouped_order({}, 4, 1, 0).empty());
  EXPECT_EQ(length_grouped_order({3}, 4, 1, 0), (std::vector<int64_t>{0}));
}

// ---------------------------------------------------------------- loader

class LoaderWorkers : public ::testing::TestWithParam<int> {};

TEST_P(LoaderWorkers, YieldsTheBatchesInOrder) {
  const int workers = GetParam();
  const int bs = 5, max_len = 40;
  VecDataset d(lengths_of(103, 1, 37, 5), max_len, 3);
  const auto batches = chunks(epoch_order(d.size(), 9, 0), bs);  // the last one partial
  CpuBackend be;
  for (bool pin : {true, false}) {
    LoaderOptions o;
    o.num_workers = workers;
    o.pin_memory = pin;
    o.batch_size = bs;
    o.pad_to_multiple_of = 8;
    BatchLoader loader(d, batches, o, be);
    OwnedBatch want(bs, max_len);
    size_t k = 0;
    while (const Batch* b = loader.next()) {
      ASSERT_LT(k, batches.size());
      collate(d, batches[k], 8, want.b);
      expect_same_batch(*b, want.b, "batch " + std::to_string(k));
      // The batch stays as it is until the next call, while workers fill others.
      if (k % 7 == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        expect_same_batch(*b, want.b, "batch " + std::to_string(k) + " after a pause");
      }
      ++k;
    }
    EXPECT_EQ(k, batches.size());
    EXPECT_EQ(loader.next(), nullptr);
  }
}

TEST_P(LoaderWorkers, RethrowsAnExampleError) {
  const int workers = GetParam();
  VecDataset d(lengths_of(60, 1, 20, 1), 24);
  std::vector<int64_t> order(60);
  std::iota(order.begin(), order.end(), 0);
  const auto batches = chunks(order, 4);
  d.throw_at = 4 * 6 + 2;  // in batch 6
  CpuBackend be;
  LoaderOptions o;
  o.num_workers = workers;
  o.batch_size = 4;
  BatchLoader loader(d, batches, o, be);
  OwnedBatch want(4, 24);
  for (size_t k = 0; k < 6; ++k) {
    const Batch* b = loader.next();
    ASSERT_NE(b, nullptr);
    collate(d, batches[k], 8, want.b);
    expect_same_batch(*b, want.b, "batch " + std::to_string(k));
  }
  EXPECT_CONTAINS(error_of([&] { loader.next(); }), "bad example 26");
  EXPECT_CONTAINS(error_of([&] { loader.next(); }), "bad example 26");  // and stays failed
}

TEST_P(LoaderWorkers, StopsCleanlyWhenAbandoned) {
  const int workers = GetParam();
  VecDataset d(lengths_of(400, 1, 30, 2), 32);
  d.delay_us = 200;
  std::vector<int64_t> order(400);
  std::iota(order.begin(), order.end(), 0);
  const auto batches = chunks(order, 8);
  CpuBackend be;
  LoaderOptions o;
  o.num_workers = workers;
  o.batch_size = 8;
  const auto t0 = std::chrono::steady_clock::now();
  { BatchLoader never_used(d, batches, o, be); }
  {
    BatchLoader loader(d, batches, o, be);
    ASSERT_NE(loader.next(), nullptr);
    ASSERT_NE(loader.next(), nullptr);
  }
  // A consumer that throws mid-epoch unwinds through the loader.
  EXPECT_THROW(
      {
        BatchLoader loader(d, batches, o, be);
        int k = 0;
        while (loader.next())
          if (++k == 3) throw std::runtime_error("step failed");
      },
      std::runtime_error);
  // Nothing close to the 50 batches x 8 x 200 us of the whole epoch was prepared.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_LT(d.calls.load(), 3 * 400);
}

INSTANTIATE_TEST_SUITE_P(Loader, LoaderWorkers, ::testing::Values(0, 1, 3),
                         [](const auto& info) { return std::to_string(info.param) + "_workers"; });

// Evaluation's examples made once: the same tokens, types, labels and lengths as the dataset
// gives, each example asked for exactly once, across chunks; an example's error is the
// construction's error, not a crash in the parallel loop.
TEST(PreparedDataset, HoldsEveryExampleAsTheDatasetGivesIt) {
  // Rows of up to 1024 tokens make chunks of 2048 examples: 9000 span five, some empty.
  VecDataset d(lengths_of(9000, 0, 24, 5), 1024);
  const PreparedDataset p(d);
  EXPECT_EQ(d.calls.load(), 9000);
  ASSERT_EQ(p.size(), d.size());
  EXPECT_EQ(p.max_seq_len(), 1024);
  EXPECT_EQ(p.description(), "vec");
  std::vector<int32_t> ids(1024), types(1024), want_ids(1024), want_types(1024);
  for (int64_t i = 0; i < d.size(); ++i) {
    float label = -1, want_label = -2;
    const int n = p.example(i, ids.data(), types.data(), &label);
    const int want = d.example(i, want_ids.data(), want_types.data(), &want_label);
    ASSERT_EQ(n, want) << i;
    ASSERT_EQ(p.length(i), want) << i;
    ASSERT_EQ(label, want_label) << i;
    ASSERT_TRUE(std::equal(ids.begin(), ids.begin() + n, want_ids.begin())) << i;
    ASSERT_TRUE(std::equal(types.begin(), types.begin() + n, want_types.begin())) << i;
  }
  d.throw_at = 5000;
  EXPECT_CONTAINS(error_of([&] { PreparedDataset bad(d); }), "bad example 5000");
}

TEST(LoaderEdge, NoBatchesAndOneExample) {
  VecDataset d({5}, 8);
  CpuBackend be;
  for (int workers : {0, 2}) {
    LoaderOptions o;
    o.num_workers = workers;
    o.batch_size = 1;
    BatchLoader empty(d, {}, o, be);
    EXPECT_EQ(empty.next(), nullptr);
    BatchLoader one(d, {{0}}, o, be);
    const Batch* b = one.next();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->rows, 1);
    EXPECT_EQ(b->seq, 8);
    EXPECT_EQ(one.next(), nullptr);
    EXPECT_EQ(one.next(), nullptr);
  }
}

// ---------------------------------------------------------------- text files

TextColumns columns(std::string text, std::string pair = "", std::string label = "label") {
  TextColumns c;
  c.text = std::move(text);
  c.text_pair = std::move(pair);
  c.label = std::move(label);
  return c;
}

TEST(TextTable, JsonLinesWithEveryLabelType) {
  TempDir dir;
  const std::string path = write_file(dir,
                                      "train.jsonl",
                                      "\xEF\xBB\xBF{\"sentence\": \"a b\", \"label\": \"pos\", \"extra\": [1]}\n"
                                      "\n"
                                      "  {\"label\": 3, \"sentence\": \"caf\\u00e9\"}\r\n"
                                      "{\"sentence\": \"x\", \"label\": 0.25}\n"
                                      "{\"sentence\": \"y\", \"label\": 2.0}\n"
                                      "{\"sentence\": \"z\", \"label\": -1e21}\n"
                                      "{\"sentence\": \"w\", \"label\": true}\n"
                                      "   \n"
                                      "{\"sentence\": \"\", \"label\": 18446744073709551615}");
  const TextTable t = read_text_table(path, columns("sentence"), true);
  EXPECT_EQ(t.path, path);
  EXPECT_EQ(t.text, (std::vector<std::string>{"a b", "caf\xC3\xA9", "x", "y", "z", "w", ""}));
  EXPECT_EQ(t.labels,
            (std::vector<std::string>{"pos", "3", "0.25", "2.0", "-1e+21", "true", "18446744073709551615"}));
  EXPECT_EQ(t.line, (std::vector<int64_t>{1, 3, 4, 5, 6, 7, 9}));
  EXPECT_TRUE(t.text_pair.empty());
  // Without labels the label column may be absent.
  const TextTable u = read_text_table(write_file(dir, "test.json", "{\"s\": \"q\"}\n"), columns("s"), false);
  EXPECT_EQ(u.text, (std::vector<std::string>{"q"}));
  EXPECT_TRUE(u.labels.empty());
}

TEST(TextTable, JsonLinesPairs) {
  TempDir dir;
  const std::string path = write_file(dir, "p.jsonl",
                                      "{\"premise\": \"p1\", \"hypothesis\": \"h1\", \"label\": \"entailment\"}\n"
                                      "{\"premise\": \"p2\", \"hypothesis\": \"h2\", \"label\": \"neutral\"}\n");
  const TextTable t = read_text_table(path, columns("premise", "hypothesis"), true);
  EXPECT_EQ(t.text, (std::vector<std::string>{"p1", "p2"}));
  EXPECT_EQ(t.text_pair, (std::vector<std::string>{"h1", "h2"}));
  EXPECT_EQ(t.labels, (std::vector<std::string>{"entailment", "neutral"}));
}

TEST(TextTable, JsonLinesErrorsNameTheLine) {
  TempDir dir;
  const std::string ok = "{\"sentence\": \"fine\", \"label\": 1}\n";
  auto err = [&](const std::string& bad_line, bool labels = true) {
    const std::string path = write_file(dir, "e.jsonl", ok + ok + bad_line + "\n" + ok);
    return error_of([&] { read_text_table(path, columns("sentence"), labels); });
  };
  std::string e = err("{\"sentence\": \"x\", \"label\": 1");
  EXPECT_CONTAINS(e, "e.jsonl:3:");
  EXPECT_CONTAINS(e, "not valid JSON");
  e = err("[\"x\", 1]");
  EXPECT_CONTAINS(e, "e.jsonl:3:");
  EXPECT_CONTAINS(e, "JSON object");
  e = err("{\"text\": \"x\", \"label\": 1}");
  EXPECT_CONTAINS(e, "e.jsonl:3:");
  EXPECT_CONTAINS(e, "\"sentence\"");
  EXPECT_CONTAINS(e, "\"text\"");  // what the line has
  e = err("{\"sentence\": \"x\"}");
  EXPECT_CONTAINS(e, "e.jsonl:3:");
  EXPECT_CONTAINS(e, "\"label\"");
  e = err("{\"sentence\": 5, \"label\": 1}");
  EXPECT_CONTAINS(e, "e.jsonl:3:");
  EXPECT_CONTAINS(e, "not a string");
  e = err("{\"sentence\": \"x\", \"label\": null}");
  EXPECT_CONTAINS(e, "e.jsonl:3:");
  EXPECT_CONTAINS(e, "null");
  e = err("{\"sentence\": \"x\", \"label\": [1]}");
  EXPECT_CONTAINS(e, "e.jsonl:3:");
  e = err("{\"sentence\": \"\xFF\", \"label\": 1}");  // invalid UTF-8
  EXPECT_CONTAINS(e, "e.jsonl:3:");
  // The label is not read when not required.
  EXPECT_EQ(read_text_table(write_file(dir, "n.jsonl", ok + "{\"sentence\": \"x\", \"label\": null}\n"),
                            columns("sentence"), false)
                .text.size(),
            2u);
}

TEST(TextTable, AnErrorFarDownIsStillAnError) {
  TempDir dir;
  std::string csv = "sentence,label\n";
  for (int i = 2; i < 1000; ++i) csv += "row " + std::to_string(i) + ",1\n";
  csv += "broken,1,extra\n";
  for (int i = 0; i < 10; ++i) csv += "more,0\n";
  EXPECT_CONTAINS(error_of([&] { read_text_table(write_file(dir, "big.csv", csv), columns("sentence"), true); }),
                  "big.csv:1000:");
  std::string jsonl;
  for (int i = 1; i < 1000; ++i) jsonl += "{\"sentence\": \"s\", \"label\": 0}\n";
  jsonl += "{\"sentence\": \"s\", \"label\": 0\n";
  EXPECT_CONTAINS(error_of([&] { read_text_table(write_file(dir, "big.jsonl", jsonl), columns("sentence"), true); }),
                  "big.jsonl:1000:");
}

TEST(TextTable, CsvQuotingNewlinesAndBom) {
  TempDir dir;
  const std::string path = write_file(dir, "train.csv",
                                      "\xEF\xBB\xBFidx,sentence,label\r\n"
                                      "0,\"a, \"\"quoted\"\" one\",pos\r\n"
                                      "1,\"two\nlines\",neg\r\n"
                                      "\r\n"
                                      "2,plain \"inner\" quotes,3\r\n"
                                      "3,,pos\n"
                                      "4,\"\",1.5");
  const TextTable t = read_text_table(path, columns("sentence"), true);
  EXPECT_EQ(t.text, (std::vector<std::string>{"a, \"quoted\" one", "two\nlines", "plain \"inner\" quotes", "", ""}));
  EXPECT_EQ(t.labels, (std::vector<std::string>{"pos", "neg", "3", "pos", "1.5"}));
  EXPECT_EQ(t.line, (std::vector<int64_t>{2, 3, 6, 7, 8}));
}

TEST(TextTable, TsvPairsWithQuotes) {
  TempDir dir;
  const std::string path = write_file(dir, "dev.TSV",
                                      "question\tsentence\tlabel\n"
                                      "what?\t\"tab\there\"\tnot_entailment\n"
                                      "\"multi\nline\"\tcomma, fine\tentailment\n"
                                      "q3\ts3\tentailment\n");
  const TextTable t = read_text_table(path, columns("question", "sentence"), true);
  EXPECT_EQ(t.text, (std::vector<std::string>{"what?", "multi\nline", "q3"}));
  EXPECT_EQ(t.text_pair, (std::vector<std::string>{"tab\there", "comma, fine", "s3"}));
  EXPECT_EQ(t.labels, (std::vector<std::string>{"not_entailment", "entailment", "entailment"}));
  EXPECT_EQ(t.line, (std::vector<int64_t>{2, 3, 5}));
}

TEST(TextTable, CsvErrorsNameTheLine) {
  TempDir dir;
  auto err = [&](const std::string& content, const TextColumns& c = columns("sentence"), bool labels = true) {
    return error_of([&] { read_text_table(write_file(dir, "e.csv", content), c, labels); });
  };
  std::string e = err("sentence,label\na,1\nb,2,3\n");
  EXPECT_CONTAINS(e, "e.csv:3:");
  EXPECT_CONTAINS(e, "3 fields");
  e = err("sentence,label\na,1\n\"b\nc\",1\nd\n");
  EXPECT_CONTAINS(e, "e.csv:5:");
  e = err("sentence,label\na,1\n\"never closed,1\nb,2\n");
  EXPECT_CONTAINS(e, "e.csv:3:");
  EXPECT_CONTAINS(e, "never closed");
  e = err("sentence,label\na,1\n\"closed\"x,1\n");
  EXPECT_CONTAINS(e, "e.csv:3:");
  EXPECT_CONTAINS(e, "closing quote");
  e = err("text,label\na,1\n");
  EXPECT_CONTAINS(e, "e.csv:1:");
  EXPECT_CONTAINS(e, "\"sentence\"");
  EXPECT_CONTAINS(e, "\"text\"");
  e = err("sentence,y\na,1\n");
  EXPECT_CONTAINS(e, "\"label\"");
  e = err("sentence,label\na,1\n", columns("sentence", "pair"));
  EXPECT_CONTAINS(e, "\"pair\"");
  e = err("sentence,label\na,1\nb,\n");
  EXPECT_CONTAINS(e, "e.csv:3:");
  EXPECT_CONTAINS(e, "empty");
  e = err("sentence,sentence,label\na,b,1\n");
  EXPECT_CONTAINS(e, "twice");
  EXPECT_CONTAINS(err("sentence,label\n"), "no rows");
  EXPECT_CONTAINS(err(""), "no rows");
  EXPECT_CONTAINS(err("\xEF\xBB\xBF\n\n"), "no rows");
  // Without labels a missing label column is fine.
  EXPECT_EQ(read_text_table(write_file(dir, "n.csv", "sentence\nx\n"), columns("sentence"), false).text.size(), 1u);
}

// A NUL byte is no text (Python's csv module: "line contains NUL"): an error naming the
// line of the byte, the column by number and name, and the byte in the field.
TEST(TextTable, CsvNulByteNamesTheLineAndColumn) {
  TempDir dir;
  auto err = [&](const std::string& name, const std::string& content, const TextColumns& c = columns("sentence")) {
    return error_of([&] { read_text_table(write_file(dir, name, content), c, true); });
  };
  std::string e = err("nul.csv", "id,sentence,label\n1,fine,pos\n2,the fi\0lm,neg\n"s);
  EXPECT_CONTAINS(e, "nul.csv:3:");
  EXPECT_CONTAINS(e, "column 2 (\"sentence\")");
  EXPECT_CONTAINS(e, "byte 7 of the field");
  EXPECT_CONTAINS(e, "NUL byte");
  // In a quoted field over two lines: the line of the byte, not the line the row starts on.
  e = err("nul.tsv", "sentence\tlabel\n\"two\nli\0nes\"\tpos\n"s);
  EXPECT_CONTAINS(e, "nul.tsv:3:");
  EXPECT_CONTAINS(e, "column 1 (\"sentence\")");
  // In the label and in the pair.
  e = err("label.csv", "sentence,label\na,pos\nb,n\0g\n"s);
  EXPECT_CONTAINS(e, "label.csv:3:");
  EXPECT_CONTAINS(e, "column 2 (\"label\")");
  e = err("pair.csv", "sentence,label,b\na,pos,\0\n"s, columns("sentence", "b"));
  EXPECT_CONTAINS(e, "pair.csv:2:");
  EXPECT_CONTAINS(e, "column 3 (\"b\")");
  // A UTF-16 file says what it is.
  e = err("u16.csv", "\xFF\xFEs\0e\0n\0"s);
  EXPECT_CONTAINS(e, "u16.csv:");
  EXPECT_CONTAINS(e, "UTF-16");
}

TEST(TextTable, InvalidUtf8NamesTheLineAndColumn) {
  TempDir dir;
  auto err = [&](const std::string& name, const std::string& content, const TextColumns& c = columns("sentence")) {
    return error_of([&] { read_text_table(write_file(dir, name, content), c, true); });
  };
  // Latin-1 "café" on line 4, after a row that spans lines 2 and 3.
  std::string e = err("latin1.csv", "sentence,label\n\"two\nlines\",pos\ncaf\xE9,neg\n");
  EXPECT_CONTAINS(e, "latin1.csv:4:");
  EXPECT_CONTAINS(e, "column 1 (\"sentence\")");
  EXPECT_CONTAINS(e, "invalid UTF-8");
  EXPECT_CONTAINS(e, "0xe9");
  EXPECT_CONTAINS(e, "byte 4 of the field");
  // A surrogate, an overlong form and a truncated sequence, as the tokenizer rejects them.
  for (const std::string& bad : {std::string("\xED\xA0\x80"), std::string("\xC0\xAF"), std::string("ab\xC3")}) {
    e = err("bad.tsv", "x\tsentence\tlabel\n1\tok\tpos\n2\t" + bad + "\tneg\n");
    EXPECT_CONTAINS(e, "bad.tsv:3:");
    EXPECT_CONTAINS(e, "column 2 (\"sentence\")");
    EXPECT_CONTAINS(e, "invalid UTF-8");
  }
  // In the header.
  e = err("header.csv", "sentence,lab\xFF\n");
  EXPECT_CONTAINS(e, "header.csv:1:");
  EXPECT_CONTAINS(e, "column 2 of the header");
  // A column the run does not read is not checked; valid multi-byte text is fine.
  const TextTable t = read_text_table(
      write_file(dir, "ok.csv", "note,sentence,label\n\xFF,caf\xC3\xA9 \xF0\x9F\x98\x80,pos\n"), columns("sentence"),
      true);
  EXPECT_EQ(t.text, (std::vector<std::string>{"caf\xC3\xA9 \xF0\x9F\x98\x80"}));
  // JSON Lines: the line, and the byte in it.
  e = err("latin1.jsonl", "{\"sentence\": \"ok\", \"label\": 1}\n{\"sentence\": \"caf\xE9\", \"label\": 1}\n");
  EXPECT_CONTAINS(e, "latin1.jsonl:2:");
  EXPECT_CONTAINS(e, "byte 18 of the line");
  EXPECT_CONTAINS(e, "invalid UTF-8");
  e = err("nul.jsonl", "{\"sentence\": \"a\0\", \"label\": 1}\n"s);
  EXPECT_CONTAINS(e, "nul.jsonl:1:");
  EXPECT_CONTAINS(e, "NUL byte");
}

TEST(TextTable, FileErrors) {
  TempDir dir;
  EXPECT_CONTAINS(error_of([&] { read_text_table(dir.path + "/missing.csv", columns("sentence"), true); }),
                  "missing.csv");
  const std::string txt = write_file(dir, "data.txt", "hello\n");
  const std::string e = error_of([&] { read_text_table(txt, columns("sentence"), true); });
  EXPECT_CONTAINS(e, "data.txt");
  EXPECT_CONTAINS(e, ".jsonl");
  EXPECT_CONTAINS(e, ".csv");
  EXPECT_CONTAINS(e, ".tsv");
  EXPECT_CONTAINS(error_of([&] { read_text_table(write_file(dir, "empty.jsonl", "\n \n"), columns("s"), true); }),
                  "no rows");
}

// ---------------------------------------------------------------- labels

TextTable labels_table(std::vector<std::string> labels) {
  TextTable t;
  t.path = "train.jsonl";
  t.labels = std::move(labels);
  t.text.assign(t.labels.size(), "x");
  for (size_t i = 0; i < t.labels.size(); ++i) t.line.push_back(int64_t(i) + 1);
  return t;
}

TEST(Labels, StringsAreSorted) {
  const LabelSpace s = LabelSpace::infer(labels_table({"neutral", "entailment", "contradiction", "neutral"}));
  EXPECT_FALSE(s.regression);
  EXPECT_EQ(s.names, (std::vector<std::string>{"contradiction", "entailment", "neutral"}));
  EXPECT_EQ(s.encode("entailment", "x"), 1.0f);
  const std::string e = error_of([&] { s.encode("maybe", "dev.csv:7"); });
  EXPECT_CONTAINS(e, "dev.csv:7");
  EXPECT_CONTAINS(e, "\"maybe\"");
  EXPECT_CONTAINS(e, "\"neutral\"");
  // Booleans as read from JSON sort as run_glue's [False, True].
  EXPECT_EQ(LabelSpace::infer(labels_table({"true", "false"})).names, (std::vector<std::string>{"false", "true"}));
}

// A column of names with a stray number (or numbers with a stray name) is not three
// classes: an error naming the line of the first value of the rarer kind, and both kinds.
TEST(Labels, NamesMixedWithNumbersAreAnError) {
  TextTable t = labels_table({"neg", "pos", "1", "neg", "2"});
  t.label_column = "label";
  std::string e = error_of([&] { LabelSpace::infer(t); });
  EXPECT_CONTAINS(e, "train.jsonl:3:");
  EXPECT_CONTAINS(e, "\"1\" is a number");
  EXPECT_CONTAINS(e, "column \"label\" holds class names");
  EXPECT_CONTAINS(e, "\"neg\" on line 1");
  EXPECT_CONTAINS(e, "3 of the 5 rows");
  // Mostly numbers: the name is the odd one, wherever it is.
  e = error_of([&] { LabelSpace::infer(labels_table({"pos", "0", "1", "0"})); });
  EXPECT_CONTAINS(e, "train.jsonl:1:");
  EXPECT_CONTAINS(e, "\"pos\" is a class name");
  EXPECT_CONTAINS(e, "holds numbers");
  EXPECT_CONTAINS(e, "\"0\" on line 2");
  // Floats count as numbers; on a tie the later kind is the odd one.
  e = error_of([&] { LabelSpace::infer(labels_table({"0.5", "high"})); });
  EXPECT_CONTAINS(e, "train.jsonl:2:");
  EXPECT_CONTAINS(e, "\"high\"");
  EXPECT_CONTAINS(e, "\"0.5\"");
  // Booleans from JSON are names, not numbers.
  EXPECT_CONTAINS(error_of([&] { LabelSpace::infer(labels_table({"true", "false", "1"})); }), "train.jsonl:3:");
}

// One class leaves a classifier nothing to learn (and a one-output head is a regression in
// transformers): an error naming the file, the column and the class; unless the model is
// a regression and the labels are numbers, which are then its targets.
TEST(Labels, OneClassIsAnErrorUnlessTheModelIsARegression) {
  TextTable t = labels_table({"pos", "pos", "pos"});
  t.label_column = "sentiment";
  std::string e = error_of([&] { LabelSpace::infer(t); });
  EXPECT_CONTAINS(e, "train.jsonl:");
  EXPECT_CONTAINS(e, "column \"sentiment\"");
  EXPECT_CONTAINS(e, "\"pos\"");
  EXPECT_CONTAINS(e, "one class");
  EXPECT_CONTAINS(error_of([&] { LabelSpace::infer(t, true); }), "one class");  // names are no regression targets
  // Integers too: all "1" would otherwise make ids 0 and 1 with no example of 0.
  for (const char* v : {"1", "0", "7"}) {
    e = error_of([&] { LabelSpace::infer(labels_table({v, v})); });
    EXPECT_CONTAINS(e, "one class");
    EXPECT_CONTAINS(e, "regression");  // how to make it one
    const LabelSpace r = LabelSpace::infer(labels_table({v, v}), true);
    EXPECT_TRUE(r.regression) << v;
    EXPECT_EQ(r.encode(v, "x"), std::stof(v));
  }
  // Floats are a regression anyway, one value or many.
  EXPECT_TRUE(LabelSpace::infer(labels_table({"2.5", "2.5"})).regression);
  // Two classes with a regression model stay a classification (as run_glue decides from the data).
  EXPECT_FALSE(LabelSpace::infer(labels_table({"0", "1"}), true).regression);
}

TEST(Labels, IntegersKeepTheirValues) {
  const LabelSpace s = LabelSpace::infer(labels_table({"1", "0", "2", "1"}));
  EXPECT_FALSE(s.regression);
  EXPECT_EQ(s.names, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(s.encode("2", "x"), 2.0f);
  EXPECT_EQ(s.encode("+1", "x"), 1.0f);
  EXPECT_EQ(s.encode("01", "x"), 1.0f);
  EXPECT_CONTAINS(error_of([&] { s.encode("3", "dev.jsonl:2"); }), "dev.jsonl:2");
  EXPECT_CONTAINS(error_of([&] { s.encode("1.0", "dev.jsonl:2"); }), "unknown label");
  // A class the training set lacks keeps its id.
  EXPECT_EQ(LabelSpace::infer(labels_table({"0", "2", "2"})).names, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(LabelSpace::infer(labels_table({"5", "1", "3"})).names,
            (std::vector<std::string>{"0", "1", "2", "3", "4", "5"}));
  // Negative or sparse integers are sorted by value.
  const LabelSpace neg = LabelSpace::infer(labels_table({"1", "-1", "10"}));
  EXPECT_EQ(neg.names, (std::vector<std::string>{"-1", "1", "10"}));
  EXPECT_EQ(neg.encode("-1", "x"), 0.0f);
  EXPECT_EQ(neg.encode("10", "x"), 2.0f);
  EXPECT_EQ(LabelSpace::infer(labels_table({"0", "1000000"})).names, (std::vector<std::string>{"0", "1000000"}));
}

TEST(Labels, FloatsMakeARegression) {
  const LabelSpace s = LabelSpace::infer(labels_table({"3.8", "5", "0.0", "-1e-3"}));
  EXPECT_TRUE(s.regression);
  EXPECT_TRUE(s.names.empty());
  EXPECT_FLOAT_EQ(s.encode("3.8", "x"), 3.8f);
  EXPECT_FLOAT_EQ(s.encode("4", "x"), 4.0f);
  EXPECT_FLOAT_EQ(s.encode("-1e-3", "x"), -0.001f);
  const std::string e = error_of([&] { s.encode("high", "dev.tsv:9"); });
  EXPECT_CONTAINS(e, "dev.tsv:9");
  EXPECT_CONTAINS(e, "regression");
  EXPECT_CONTAINS(error_of([&] { s.encode("nan", "dev.tsv:3"); }), "dev.tsv:3");
  EXPECT_TRUE(LabelSpace::infer(labels_table({"1.0", "0.0"})).regression);  // written as floats: float64 in pandas
  EXPECT_CONTAINS(error_of([&] { LabelSpace::infer(labels_table({"1.5", "inf"})); }), "train.jsonl:2");
  TextTable none = labels_table({});
  EXPECT_CONTAINS(error_of([&] { LabelSpace::infer(none); }), "no labels");
}

// ---------------------------------------------------------------- text datasets

// A vocabulary with [PAD] at id 1, so that padding by the tokenizer's id shows.
constexpr const char* kVocab =
    "[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\nsat\non\nmat\ndog\n##s\n.\n";

std::shared_ptr<const Tokenizer> tiny_tokenizer(const TempDir& dir) {
  write_file(dir, "vocab.txt", kVocab);
  return std::make_shared<const Tokenizer>(Tokenizer::load(dir.path));
}

TEST(DataText, TokenizesOnDemandWithLabels) {
  TempDir dir;
  auto tok = tiny_tokenizer(dir);
  const std::string path = write_file(dir, "train.jsonl",
                                      "{\"sentence\": \"The dogs sat.\", \"label\": \"pos\"}\n"
                                      "{\"sentence\": \"the cat sat on the mat\", \"label\": \"neg\"}\n"
                                      "{\"sentence\": \"cat\", \"label\": \"pos\"}\n");
  TextTable table = read_text_table(path, columns("sentence"), true);
  const LabelSpace labels = LabelSpace::infer(table);
  TextDataset d(std::move(table), tok, labels, 6, true);
  EXPECT_EQ(d.size(), 3);
  EXPECT_EQ(d.max_seq_len(), 6);
  EXPECT_FALSE(d.float_labels());
  EXPECT_EQ(d.pad_id(), 1);
  EXPECT_CONTAINS(d.description(), "train.jsonl");
  std::vector<int32_t> ids(6), types(6);
  float label = -1;
  ASSERT_EQ(d.example(0, ids.data(), types.data(), &label), 6);  // 7 tokens truncated to 6
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 5, 10, 11, 7, 3}));
  EXPECT_EQ(label, 1.0f);  // "pos" after "neg"
  EXPECT_EQ(d.length(2), 3);
  ASSERT_EQ(d.example(2, ids.data(), types.data(), &label), 3);
  EXPECT_EQ(label, 1.0f);
  d.example(1, ids.data(), types.data(), &label);
  EXPECT_EQ(label, 0.0f);

  OwnedBatch ob(3, 6);
  collate(d, {2, 0}, 8, ob.b);
  EXPECT_EQ(ob.b.seq, 6);  // capped at max_seq_length
  EXPECT_EQ(std::vector<int32_t>(ob.ids.begin(), ob.ids.begin() + 6), (std::vector<int32_t>{2, 6, 3, 1, 1, 1}));
  EXPECT_EQ(std::vector<int32_t>(ob.mask.begin(), ob.mask.begin() + 6), (std::vector<int32_t>{1, 1, 1, 0, 0, 0}));

  // The same through the loader's workers.
  CpuBackend be;
  LoaderOptions o;
  o.num_workers = 2;
  o.batch_size = 2;
  BatchLoader loader(d, {{2, 0}, {1}}, o, be);
  const Batch* b = loader.next();
  ASSERT_NE(b, nullptr);
  expect_same_batch(*b, ob.b, "loader");
  b = loader.next();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->rows, 1);
  EXPECT_EQ(loader.next(), nullptr);
}

TEST(DataText, PairsAndPrediction) {
  TempDir dir;
  auto tok = tiny_tokenizer(dir);
  const std::string path =
      write_file(dir, "test.tsv", "a\tb\tlabel\nthe cat\ton the mat\t0.5\nthe dog\tsat\t-1\n");
  TextTable table = read_text_table(path, columns("a", "b"), true);
  const LabelSpace labels = LabelSpace::infer(table);
  ASSERT_TRUE(labels.regression);
  {
    TextDataset d(table, tok, labels, 32, true);
    EXPECT_TRUE(d.float_labels());
    std::vector<int32_t> ids(32), types(32);
    float label = 0;
    ASSERT_EQ(d.example(0, ids.data(), types.data(), &label), 8);
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 8), (std::vector<int32_t>{2, 5, 6, 3, 8, 5, 9, 3}));
    EXPECT_EQ(std::vector<int32_t>(types.begin(), types.begin() + 8), (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1}));
    EXPECT_EQ(label, 0.5f);
    d.example(1, ids.data(), types.data(), &label);
    EXPECT_EQ(label, -1.0f);
  }
  // Prediction: no labels needed, all 0.
  TextDataset p(read_text_table(path, columns("a", "b"), false), tok, LabelSpace{}, 32, false);
  std::vector<int32_t> ids(32), types(32);
  float label = 7;
  p.example(1, ids.data(), types.data(), &label);
  EXPECT_EQ(label, 0.0f);
}

TEST(DataText, UnknownLabelNamesTheLine) {
  TempDir dir;
  auto tok = tiny_tokenizer(dir);
  const TextTable train = read_text_table(
      write_file(dir, "train.csv", "sentence,label\ncat,pos\ndog,neg\n"), columns("sentence"), true);
  const LabelSpace labels = LabelSpace::infer(train);
  TextTable dev = read_text_table(write_file(dir, "dev.csv", "sentence,label\ncat,pos\n\"the\ndog\",neutral\n"),
                                  columns("sentence"), true);
  const std::string e = error_of([&] { TextDataset(std::move(dev), tok, labels, 16, true); });
  EXPECT_CONTAINS(e, "dev.csv:3");
  EXPECT_CONTAINS(e, "\"neutral\"");
}

}  // namespace
}  // namespace hone

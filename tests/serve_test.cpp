// hone serve: the /predict API's parsing and answers, the batcher that runs concurrent
// requests together, and (with cpp-httplib) the server itself: its answers, its errors,
// 503 when overloaded, and a SIGTERM that still answers the request in flight.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "hone/serve.h"
#include "test_util.h"

#ifdef HONE_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace hone {
namespace {

int status_of(const std::string& body, int max_inputs = 4) {
  try {
    parse_predict_request(body, max_inputs);
    return 200;
  } catch (const ApiError& e) {
    return e.status();
  }
}

TEST(ServeApi, ReadsTextsPairsAndBatchesAsTeiDoes) {
  PredictRequest r = parse_predict_request(R"({"inputs": "a film"})", 4);
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_FALSE(r.batch);
  EXPECT_EQ(r.inputs[0].text, "a film");
  EXPECT_FALSE(r.inputs[0].pair);
  r = parse_predict_request(R"({"inputs": ["a film", "it was good"], "raw_scores": true})", 4);  // one pair
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_FALSE(r.batch);
  EXPECT_EQ(*r.inputs[0].pair, "it was good");
  EXPECT_TRUE(r.raw_scores);
  r = parse_predict_request(R"({"inputs": ["one", ["two", "three"], "four"], "truncate": true})", 4);
  ASSERT_EQ(r.inputs.size(), 3u);
  EXPECT_TRUE(r.batch);
  EXPECT_TRUE(r.truncate);
  EXPECT_EQ(*r.inputs[1].pair, "three");
  EXPECT_FALSE(r.inputs[2].pair);
}

TEST(ServeApi, BadRequestsGetTheirStatus) {
  EXPECT_EQ(status_of("not json"), 400);
  EXPECT_EQ(status_of("[1, 2]"), 400);
  EXPECT_EQ(status_of(R"({"input": "typo"})"), 400);
  EXPECT_EQ(status_of(R"({"inputs": 5})"), 400);
  EXPECT_EQ(status_of(R"({"inputs": ["a", 5, "c"]})"), 400);
  EXPECT_EQ(status_of(R"({"inputs": "a", "raw_scores": "yes"})"), 400);
  EXPECT_EQ(status_of(R"({"inputs": ""})"), 422);
  EXPECT_EQ(status_of(R"({"inputs": []})"), 422);
  EXPECT_EQ(status_of(R"({"inputs": ["a", ""]})"), 422);
  EXPECT_EQ(status_of(R"({"inputs": ["a", "b", "c", "d", "e"]})"), 413);
  EXPECT_EQ(status_of(R"({"inputs": ["a", "b", "c", "d"]})"), 200);
}

TEST(ServeApi, AnswersLabelsByScoreOrRawLogits) {
  PredictRequest r = parse_predict_request(R"({"inputs": "x"})", 4);
  const std::vector<std::string> labels = {"neg", "pos"};
  nlohmann::json j = nlohmann::json::parse(predict_response(r, {0.0f, std::log(3.0f)}, labels, false));
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["label"], "pos");
  EXPECT_NEAR(j[0]["score"].get<double>(), 0.75, 1e-7);
  EXPECT_EQ(j[1]["label"], "neg");
  EXPECT_NEAR(j[1]["score"].get<double>(), 0.25, 1e-7);
  r = parse_predict_request(R"({"inputs": ["x", "y", "z"], "raw_scores": true})", 4);
  j = nlohmann::json::parse(predict_response(r, {1, 2, 4, 3, -1, -2}, labels, false));
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[1][0]["label"], "neg");
  EXPECT_EQ(j[1][0]["score"].get<double>(), 4.0);
  EXPECT_EQ(j[2][1]["score"].get<double>(), -2.0);
  r = parse_predict_request(R"({"inputs": "x"})", 4);  // a regression: its value
  j = nlohmann::json::parse(predict_response(r, {2.5f}, {"LABEL_0"}, true));
  EXPECT_EQ(j[0]["score"].get<double>(), 2.5);
  EXPECT_THROW(predict_response(r, {std::nanf("")}, {"LABEL_0"}, true), ApiError);
}

Encoding encoding(int32_t id, int rows = 1) {
  Encoding e;
  e.ids.assign(size_t(rows), id);
  e.type_ids.assign(size_t(rows), 0);
  return e;
}

// The model here: each row's logit is its first token id.
void first_ids(const std::vector<const Encoding*>& rows, std::vector<float>& logits) {
  logits.clear();
  for (const Encoding* e : rows) logits.push_back(float(e->ids[0]));
}

TEST(ServeBatcher, RunsConcurrentRequestsTogetherAndAnswersEachItsOwn) {
  std::atomic<int> largest{0};
  Batcher b(
      [&](const std::vector<const Encoding*>& rows, std::vector<float>& logits) {
        largest = std::max(largest.load(), int(rows.size()));
        first_ids(rows, logits);
      },
      8, std::chrono::milliseconds(50), 64);
  std::vector<std::thread> clients;
  std::vector<float> got(16, -1);
  for (int i = 0; i < 16; ++i)
    clients.emplace_back([&, i] {
      std::vector<Encoding> rows;
      rows.push_back(encoding(i));
      got[size_t(i)] = b.submit(std::move(rows)).get()[0];
    });
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(got[size_t(i)], float(i));
  const Batcher::Stats s = b.stats();
  EXPECT_EQ(s.requests, 16);
  EXPECT_EQ(s.rows, 16);
  EXPECT_LT(s.batches, 16);  // some ran together
  EXPECT_LE(largest.load(), 8);
}

TEST(ServeBatcher, RefusesWhenFullRunsWhatIsQueuedOnStopAndPassesErrorsOn) {
  std::atomic<bool> release{false}, running{false};
  Batcher b(
      [&](const std::vector<const Encoding*>& rows, std::vector<float>& logits) {
        running = true;
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (rows[0]->ids[0] < 0) throw Error("the model failed");
        first_ids(rows, logits);
      },
      2, std::chrono::milliseconds(0), 4);
  auto one = [](int32_t id) {
    std::vector<Encoding> rows;
    rows.push_back(encoding(id));
    return rows;
  };
  std::future<std::vector<float>> first = b.submit(one(1));
  while (!running) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the first batch runs (and waits)
  std::vector<std::future<std::vector<float>>> queued;
  for (int i = 2; i < 6; ++i) queued.push_back(b.submit(one(i)));
  try {
    b.submit(one(9));
    FAIL() << "a fifth queued sequence was taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 503);
  }
  release = true;
  EXPECT_EQ(first.get()[0], 1.0f);
  std::future<std::vector<float>> failing = b.submit(one(-1));
  b.stop();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(queued[size_t(i)].get()[0], float(i + 2));
  EXPECT_THROW(failing.get(), Error);
  EXPECT_THROW(b.submit(one(1)), ApiError);
}

#ifdef HONE_HAVE_HTTPLIB

// A small trained classifier with its tokenizer, and `hone serve` on it in a child process.
class Served : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream v(dir_.path + "/vocab.txt");
    for (const char* w : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "good", "bad", "."})
      v << w << "\n";
    v.close();
    std::ofstream f(dir_.path + "/train.jsonl");
    for (int i = 0; i < 32; ++i)
      f << nlohmann::json{{"text", i % 2 ? "the film was good ." : "the film was bad ."}, {"label", i % 2 ? "pos" : "neg"}}
               .dump()
        << "\n";
    f.close();
    const test::CommandResult t =
        test::run_hone("train --model_name_or_path bert-tiny --tokenizer_name " + dir_.path + " --train_file " +
                       dir_.path + "/train.jsonl --text_column text --max_seq_length 16 --per_device_train_batch_size 8"
                       " --num_train_epochs 1 --save_strategy no --device cpu --output_dir " + dir_.path + "/model");
    ASSERT_EQ(t.code, 0) << t.out;
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Starts the server; returns its port (printed once it listens).
  int start(const std::string& flags) {
    log_ = dir_.path + "/serve.log";
    const std::string cmd = std::string(HONE_BINARY) + " serve --model_name_or_path " + dir_.path +
                            "/model --device cpu --max_seq_length 16 --port 0 " + flags + " > " + log_ + " 2>&1";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 600; ++i) {
      std::ifstream in(log_);
      const std::string text((std::istreambuf_iterator<char>(in)), {});
      const size_t at = text.find("listening on http://127.0.0.1:");
      if (at != std::string::npos) return std::stoi(text.substr(at + 30));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "the server did not start";
    return -1;
  }
  // SIGTERM, then the exit status and the log.
  std::pair<int, std::string> stop() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    std::ifstream in(log_);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
            std::string((std::istreambuf_iterator<char>(in)), {})};
  }
  test::TempDir dir_;
  std::string log_;
  pid_t pid_ = -1;
};

TEST_F(Served, AnswersPredictHealthAndInfoAndEachErrorItsStatus) {
  const int port = start("--per_device_eval_batch_size 4");
  ASSERT_GT(port, 0);
  httplib::Client c("127.0.0.1", port);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto info = c.Get("/info");
  ASSERT_TRUE(info);
  EXPECT_EQ(nlohmann::json::parse(info->body)["model_type"]["classifier"]["id2label"],
            (nlohmann::json{"neg", "pos"}));
  auto one = c.Post("/predict", R"({"inputs": "the film was good ."})", "application/json");
  ASSERT_TRUE(one);
  ASSERT_EQ(one->status, 200) << one->body;
  const nlohmann::json j = nlohmann::json::parse(one->body);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_NEAR(j[0]["score"].get<double>() + j[1]["score"].get<double>(), 1.0, 1e-6);
  // A batch of three answers as each alone does.
  auto batch = c.Post("/predict", R"({"inputs": ["the film was good .", ["the film", "was bad ."], "bad"]})",
                      "application/json");
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->status, 200) << batch->body;
  const nlohmann::json b = nlohmann::json::parse(batch->body);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0][0]["label"], j[0]["label"]);
  EXPECT_NEAR(b[0][0]["score"].get<double>(), j[0]["score"].get<double>(), 1e-5);
  for (const auto& [body, status] : std::vector<std::pair<std::string, int>>{
           {"not json", 400},
           {R"({"inputs": ""})", 422},
           {R"({"inputs": ["a", "b", "c", "d", "e"]})", 413},
           {R"({"inputs": "the the the the the the the the the the the the the the the the the"})", 413},
           {R"({"inputs": "the the the the the the the the the the the the the the the the the", "truncate": true})",
            200}}) {
    auto r = c.Post("/predict", body, "application/json");
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, status) << body << " -> " << r->body;
    if (status != 200) {
      EXPECT_TRUE(nlohmann::json::parse(r->body).contains("error")) << r->body;
    }
  }
  // A second server on the same port, and one on a model without trained weights: each a
  // clear error and exit code 1, before it listens.
  const test::CommandResult busy = test::run_hone("serve --model_name_or_path " + dir_.path +
                                                  "/model --device cpu --port " + std::to_string(port));
  EXPECT_EQ(busy.code, 1) << busy.out;
  EXPECT_NE(busy.out.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos) << busy.out;
  const test::CommandResult untrained =
      test::run_hone("serve --model_name_or_path bert-tiny --tokenizer_name " + dir_.path + " --device cpu --port 0");
  EXPECT_EQ(untrained.code, 1) << untrained.out;
  EXPECT_NE(untrained.out.find("serving needs trained weights"), std::string::npos) << untrained.out;
  const auto [code, log] = stop();
  EXPECT_EQ(code, 0) << log;
  EXPECT_NE(log.find("stopped by SIGTERM"), std::string::npos) << log;
}

// Overloaded: 503 at once, while an earlier request waits for its batch; SIGTERM comes
// meanwhile, and that request is still answered before the server exits.
TEST_F(Served, SaysOverloadedAndFinishesItsRequestsOnSigterm) {
  const int port = start("--per_device_eval_batch_size 4 --max_queued_sequences 4 --max_batch_delay_ms 1500");
  ASSERT_GT(port, 0);
  int waiting = 0;
  std::thread client([&] {  // 3 of the batch's 4 sequences: it waits the 1.5 s for more
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30);
    auto r = c.Post("/predict", R"({"inputs": ["the film", "was good", "."]})", "application/json");
    waiting = r ? r->status : -1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  httplib::Client c("127.0.0.1", port);
  // Two inputs (a list of two texts would be one pair): 3 + 2 sequences > 4.
  auto refused = c.Post("/predict", R"({"inputs": [["the film", "was bad"], "."]})", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503) << refused->body;
  EXPECT_EQ(nlohmann::json::parse(refused->body)["error_type"], "overloaded");
  const auto [code, log] = stop();
  client.join();
  EXPECT_EQ(waiting, 200);
  EXPECT_EQ(code, 0) << log;
  EXPECT_NE(log.find("stopped by SIGTERM; 1 requests answered, 3 sequences in 1 batches"), std::string::npos) << log;
}

#endif

}  // namespace
}  // namespace hone

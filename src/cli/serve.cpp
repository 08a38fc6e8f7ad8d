// `hone serve`: a trained classifier over HTTP, with text-embeddings-inference's /predict
// API, /health and /info, dynamic batching, 503 when overloaded, and on SIGTERM or Ctrl-C
// a shutdown that answers the requests already taken.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <future>
#include <limits>
#include <utility>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/report.h"
#include "cli/setup.h"
#include "cli/stop_signals.h"
#include "hone/serve.h"
#include "hone/trainer.h"

#ifdef HONE_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace hone::cli {

#ifndef HONE_HAVE_HTTPLIB

int serve_command(const TrainingArguments&, const ServeOptions&) {
  fail("this build of hone has no HTTP server: install Debian's libcpp-httplib-dev (tools/install-deps.sh) and "
       "build again");
}

#else

namespace {

// Ctrl-C and SIGTERM: the handler (in whichever thread the signal lands; libraries start
// threads of their own before main) writes the signal's number to a pipe that a thread of
// the server waits on.
int stop_pipe[2] = {-1, -1};

extern "C" void on_serve_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(stop_pipe[1], &b, 1);
}

void answer_error(httplib::Response& res, int status, const std::string& message) {
  const char* type = status == 503 ? "overloaded" : status >= 500 ? "backend" : "validation";
  res.status = status;
  res.set_content(nlohmann::json{{"error", message}, {"error_type", type}}.dump(), "application/json");
}

}  // namespace

int serve_command(const TrainingArguments& a, const ServeOptions& o) {
  std::future<void> prepared = prepare_gpu(a, 0, PreparedWork::Inference);
  RunInputs in = prepare_model(a);
  if (prepared.valid()) prepared.get();
  const ModelConfig& cfg = in.model.config;
  // Its products timed during the warm-up below, before it listens: no request waits for it.
  std::unique_ptr<Backend> be = make_backend(a, false, 0, true);
  const int max_batch = a.per_device_eval_batch_size;
  TrainingRun run(a, cfg, in.seq_len, *be, GradientMemory::Persistent, RunPhases{false, max_batch});
  {
    const ParamLayout& layout = run.model().layout();
    std::vector<float> host(size_t(layout.count()));
    const LoadReport r = load_weights(in.model.weights_path, cfg, layout, host.data(), a.seed);
    if (!r.initialized.empty())
      fail("{} lacks {} of the model's parameters (first: {}): it is not a fine-tuned model", in.model.weights_path,
           r.initialized.size(), r.initialized.front());
    run.write_weights(host.data());
  }
  // As text-embeddings-inference warms its model before it listens: the first requests would
  // otherwise pay for timing the products' candidates (bert-large bf16: tens of ms a size).
  const auto warm_start = std::chrono::steady_clock::now();
  if (const std::vector<int64_t> counts = run.warm_up_inference(); !counts.empty())
    fmt::print("warmed up: {} batches of {} to {} tokens in {:.2f} s\n", counts.size(), counts.front(), counts.back(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - warm_start).count());
  const int C = cfg.num_labels, seq_len = in.seq_len;
  const std::vector<std::string> labels =
      in.labels.regression ? std::vector<std::string>{cfg.id2label.empty() ? "LABEL_0" : cfg.id2label[0]}
                           : in.labels.names;
  HONE_CHECK(int(labels.size()) == C, "{} label names for {} outputs", labels.size(), C);

  // One batch: padded to its longest sequence (a multiple of 8), in the thread of the batcher.
  std::vector<int32_t> ids, mask, types;
  Batcher batcher(
      [&](const std::vector<const Encoding*>& rows, std::vector<float>& logits) {
        size_t longest = 1;
        for (const Encoding* e : rows) longest = std::max(longest, e->ids.size());
        const int seq = std::min(seq_len, int((longest + 7) / 8 * 8));
        const size_t n = rows.size() * size_t(seq);
        ids.assign(n, in.tokenizer->pad_id());
        mask.assign(n, 0);
        types.assign(n, 0);
        for (size_t r = 0; r < rows.size(); ++r) {
          std::copy(rows[r]->ids.begin(), rows[r]->ids.end(), ids.begin() + ptrdiff_t(r * seq));
          std::copy(rows[r]->type_ids.begin(), rows[r]->type_ids.end(), types.begin() + ptrdiff_t(r * seq));
          std::fill_n(mask.begin() + ptrdiff_t(r * seq), rows[r]->ids.size(), 1);
        }
        Batch b;
        b.rows = int(rows.size());
        b.seq = seq;
        b.ids = ids.data();
        b.mask = mask.data();
        b.types = types.data();
        logits.resize(rows.size() * size_t(C));
        run.infer(b, ForwardOutputs{logits.data()});
      },
      max_batch, std::chrono::microseconds(int64_t(o.max_batch_delay_ms * 1000)),
      std::max(max_batch, o.max_queued_sequences));

  httplib::Server server;
  server.set_payload_max_length(size_t(o.max_request_bytes));
  // A connection keeps its thread while it is kept alive, and a request's thread waits for its
  // batch: as many threads as connections served at once, so that none queues behind another.
  const int threads = o.max_concurrent_requests;
  server.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  // An answer's header and body leave in separate writes: with Nagle's algorithm the body
  // would wait for the client's delayed ACK of the header (40 ms).
  server.set_tcp_nodelay(true);
  // httplib closes a kept-alive connection after 5 requests by default: clients would
  // reconnect every 5 answers (and race the close). One idle for 5 s still goes (httplib's
  // default), which also bounds how long a stop waits for idle connections' threads.
  server.set_keep_alive_max_count(std::numeric_limits<size_t>::max());
  // SO_REUSEADDR alone: httplib's default adds SO_REUSEPORT, which lets a second server bind
  // the same port and share its connections instead of failing.
  server.set_socket_options([](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  const nlohmann::json info = {{"model_id", in.model.name},
                               {"model_type", {{"classifier", {{"id2label", labels}}}}},
                               {"max_input_length", seq_len},
                               {"max_client_batch_size", max_batch},
                               {"max_batch_delay_ms", o.max_batch_delay_ms},
                               {"device", be->name()},
                               {"version", "hone"}};
  server.Get("/info", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(info.dump(), "application/json");
  });
  server.Post("/predict", [&](const httplib::Request& req, httplib::Response& res) {
    try {
      const PredictRequest r = parse_predict_request(req.body, max_batch);
      std::vector<Encoding> rows;
      rows.reserve(r.inputs.size());
      for (size_t i = 0; i < r.inputs.size(); ++i) {
        const PredictInput& p = r.inputs[i];
        const std::string_view pair = p.pair ? std::string_view(*p.pair) : std::string_view{};
        try {
          rows.push_back(in.tokenizer->encode(p.text, p.pair ? &pair : nullptr, r.truncate ? seq_len : 0));
        } catch (const Error& e) {
          throw ApiError(422, fmt::format("input {}: {}", i, e.what()));
        }
        if (int(rows.back().ids.size()) > seq_len)
          throw ApiError(413, fmt::format("input {} has {} tokens; the model takes at most {} (send \"truncate\": "
                                          "true to cut it)", i, rows.back().ids.size(), seq_len));
      }
      const std::vector<float> logits = batcher.submit(std::move(rows)).get();
      res.set_content(predict_response(r, logits, labels, in.labels.regression), "application/json");
    } catch (const ApiError& e) {
      answer_error(res, e.status(), e.what());
    } catch (const std::exception& e) {
      answer_error(res, 500, e.what());
    }
  });

  const int port =
      o.port == 0 ? server.bind_to_any_port(o.host) : (server.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0) fail("cannot listen on {}:{} (in use, or not an address of this machine)", o.host, o.port);
  fmt::print("hone serve: {} ({} labels: {}) on {}, batches of up to {} sequences of {} tokens\n", in.model.name, C,
             fmt::join(labels, ", "), be->name(), max_batch, seq_len);
  fmt::print("listening on http://{}:{} (POST /predict, GET /health, GET /info); Ctrl-C or SIGTERM stops\n", o.host,
             port);
  std::fflush(stdout);
  // A signal (or the server's end) stops it: it takes no more connections and answers the
  // requests it has taken, whose batches the batcher still runs.
  if (::pipe(stop_pipe) != 0) fail("pipe: {}", std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_serve_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM})
    if (sigaction(sig, &sa, nullptr) != 0) fail("cannot install a handler for {}: {}", signal_name(sig), std::strerror(errno));
  std::atomic<int> stopped_by{0};
  std::thread waiter([&] {
    unsigned char b = 0;
    while (::read(stop_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    stopped_by = b;
    server.stop();
  });
  const bool ok = server.listen_after_bind();  // returns once stopped, after the requests in flight
  if (stopped_by == 0) on_serve_stop_signal(0);        // the waiter's wake-up, when the server ended by itself
  waiter.join();
  for (int sig : {SIGINT, SIGTERM}) std::signal(sig, SIG_DFL);
  for (int& fd : stop_pipe) ::close(std::exchange(fd, -1));
  if (!ok && stopped_by == 0) fail("the server on {}:{} stopped unexpectedly", o.host, port);
  batcher.stop();
  const Batcher::Stats s = batcher.stats();
  fmt::print("hone serve: stopped by {}; {} requests answered, {} sequences in {} batches\n", signal_name(stopped_by),
             s.requests, s.rows, s.batches);
  return 0;
}

#endif

}  // namespace hone::cli

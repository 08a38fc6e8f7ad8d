// The JSON of /predict, as text-embeddings-inference shapes it.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "hone/serve.h"

namespace hone {

namespace {

// A text, or a [text, text_pair] pair; anything else is the client's error.
PredictInput parse_input(const nlohmann::json& j, const std::string& where) {
  PredictInput in;
  if (j.is_string()) {
    in.text = j.get<std::string>();
  } else if (j.is_array() && j.size() == 2 && j[0].is_string() && j[1].is_string()) {
    in.text = j[0].get<std::string>();
    in.pair = j[1].get<std::string>();
  } else {
    throw ApiError(400, fmt::format("{}: expected a text or a [text, text_pair] pair, got {}", where,
                                    j.dump().substr(0, 80)));
  }
  if (in.text.empty() || (in.pair && in.pair->empty()))
    throw ApiError(422, fmt::format("{}: an empty text", where));
  return in;
}

}  // namespace

PredictRequest parse_predict_request(const std::string& body, int max_inputs) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    throw ApiError(400, fmt::format("the body is not JSON: {}", e.what()));
  }
  if (!j.is_object()) throw ApiError(400, "the body is not a JSON object with \"inputs\"");
  PredictRequest r;
  for (const auto& [key, value] : j.items()) {
    if (key == "inputs") continue;
    if (key != "raw_scores" && key != "truncate" && key != "truncation_direction")
      throw ApiError(400, fmt::format("unknown field \"{}\" (known: inputs, raw_scores, truncate)", key));
    if (key == "truncation_direction") {
      if (value != "Right" && value != "right")
        throw ApiError(422, "truncation_direction: only \"Right\" (BERT keeps the start of a text)");
      continue;
    }
    if (!value.is_boolean()) throw ApiError(400, fmt::format("\"{}\" must be true or false", key));
    (key == "raw_scores" ? r.raw_scores : r.truncate) = value.get<bool>();
  }
  if (!j.contains("inputs")) throw ApiError(400, "no \"inputs\" field");
  const nlohmann::json& in = j["inputs"];
  // A list of two texts is one pair, as in TEI; any other list is a batch.
  if (in.is_string() || (in.is_array() && in.size() == 2 && in[0].is_string() && in[1].is_string())) {
    r.inputs.push_back(parse_input(in, "inputs"));
    return r;
  }
  if (!in.is_array()) throw ApiError(400, "\"inputs\": expected a text, a pair or a list of them");
  if (in.empty()) throw ApiError(422, "\"inputs\" is an empty list");
  if (int(in.size()) > max_inputs)
    throw ApiError(413, fmt::format("{} inputs in one request; this server takes at most {}", in.size(), max_inputs));
  r.batch = true;
  for (size_t i = 0; i < in.size(); ++i) r.inputs.push_back(parse_input(in[i], fmt::format("inputs[{}]", i)));
  return r;
}

std::string predict_response(const PredictRequest& r, const std::vector<float>& logits,
                             const std::vector<std::string>& labels, bool regression) {
  const size_t C = labels.size();
  HONE_CHECK(logits.size() == r.inputs.size() * C, "{} logits for {} inputs of {} labels", logits.size(),
             r.inputs.size(), C);
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const float* z = &logits[i * C];
    if (!std::all_of(z, z + C, [](float v) { return std::isfinite(v); }))
      throw ApiError(500, fmt::format("the model's output for input {} is not finite", i));
    std::vector<double> score(z, z + C);
    if (!regression && !r.raw_scores) {
      const double mx = *std::max_element(score.begin(), score.end());
      double sum = 0;
      for (double& s : score) sum += s = std::exp(s - mx);
      for (double& s : score) s /= sum;
    }
    std::vector<size_t> order(C);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] > score[b]; });
    nlohmann::ordered_json one = nlohmann::ordered_json::array();
    for (size_t c : order) one.push_back({{"score", score[c]}, {"label", labels[c]}});
    all.push_back(std::move(one));
  }
  return (r.batch ? all : all[0]).dump();
}

}  // namespace hone

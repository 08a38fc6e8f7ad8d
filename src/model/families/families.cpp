// The registry of model families (hone/family.h): one entry per family file.
#include <fmt/format.h>

#include "hone/error.h"
#include "hone/family.h"

namespace hone {
namespace {

const ModelFamily* const* registry() {
  static const ModelFamily* const families[] = {&bert_family(),       &roberta_family(), &xlm_roberta_family(),
                                                &distilbert_family(), &electra_family(), &modernbert_family(),
                                                nullptr};
  return families;
}

}  // namespace

std::string ModelFamily::file_name(std::string_view name) const {
  for (const auto& [file, hone] : renamed_fields)
    if (hone == name) return file;
  return std::string(name);
}

const ModelFamily& find_family(std::string_view model_type, const std::string& source) {
  for (const ModelFamily* const* f = registry(); *f; ++f)
    if ((*f)->model_type == model_type) return **f;
  std::string known;
  for (const std::string& n : family_names()) known += fmt::format("{}\"{}\"", known.empty() ? "" : ", ", n);
  fail("{}: model_type \"{}\" is not one hone implements (hone has: {})", source, model_type, known);
}

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const ModelFamily* const* f = registry(); *f; ++f) names.push_back((*f)->model_type);
  return names;
}

}  // namespace hone

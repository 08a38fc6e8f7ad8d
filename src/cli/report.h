#pragma once
// Text the CLI prints: Python-style dicts (what Trainer users read), byte counts, and
// the memory anatomy table.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "hone/config.h"
#include "hone/memory.h"

namespace hone::cli {

// "24 layers, hidden 1024, ...; 335,143,938 parameters"
std::string describe(const ModelConfig& c, int64_t params);
std::string python_dict(const nlohmann::ordered_json& j);  // {'loss': 0.6931, 'epoch': 0.5}
std::string with_commas(uint64_t v);                        // 1,340,575,752
// Per category: bytes, MiB, bytes per parameter; with `measured` a second column of the
// bytes actually allocated.
std::string memory_table(const MemoryPlan& plan, int64_t params, const size_t* measured = nullptr);
// Every buffer of the plan with its category, size, offset and lifetime.
std::string buffer_list(const MemoryPlan& plan);

}  // namespace hone::cli

#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace hone {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: return 2;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

// Names as safetensors spells them ("F32", "BF16", ...).
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

// Scalar conversions used when reading half-precision checkpoints on the host.
float bf16_to_float(uint16_t v);
float f16_to_float(uint16_t v);
uint16_t float_to_bf16(float v);  // round to nearest even
uint16_t float_to_f16(float v);   // round to nearest even

}  // namespace hone

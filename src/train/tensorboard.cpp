#include "hone/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "hone/error.h"

namespace hone {
namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// --- The few protobuf encodings the events need (wire types 0, 1, 2, 5). -----------------
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(uint8_t(v)));
}
void put_key(std::string& out, int field, int wire_type) { put_varint(out, uint64_t(field) << 3 | wire_type); }
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char(uint8_t(v >> (8 * i))));
}
void put_uint(std::string& out, int field, uint64_t v) {  // int64/enum/int32 >= 0 (varint)
  put_key(out, field, 0);
  put_varint(out, v);
}
void put_double(std::string& out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  put_key(out, field, 1);
  put_le(out, bits, 8);
}
void put_float(std::string& out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  put_key(out, field, 5);
  put_le(out, bits, 4);
}
void put_bytes(std::string& out, int field, std::string_view bytes) {  // string, bytes, messages
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// tensorboard/compat/proto/event.proto, summary.proto, tensor.proto, tensor_shape.proto.
namespace event { constexpr int wall_time = 1, step = 2, file_version = 3, summary = 5; }
namespace summary { constexpr int value = 1; }
namespace value { constexpr int tag = 1, simple_value = 2, tensor = 8, metadata = 9; }
namespace metadata { constexpr int plugin_data = 1; }
namespace plugin_data { constexpr int plugin_name = 1; }
namespace tensor { constexpr int dtype = 1, tensor_shape = 2, string_val = 8; }
namespace shape { constexpr int dim = 2; }
namespace dim { constexpr int size = 1; }
constexpr uint64_t DT_STRING = 7;  // types.proto

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// An Event (proto3: fields at their default value are left out, as Python protobuf does).
std::string make_event(double wall_time, int64_t step, std::string_view file_version,
                       std::string_view summary_bytes) {
  std::string e;
  put_double(e, event::wall_time, wall_time);
  if (step != 0) put_uint(e, event::step, uint64_t(step));  // negative: 10-byte varint
  if (!file_version.empty()) put_bytes(e, event::file_version, file_version);
  if (!summary_bytes.empty()) put_bytes(e, event::summary, summary_bytes);
  return e;
}

std::string one_value_summary(const std::string& value_bytes) {
  std::string s;
  put_bytes(s, summary::value, value_bytes);
  return s;
}

std::atomic<int> g_writer_uid{0};  // TensorBoard's _global_uid

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (const char c : data) crc = kCrc32cTable[(crc ^ uint8_t(c)) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  const uint32_t length_crc = masked_crc32c(out);
  put_le(out, length_crc, 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  if (ec) fail("TensorBoard: cannot create directory {}: {}", log_dir, ec.message());
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  const auto seconds = int64_t(now_seconds());
  path_ = (std::filesystem::path(log_dir) /
           fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", seconds, host, int64_t(::getpid()),
                       g_writer_uid.fetch_add(1)))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) fail("TensorBoard: cannot create {}: {}", path_, std::strerror(errno));
  try {
    write_event(make_event(now_seconds(), 0, "brain.Event:2", {}));
    flush();
  } catch (...) {
    std::fclose(file_);
    file_ = nullptr;
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (!file_) return;
  if (std::fflush(file_) == 0) ::fsync(::fileno(file_));
  std::fclose(file_);
}

void TensorBoardWriter::write_event(const std::string& event) {
  const std::string record = tfrecord_frame(event);
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size())
    fail("TensorBoard: cannot write {}: {}", path_, std::strerror(errno));
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  put_bytes(v, value::tag, tag);
  put_float(v, value::simple_value, float(value));  // in a oneof: written even when 0
  write_event(make_event(now_seconds(), step, {}, one_value_summary(v)));
}

void TensorBoardWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  std::string d, shp, tens, plugin, meta, v;
  put_uint(d, dim::size, 1);
  put_bytes(shp, shape::dim, d);
  put_uint(tens, tensor::dtype, DT_STRING);
  put_bytes(tens, tensor::tensor_shape, shp);
  put_bytes(tens, tensor::string_val, text);
  // PluginData.content is TextPluginData(version=0) serialized: empty, so left out.
  put_bytes(plugin, plugin_data::plugin_name, "text");
  put_bytes(meta, metadata::plugin_data, plugin);
  put_bytes(v, value::tag, tag + "/text_summary");
  put_bytes(v, value::tensor, tens);
  put_bytes(v, value::metadata, meta);
  write_event(make_event(now_seconds(), step, {}, one_value_summary(v)));
}

void TensorBoardWriter::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::fflush(file_) != 0) fail("TensorBoard: cannot write {}: {}", path_, std::strerror(errno));
  if (::fsync(::fileno(file_)) != 0) fail("TensorBoard: cannot fsync {}: {}", path_, std::strerror(errno));
}

}  // namespace hone

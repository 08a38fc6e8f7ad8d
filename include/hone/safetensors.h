#pragma once
// The safetensors format: 8-byte little-endian header length N, N bytes of JSON
// ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}),
// then the data; offsets are relative to the end of the header.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hone/dtype.h"
#include "hone/tensor.h"

namespace hone {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // into the mapping
  size_t bytes = 0;
  int64_t numel() const;
};

// A memory-mapped, fully validated safetensors file. Every malformation (short file,
// header past the end, invalid JSON, unknown dtype, size/shape mismatch, offsets out of
// range or overlapping) throws hone::Error naming the file and the tensor.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;  // null if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Copies an entry into F32 memory of `count` floats, converting F16/BF16/F32 (and
  // integer dtypes) to float. Throws if the element count differs. Returns the index of
  // the first element that is NaN or infinite, or -1 when all are finite (the test rides
  // along with the copy).
  int64_t read_f32(const SafetensorsEntry& e, float* out, int64_t count) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// The index of an entry's first NaN or infinite element (F32, BF16, F16; integers are
// always finite), or -1: one vectorised pass over the mapped bytes.
int64_t first_non_finite(const SafetensorsEntry& e);
// A flat element index as a message shows it: "[3, 17] (element 65 in order)" for a
// matrix, "[65]" for a vector.
std::string element_index(const std::vector<int64_t>& shape, int64_t flat);

struct NamedTensor {
  std::string name;
  Tensor tensor;  // host memory
};

// Writes tensors (in the given order) atomically: a temporary file in the same
// directory, fsync, rename.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// The same, for tensors whose bytes are not in host memory as a whole: write_data is given
// a function that appends bytes to the file and must append every tensor's, in order (a
// count that differs is an error, and nothing is written).
struct TensorHeader {
  std::string name;
  DType dtype;
  Shape shape;
};
using ByteWriter = std::function<void(const void* data, size_t bytes)>;
void write_safetensors(const std::string& path, const std::vector<TensorHeader>& tensors,
                       const std::function<void(const ByteWriter&)>& write_data,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Atomic write of a whole file's content (temporary name, fsync, rename).
void write_file_atomic(const std::string& path, const std::string& content);

// fsync of a directory, which makes renames and new entries in it durable.
void sync_directory(const std::string& dir);

}  // namespace hone

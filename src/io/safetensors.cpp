#include "hone/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "hone/error.h"

namespace hone {

// The format is little-endian; hone copies data straight out of the mapping.
static_assert(std::endian::native == std::endian::little, "hone assumes a little-endian host");

namespace {

using nlohmann::json;

std::string errno_text() { return std::strerror(errno); }

// Where an entry's bytes lie within the data section, for sorting and overlap checks.
struct Span {
  uint64_t begin = 0, end = 0;
};

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Element i of type T at `p`, which need not be aligned for T.
template <typename T>
T load(const std::byte* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i * int64_t(sizeof(T)), sizeof(T));
  return v;
}

void parse_metadata(const std::string& path, const json& v, std::map<std::string, std::string>& out) {
  if (!v.is_object()) fail("{}: __metadata__ must be an object of strings, got {}", path, v.type_name());
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string())
      fail("{}: __metadata__ value '{}' must be a string, got {}", path, key, value.type_name());
    out[key] = value.get<std::string>();
  }
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& v,
                             const std::byte* data, uint64_t data_size, Span& span) {
  if (!v.is_object()) fail("{}: tensor '{}': entry must be an object, got {}", path, name, v.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) fail("{}: tensor '{}': missing '{}'", path, name, key);

  SafetensorsEntry e;
  e.name = name;
  const json& dtype = v["dtype"];
  if (!dtype.is_string()) fail("{}: tensor '{}': dtype must be a string, got {}", path, name, dtype.dump());
  auto dt = dtype_from_name(dtype.get<std::string>());
  if (!dt)
    fail("{}: tensor '{}': unsupported dtype '{}' (hone reads F32, F16, BF16, I32, I64, U8)", path, name,
         dtype.get<std::string>());
  e.dtype = *dt;

  const json& shape = v["shape"];
  if (!shape.is_array()) fail("{}: tensor '{}': shape must be an array, got {}", path, name, shape.dump());
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : shape) {
    if (!d.is_number_integer()) fail("{}: tensor '{}': shape {} has a non-integer dimension", path, name, shape.dump());
    if (!d.is_number_unsigned()) fail("{}: tensor '{}': negative dimension in shape {}", path, name, shape.dump());
    uint64_t n = d.get<uint64_t>();
    overflow |= n > uint64_t(std::numeric_limits<int64_t>::max()) || __builtin_mul_overflow(numel, n, &numel);
    e.shape.push_back(int64_t(n));
  }
  uint64_t expected = 0;
  overflow |= __builtin_mul_overflow(numel, dtype_size(e.dtype), &expected);
  if (overflow) fail("{}: tensor '{}': shape {} is too large", path, name, shape.dump());

  const json& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned() || offsets[0].get<uint64_t>() > offsets[1].get<uint64_t>())
    fail("{}: tensor '{}': data_offsets must be two non-decreasing non-negative integers [begin, end], got {}",
         path, name, offsets.dump());
  span = {offsets[0].get<uint64_t>(), offsets[1].get<uint64_t>()};
  if (span.end > data_size)
    fail("{}: tensor '{}': data_offsets [{}, {}] end beyond the data section ({} bytes)", path, name,
         span.begin, span.end, data_size);
  if (span.end - span.begin != expected)
    fail("{}: tensor '{}': data_offsets span {} bytes but shape {} of {} needs {} bytes", path, name,
         span.end - span.begin, shape_str(e.shape), dtype_name(e.dtype), expected);
  e.data = data + span.begin;
  e.bytes = size_t(expected);
  return e;
}

// Parses and validates the header of a mapped file of `size` bytes.
void parse_file(const std::string& path, const std::byte* base, uint64_t size,
                std::vector<SafetensorsEntry>& entries, std::map<std::string, std::string>& metadata) {
  uint64_t n = 0;
  std::memcpy(&n, base, 8);
  if (n > size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", path, n, size);
  const char* text = reinterpret_cast<const char*>(base + 8);
  json header;
  try {
    header = json::parse(text, text + n);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number such as 1e400
    fail("{}: header is not valid JSON: {}", path, e.what());
  }
  if (!header.is_object()) fail("{}: header must be a JSON object, got {}", path, header.type_name());

  const std::byte* data = base + 8 + n;
  const uint64_t data_size = size - 8 - n;
  std::vector<std::pair<Span, SafetensorsEntry>> found;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      parse_metadata(path, v, metadata);
      continue;
    }
    Span span;
    SafetensorsEntry e = parse_entry(path, name, v, data, data_size, span);
    found.emplace_back(span, std::move(e));
  }
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return std::pair(a.first.begin, a.first.end) < std::pair(b.first.begin, b.first.end);
  });
  for (size_t i = 1; i < found.size(); ++i) {
    const auto& [prev, pe] = found[i - 1];
    const auto& [cur, ce] = found[i];
    if (cur.begin < prev.end)
      fail("{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", path, pe.name, prev.begin, prev.end,
           ce.name, cur.begin, cur.end);
  }
  entries.reserve(found.size());
  for (auto& [span, e] : found) entries.push_back(std::move(e));
}

}  // namespace

void sync_directory(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail("cannot open directory {}: {}", dir, errno_text());
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  if (rc != 0 && err != EINVAL)  // some file systems cannot fsync a directory
    fail("fsync of directory {}: {}", dir, std::strerror(err));
}

namespace {

// Writes through a temporary file next to the target and renames it into place, so
// readers see the old content or the new one, never a partial file, even after a crash.
class AtomicWriter {
 public:
  explicit AtomicWriter(const std::string& path) : path_(path) {
    std::filesystem::path p(path);
    if (!p.has_filename()) fail("cannot write {}: not a file path", path);
    dir_ = p.has_parent_path() ? p.parent_path().string() : ".";
    tmp_ = (std::filesystem::path(dir_) / fmt::format(".{}.tmp.{}", p.filename().string(), ::getpid())).string();
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd_ < 0) fail("cannot write {}: cannot create {}: {}", path_, tmp_, errno_text());
  }
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  ~AtomicWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }

  void write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      // Linux moves at most ~2 GiB per call; the loop also handles short writes.
      ssize_t r = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
      if (r < 0) {
        if (errno == EINTR) continue;
        fail("cannot write {}: {}", path_, errno_text());
      }
      p += r;
      n -= size_t(r);
    }
  }

  void commit() {
    if (::fsync(fd_) != 0) fail("cannot write {}: fsync: {}", path_, errno_text());
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot write {}: close: {}", path_, errno_text());
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      fail("cannot write {}: rename from {}: {}", path_, tmp_, errno_text());
    committed_ = true;
    // The rename is durable only once the directory entry is on disk.
    sync_directory(dir_);
  }

 private:
  std::string path_, dir_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open safetensors file {}: {}", path, errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    std::string why = S_ISDIR(st.st_mode) ? "is a directory" : errno_text();
    ::close(fd);
    fail("cannot read safetensors file {}: {}", path, why);
  }
  if (st.st_size < 8) {
    ::close(fd);
    fail("{}: file is {} bytes, shorter than the 8-byte header length", path, st.st_size);
  }
  size_ = size_t(st.st_size);
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string why = errno_text();
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) fail("cannot map safetensors file {}: {}", path, why);
  map_ = m;
  try {
    parse_file(path_, static_cast<const std::byte*>(map_), size_, entries_, metadata_);
  } catch (...) {
    ::munmap(map_, size_);  // the destructor does not run for a throwing constructor
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { ::munmap(map_, size_); }

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

namespace {

// Copies n elements into F32 `out` (kCopy) and tells whether any is NaN or infinite: one
// pass, the test a mask on the exponent bits that the compiler vectorises with the copy.
template <bool kCopy>
bool f32_bits(const std::byte* p, float* out, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = load<uint32_t>(p, i);
    if constexpr (kCopy) std::memcpy(out + i, &b, 4);
    bad |= uint32_t((b & 0x7F800000u) == 0x7F800000u);
  }
  return bad != 0;
}
template <bool kCopy>
bool bf16_bits(const std::byte* p, float* out, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = uint32_t(load<uint16_t>(p, i)) << 16;
    if constexpr (kCopy) std::memcpy(out + i, &b, 4);
    bad |= uint32_t((b & 0x7F800000u) == 0x7F800000u);
  }
  return bad != 0;
}
template <bool kCopy>
bool f16_bits(const std::byte* p, float* out, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = load<uint16_t>(p, i);
    if constexpr (kCopy) out[i] = f16_to_float(h);
    bad |= uint32_t((h & 0x7C00u) == 0x7C00u);
  }
  return bad != 0;
}

template <typename T, bool kCopy>
bool ints(const std::byte* p, float* out, int64_t n) {  // always finite
  if constexpr (kCopy)
    for (int64_t i = 0; i < n; ++i) out[i] = float(load<T>(p, i));
  return false;
}

// copy_and_test(e, out, n): the entry's n elements as F32 into out (null: only the test);
// true when any of them is not finite.
template <bool kCopy>
bool copy_and_test(const SafetensorsEntry& e, float* out, int64_t count) {
  const std::byte* p = e.data;
  switch (e.dtype) {
    case DType::F32: return f32_bits<kCopy>(p, out, count);
    case DType::BF16: return bf16_bits<kCopy>(p, out, count);
    case DType::F16: return f16_bits<kCopy>(p, out, count);
    case DType::I32: return ints<int32_t, kCopy>(p, out, count);
    case DType::I64: return ints<int64_t, kCopy>(p, out, count);
    case DType::U8: return ints<uint8_t, kCopy>(p, out, count);
  }
  return false;
}

// The first element that is not finite, once copy_and_test has found one.
int64_t first_bad(const SafetensorsEntry& e, int64_t count) {
  const std::byte* p = e.data;
  for (int64_t i = 0; i < count; ++i) {
    float v = 0;
    switch (e.dtype) {
      case DType::F32: v = load<float>(p, i); break;
      case DType::BF16: v = bf16_to_float(load<uint16_t>(p, i)); break;
      case DType::F16: v = f16_to_float(load<uint16_t>(p, i)); break;
      default: return -1;
    }
    if (!std::isfinite(v)) return i;
  }
  return -1;
}

}  // namespace

int64_t SafetensorsFile::read_f32(const SafetensorsEntry& e, float* out, int64_t count) const {
  if (count != e.numel())
    fail("{}: tensor '{}' has {} elements ({}), expected {}", path_, e.name, e.numel(), shape_str(e.shape), count);
  return copy_and_test<true>(e, out, count) ? first_bad(e, count) : -1;
}

int64_t first_non_finite(const SafetensorsEntry& e) {
  const int64_t n = e.numel();
  return copy_and_test<false>(e, nullptr, n) ? first_bad(e, n) : -1;
}

std::string element_index(const std::vector<int64_t>& shape, int64_t flat) {
  if (shape.size() <= 1) return fmt::format("[{}]", flat);
  std::vector<int64_t> at(shape.size());
  int64_t rest = flat;
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t n = std::max<int64_t>(shape[d], 1);
    at[d] = rest % n;
    rest /= n;
  }
  std::string s = "[";
  for (size_t d = 0; d < at.size(); ++d) s += (d ? ", " : "") + std::to_string(at[d]);
  return s + fmt::format("] (element {} in order)", flat);
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorHeader> headers;
  for (const auto& [name, t] : tensors) {
    HONE_CHECK(t.device == Device::CPU, "tensor '{}' written to {} is not in host memory", name, path);
    headers.push_back({name, t.dtype, t.shape});
  }
  write_safetensors(
      path, headers,
      [&](const ByteWriter& write) {
        for (const auto& [name, t] : tensors) write(t.data, t.bytes());
      },
      metadata);
}

void write_safetensors(const std::string& path, const std::vector<TensorHeader>& tensors,
                       const std::function<void(const ByteWriter&)>& write_data,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, dtype, shape_of] : tensors) {
    if (name == "__metadata__" || !names.insert(name).second)
      fail("cannot write {}: tensor name '{}' is reserved or used twice", path, name);
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int i = 0; i < shape_of.rank; ++i) shape.push_back(shape_of[i]);
    const uint64_t bytes = uint64_t(shape_of.numel()) * dtype_size(dtype);
    nlohmann::ordered_json entry;
    entry["dtype"] = std::string(dtype_name(dtype));
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = nlohmann::ordered_json::array({offset, offset + bytes});
    header[name] = std::move(entry);
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not UTF-8
    fail("cannot write {}: {}", path, e.what());
  }
  // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();

  AtomicWriter w(path);
  w.write(&n, 8);
  w.write(text.data(), text.size());
  uint64_t written = 0;
  write_data([&](const void* data, size_t bytes) {
    w.write(data, bytes);
    written += bytes;
  });
  if (written != offset) fail("cannot write {}: {} bytes of tensor data for {} declared", path, written, offset);
  w.commit();
}

void write_file_atomic(const std::string& path, const std::string& content) {
  AtomicWriter w(path);
  w.write(content.data(), content.size());
  w.commit();
}

}  // namespace hone

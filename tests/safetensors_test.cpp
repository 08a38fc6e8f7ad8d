#include "hone/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace hone {
namespace {

using test::HostTensor;
using test::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A safetensors file built by hand: the length prefix (the header's own unless given),
// the header text as is, then `data`.
std::string raw_file(const std::string& header, const std::string& data = "", uint64_t length = UINT64_MAX) {
  uint64_t n = length == UINT64_MAX ? header.size() : length;
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

std::vector<std::string> dir_listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Opening `bytes` must throw hone::Error whose message contains the path and every one of `parts`.
void expect_rejected(const std::string& bytes, std::initializer_list<std::string> parts) {
  TempDir dir;
  std::string path = dir.path + "/bad.safetensors";
  write_bytes(path, bytes);
  try {
    SafetensorsFile f(path);
    ADD_FAILURE() << "no error for " << bytes.substr(std::min<size_t>(8, bytes.size()));
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST(Safetensors, RoundTripIsBitExact) {
  TempDir dir;
  std::string path = dir.path + "/model.safetensors";
  HostTensor w(DType::F32, {2, 3});
  test::fill_uniform(w, 1);
  w.f()[0] = -0.0f;
  HostTensor h(DType::BF16, {5});
  for (int i = 0; i < 5; ++i) h.t.ptr<uint16_t>()[i] = float_to_bf16(0.3f * float(i) - 1.0f);
  HostTensor ids(DType::I64, {2, 2});
  const int64_t id_values[] = {0, -1, int64_t(1) << 40, 7};
  std::memcpy(ids.t.data, id_values, sizeof(id_values));
  HostTensor empty(DType::F32, {0, 4});
  HostTensor scalar(DType::I32, {});
  *scalar.t.ptr<int32_t>() = 42;
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "hone \"test\""}};
  write_safetensors(path,
                    {{"z.weight", w.t}, {"a.half", h.t}, {"ids", ids.t}, {"empty", empty.t}, {"scalar", scalar.t}},
                    meta);

  // The data starts 8-byte aligned, as the reference writer pads it.
  std::string bytes = read_bytes(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + w.t.bytes() + h.t.bytes() + ids.t.bytes() + scalar.t.bytes());

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.entries().size(), 5u);
  // Entries come in data order, which is the order written.
  std::vector<std::string> order;
  for (const auto& e : f.entries()) order.push_back(e.name);
  EXPECT_EQ(order, (std::vector<std::string>{"z.weight", "a.half", "ids", "empty", "scalar"}));

  auto check = [&](const char* name, const HostTensor& t, std::vector<int64_t> shape) {
    const SafetensorsEntry* e = f.find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->dtype, t.t.dtype) << name;
    EXPECT_EQ(e->shape, shape) << name;
    ASSERT_EQ(e->bytes, t.t.bytes()) << name;
    EXPECT_EQ(std::memcmp(e->data, t.t.data, e->bytes), 0) << name;
  };
  check("z.weight", w, {2, 3});
  check("a.half", h, {5});
  check("ids", ids, {2, 2});
  check("empty", empty, {0, 4});
  check("scalar", scalar, {});
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, ReadF32ConvertsEveryDtype) {
  TempDir dir;
  std::string path = dir.path + "/all.safetensors";
  const float reals[] = {1.5f, -2.0f, 0.0f, 65504.0f};  // exact in F16 and BF16
  const int64_t ints[] = {3, -2, 0, int64_t(1) << 24};
  const uint8_t bytes[] = {3, 2, 0, 255};
  HostTensor f32(DType::F32, {4}), f16(DType::F16, {4}), bf16(DType::BF16, {4});
  HostTensor i32(DType::I32, {4}), i64(DType::I64, {4}), u8(DType::U8, {4});
  for (int i = 0; i < 4; ++i) {
    f32.f()[i] = reals[i];
    f16.t.ptr<uint16_t>()[i] = float_to_f16(reals[i]);
    bf16.t.ptr<uint16_t>()[i] = float_to_bf16(i == 3 ? 65536.0f : reals[i]);
    i32.t.ptr<int32_t>()[i] = int32_t(ints[i]);
    i64.t.ptr<int64_t>()[i] = ints[i];
    u8.t.ptr<uint8_t>()[i] = bytes[i];
  }
  write_safetensors(path, {{"f32", f32.t}, {"f16", f16.t}, {"bf16", bf16.t}, {"i32", i32.t}, {"i64", i64.t}, {"u8", u8.t}});
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  auto read = [&](const char* name) {
    std::vector<float> out(4);
    f.read_f32(*f.find(name), out.data(), 4);
    return out;
  };
  EXPECT_EQ(read("f32"), std::vector<float>(reals, reals + 4));
  EXPECT_EQ(read("f16"), std::vector<float>(reals, reals + 4));
  EXPECT_EQ(read("bf16"), (std::vector<float>{1.5f, -2.0f, 0.0f, 65536.0f}));
  const std::vector<float> int_values = {3.0f, -2.0f, 0.0f, 16777216.0f};
  EXPECT_EQ(read("i32"), int_values);
  EXPECT_EQ(read("i64"), int_values);
  EXPECT_EQ(read("u8"), (std::vector<float>{3.0f, 2.0f, 0.0f, 255.0f}));
  float out[3];
  EXPECT_THROW(f.read_f32(*f.find("f32"), out, 3), Error);
}

// read_f32 reports the first NaN or infinity as it copies (F32, BF16, F16), also in the
// tail of a length that is no multiple of a vector; first_non_finite does the same
// without a copy.
TEST(Safetensors, ReadF32FindsTheFirstNonFiniteElement) {
  TempDir dir;
  const std::string path = dir.path + "/w.safetensors";
  const int64_t n = 1003;
  HostTensor clean(DType::F32, {n}), late(DType::F32, {17, 59}), tail(DType::F32, {n});
  HostTensor bf16(DType::BF16, {n}), f16(DType::F16, {n}), f16_max(DType::F16, {n}), ids(DType::I32, {n});
  for (int64_t i = 0; i < n; ++i) {
    clean.f()[i] = late.f()[i] = tail.f()[i] = float(i) - 500.0f;
    bf16.t.ptr<uint16_t>()[i] = float_to_bf16(float(i));
    f16.t.ptr<uint16_t>()[i] = float_to_f16(float(i % 100));
    f16_max.t.ptr<uint16_t>()[i] = float_to_f16(65504.0f);  // the largest finite half
    ids.t.ptr<int32_t>()[i] = int32_t(i);
  }
  late.f()[900] = std::numeric_limits<float>::infinity();
  late.f()[700] = std::nanf("");
  tail.f()[n - 1] = -std::numeric_limits<float>::infinity();
  bf16.t.ptr<uint16_t>()[5] = 0xFF80;  // -inf
  f16.t.ptr<uint16_t>()[2] = 0x7E00;   // NaN
  write_safetensors(path, {{"clean", clean.t}, {"late", late.t}, {"tail", tail.t}, {"bf16", bf16.t}, {"f16", f16.t},
                           {"f16_max", f16_max.t}, {"ids", ids.t}});
  SafetensorsFile f(path);
  std::vector<float> out(size_t(n), 0.0f);
  auto read = [&](const char* name) { return f.read_f32(*f.find(name), out.data(), n); };
  EXPECT_EQ(read("clean"), -1);
  EXPECT_EQ(read("late"), 700);
  EXPECT_EQ(out[1], -499.0f);  // still copied
  EXPECT_TRUE(std::isinf(out[900]));
  EXPECT_EQ(read("tail"), n - 1);
  EXPECT_EQ(read("bf16"), 5);
  EXPECT_EQ(out[4], 4.0f);
  EXPECT_EQ(read("f16"), 2);
  EXPECT_EQ(read("f16_max"), -1);
  EXPECT_EQ(out[0], 65504.0f);
  EXPECT_EQ(read("ids"), -1);
  for (const char* name : {"clean", "late", "tail", "bf16", "f16", "f16_max", "ids"}) {
    const int64_t copied = f.read_f32(*f.find(name), out.data(), n);
    EXPECT_EQ(first_non_finite(*f.find(name)), copied) << name;
  }
  EXPECT_EQ(element_index({17, 59}, 700), "[11, 51] (element 700 in order)");
  EXPECT_EQ(element_index({1003}, 5), "[5]");
}

TEST(Safetensors, ReadsUnalignedData) {
  // An unpadded 3-byte-longer header puts the F32 data at an odd address.
  TempDir dir;
  std::string path = dir.path + "/odd.safetensors";
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  if ((8 + header.size()) % 2 == 0) header += " ";
  float v[2] = {3.25f, -7.5f};
  write_bytes(path, raw_file(header, std::string(reinterpret_cast<const char*>(v), 8)));
  SafetensorsFile f(path);
  float out[2];
  f.read_f32(f.entries()[0], out, 2);
  EXPECT_EQ(out[0], 3.25f);
  EXPECT_EQ(out[1], -7.5f);
}

TEST(Safetensors, EntriesAreSortedByOffset) {
  TempDir dir;
  std::string path = dir.path + "/sorted.safetensors";
  std::string header =
      R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  write_bytes(path, raw_file(header, "abcd"));
  SafetensorsFile f(path);
  ASSERT_EQ(f.entries().size(), 2u);
  EXPECT_EQ(f.entries()[0].name, "a");
  EXPECT_EQ(f.entries()[1].name, "b");
  EXPECT_EQ(char(f.entries()[1].data[0]), 'c');
}

TEST(Safetensors, AtomicWriteReplacesAndLeavesNoTemporaryFiles) {
  TempDir dir;
  std::string path = dir.path + "/out.json";
  write_file_atomic(path, "first");
  write_file_atomic(path, "second, longer");
  EXPECT_EQ(read_bytes(path), "second, longer");
  HostTensor t(DType::F32, {3});
  test::fill_uniform(t, 2);
  write_safetensors(dir.path + "/m.safetensors", {{"t", t.t}});
  write_safetensors(dir.path + "/m.safetensors", {{"t", t.t}});
  EXPECT_EQ(dir_listing(dir.path), (std::vector<std::string>{"m.safetensors", "out.json"}));
}

TEST(Safetensors, AtomicWriteFailuresNameThePathAndCleanUp) {
  TempDir dir;
  std::string missing = dir.path + "/no/such/dir/model.safetensors";
  try {
    write_file_atomic(missing, "x");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  // Renaming onto a directory fails after the data is written: the temporary must go.
  std::string target = dir.path + "/taken";
  std::filesystem::create_directory(target);
  HostTensor t(DType::F32, {16});
  test::fill_uniform(t, 3);
  try {
    write_safetensors(target, {{"t", t.t}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(target), std::string::npos) << e.what();
  }
  EXPECT_EQ(dir_listing(dir.path), (std::vector<std::string>{"taken"}));
}

// A streamed write whose data falls short of its header leaves no file behind.
TEST(Safetensors, StreamedWriteOfTooFewBytesFailsAndLeavesNothing) {
  TempDir dir;
  const std::string path = dir.path + "/s.safetensors";
  const float data[4] = {1, 2, 3, 4};
  const std::vector<TensorHeader> headers{{"a", DType::F32, Shape{2}}, {"b", DType::F32, Shape{2}}};
  write_safetensors(path, headers, [&](const ByteWriter& write) { write(data, sizeof data); });
  SafetensorsFile f(path);
  float b[2];
  f.read_f32(*f.find("b"), b, 2);
  EXPECT_EQ(b[1], 4.0f);
  std::filesystem::remove(path);
  try {
    write_safetensors(path, headers, [&](const ByteWriter& write) { write(data, 3 * sizeof(float)); });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("12 bytes of tensor data for 16 declared"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(dir_listing(dir.path).empty());
}

TEST(Safetensors, WriteRejectsDuplicateNames) {
  TempDir dir;
  HostTensor t(DType::F32, {1});
  EXPECT_THROW(write_safetensors(dir.path + "/d.safetensors", {{"t", t.t}, {"t", t.t}}), Error);
  EXPECT_TRUE(dir_listing(dir.path).empty());
}

TEST(Safetensors, MissingFileNamesPath) {
  TempDir dir;
  std::string path = dir.path + "/absent.safetensors";
  try {
    SafetensorsFile f(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

// One test per malformation; each file is otherwise valid.
const std::string kGood = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

TEST(Safetensors, RejectsFileShorterThanLengthPrefix) { expect_rejected(std::string("\x05\0\0", 3), {"shorter than"}); }

TEST(Safetensors, RejectsHeaderPastEndOfFile) {
  expect_rejected(raw_file("{" + kGood + "}", std::string(8, '\0'), 1000), {"header length 1000"});
}

TEST(Safetensors, RejectsInvalidJson) { expect_rejected(raw_file("{\"w\": {", ""), {"not valid JSON"}); }

// A header number no double holds: nlohmann throws out_of_range for it, which escaped the
// parse_error handler and ended hone in std::terminate.
TEST(Safetensors, RejectsNumberOverflowInTheHeader) {
  expect_rejected(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,1e400]}})", std::string(8, '\0')),
                  {"not valid JSON", "number overflow"});
}

TEST(Safetensors, RejectsHeaderThatIsNotAnObject) { expect_rejected(raw_file("[1, 2]"), {"JSON object"}); }

TEST(Safetensors, RejectsEntryThatIsNotAnObject) {
  expect_rejected(raw_file(R"({"w": [1, 2]})"), {"'w'", "must be an object"});
}

TEST(Safetensors, RejectsEntryWithoutDtype) {
  expect_rejected(raw_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"'w'", "missing 'dtype'"});
}

TEST(Safetensors, RejectsEntryWithoutShape) {
  expect_rejected(raw_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"'w'", "missing 'shape'"});
}

TEST(Safetensors, RejectsEntryWithoutDataOffsets) {
  expect_rejected(raw_file(R"({"w":{"dtype":"F32","shape":[2]}})", std::string(8, '\0')),
                  {"'w'", "missing 'data_offsets'"});
}

TEST(Safetensors, RejectsUnknownDtype) {
  expect_rejected(raw_file(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"'w'", "F64"});
  expect_rejected(raw_file(R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"'w'", "Q4"});
}

TEST(Safetensors, RejectsNegativeDimension) {
  expect_rejected(raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"'w'", "negative dimension"});
}

TEST(Safetensors, RejectsMalformedDataOffsets) {
  for (const char* offsets : {"[0]", "[0, 8, 16]", R"(["0", "8"])", "[8, 0]", "[-8, 0]", "[0, 8.5]", "7"}) {
    SCOPED_TRACE(offsets);
    std::string header = std::string(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":)") + offsets + "}}";
    expect_rejected(raw_file(header, std::string(16, '\0')), {"'w'", "data_offsets"});
  }
}

TEST(Safetensors, RejectsDataPastEndOfDataSection) {
  expect_rejected(raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0')),
                  {"'w'", "beyond the data section (8 bytes)"});
}

TEST(Safetensors, RejectsSizeThatDoesNotMatchShape) {
  expect_rejected(raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"'w'", "span 8 bytes", "needs 12 bytes"});
}

TEST(Safetensors, RejectsOverlappingTensors) {
  std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_rejected(raw_file(header, std::string(12, '\0')), {"'a'", "'b'", "overlap"});
}

TEST(Safetensors, RejectsMetadataThatIsNotAnObjectOfStrings) {
  expect_rejected(raw_file(R"({"__metadata__": ["pt"], )" + kGood + "}", std::string(8, '\0')),
                  {"__metadata__"});
  expect_rejected(raw_file(R"({"__metadata__": {"epoch": 3}, )" + kGood + "}", std::string(8, '\0')),
                  {"__metadata__", "epoch"});
}

}  // namespace
}  // namespace hone

#include "hone/tensorboard.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sys/wait.h>
#include <unistd.h>

#include "hone/error.h"
#include "test_util.h"

namespace hone {
namespace {

using test::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().string());
  return out;
}

uint32_t le32(const std::string& s, size_t pos) {
  uint32_t v;
  std::memcpy(&v, s.data() + pos, 4);
  return v;
}

// The data of every TFRecord in `bytes`, checking both CRCs of each.
std::vector<std::string> tfrecords(const std::string& bytes) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    EXPECT_LE(pos + 12, bytes.size());
    if (pos + 12 > bytes.size()) break;
    uint64_t length;
    std::memcpy(&length, bytes.data() + pos, 8);
    EXPECT_EQ(le32(bytes, pos + 8), masked_crc32c(std::string_view(bytes).substr(pos, 8))) << "at byte " << pos;
    EXPECT_LE(pos + 16 + length, bytes.size());
    if (pos + 16 + length > bytes.size()) break;
    std::string data = bytes.substr(pos + 12, length);
    EXPECT_EQ(le32(bytes, pos + 12 + length), masked_crc32c(data)) << "at byte " << pos;
    out.push_back(std::move(data));
    pos += 16 + length;
  }
  return out;
}

TEST(TensorBoardTest, Crc32cKnownVectors) {
  // The check value of CRC-32C and the test vectors of RFC 3720, appendix B.4.
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0x00000000u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending(32, '\0'), descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = char(i);
    descending[i] = char(31 - i);
  }
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  const uint8_t iscsi_read[48] = {0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                  0x14, 0,    0, 0, 0, 0, 4, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,
                                  0x28, 0,    0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(crc32c(std::string_view(reinterpret_cast<const char*>(iscsi_read), sizeof iscsi_read)), 0xD9963A56u);
  // Continuing a CRC over a split buffer gives the CRC of the whole.
  EXPECT_EQ(crc32c("6789", crc32c("12345")), 0xE3069283u);
  // python3 -c "from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as m; print(m(b'123456789'))"
  EXPECT_EQ(masked_crc32c("123456789"), 3347755237u);
}

TEST(TensorBoardTest, TfRecordFraming) {
  const std::string frame = tfrecord_frame("abc");
  ASSERT_EQ(frame.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(frame.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(le32(frame, 8), masked_crc32c(frame.substr(0, 8)));
  EXPECT_EQ(frame.substr(12, 3), "abc");
  EXPECT_EQ(le32(frame, 15), masked_crc32c("abc"));
}

TEST(TensorBoardTest, FileNameAndFirstEvent) {
  TempDir tmp;
  const std::string dir = tmp.path + "/runs/a/b";  // parents created
  { TensorBoardWriter w(dir); }
  const auto files = event_files(dir);
  ASSERT_EQ(files.size(), 1u);
  const std::string name = std::filesystem::path(files[0]).filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\..+\.\d+\.\d+)"))) << name;
  EXPECT_NE(name.find(fmt::format(".{}.", ::getpid())), std::string::npos) << name;
  const auto records = tfrecords(read_bytes(files[0]));
  ASSERT_EQ(records.size(), 1u);
  // Event{wall_time (field 1, fixed64), file_version (field 3) = "brain.Event:2"}.
  EXPECT_EQ(records[0].size(), 9u + 2 + 13);
  EXPECT_EQ(records[0][0], '\x09');
  EXPECT_EQ(records[0].substr(9, 2), "\x1a\x0d");  // field 3, length 13
  EXPECT_EQ(records[0].substr(11), "brain.Event:2");
}

TEST(TensorBoardTest, TwoWritersInOneDirectoryGetTwoFiles) {
  TempDir tmp;
  TensorBoardWriter a(tmp.path), b(tmp.path);
  EXPECT_NE(a.path(), b.path());
  EXPECT_EQ(event_files(tmp.path).size(), 2u);
}

TEST(TensorBoardTest, UncreatableDirectoryNamesThePath) {
  TempDir tmp;
  const std::string file = tmp.path + "/plain-file";
  std::ofstream(file) << "x";
  try {
    TensorBoardWriter w(file + "/logs");
    FAIL() << "expected hone::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file + "/logs"), std::string::npos) << e.what();
  }
}

// Writes scalars and text, then reads them back with TensorBoard's EventAccumulator
// (tests/read_tensorboard.py). Skips where python3 or tensorboard is missing.
TEST(TensorBoardTest, TensorBoardReadsBackScalarsAndText) {
  TempDir tmp;
  const std::string log_dir = tmp.path + "/runs";
  nlohmann::json expected = {{"scalars", nlohmann::json::object()}, {"texts", nlohmann::json::object()}};
  size_t records = 1;
  {
    TensorBoardWriter w(log_dir);
    const std::string args = "{\n  \"learning_rate\": 5e-05,\n  \"output_dir\": \"out/ü ñ\"\n}";
    w.add_text("args", args, 0);
    expected["texts"]["args"].push_back({0, args});
    w.add_text("model_config", "| a | b |\n|---|---|\n| 1 | 2 |", 0);
    expected["texts"]["model_config"].push_back({0, "| a | b |\n|---|---|\n| 1 | 2 |"});
    records += 2;
    const std::vector<std::pair<std::string, std::vector<double>>> series = {
        {"train/loss", {0.6931471805599453, 0.5123, 0.25, 1e-8, 0.0}},
        {"train/learning_rate", {5e-05, 4.5e-05, 2.5e-05, 1e-7, 0.0}},
        {"train/grad_norm", {-3.5, 1e30, 123456.789, -1e-30, 7.0}},
        {"eval/accuracy", {0.5, 0.75, 0.875, 0.9, 1.0}},
    };
    for (int64_t i = 0; i < 5; ++i) {
      const int64_t step = i == 4 ? int64_t(1) << 40 : i * 10;  // step 0 too (left out of the proto)
      for (const auto& [tag, values] : series) {
        w.add_scalar(tag, values[size_t(i)], step);
        expected["scalars"][tag].push_back({step, values[size_t(i)]});
        ++records;
      }
      if (i == 2) w.flush();
    }
    w.flush();
    // Flushed: everything so far is in the file while the writer is still open.
    const auto files = event_files(log_dir);
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(tfrecords(read_bytes(files[0])).size(), records);
  }

  const std::string expected_path = tmp.path + "/expected.json";
  std::ofstream(expected_path) << expected.dump(2);
  const std::string script = std::string(HONE_FIXTURES_DIR) + "/../read_tensorboard.py";
  HONE_EXPECT_PYTHON_CHECK("python3 '" + script + "' '" + log_dir + "' '" + expected_path + "'");
}

}  // namespace
}  // namespace hone

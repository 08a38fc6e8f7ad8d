#pragma once
// TensorBoard event files, written the way torch.utils.tensorboard.SummaryWriter writes
// them (HF Trainer's TensorBoardCallback uses that writer): a TFRecord stream of
// serialized tensorboard.Event protos, hand-encoded, no protobuf dependency.
//
// TFRecord framing of each record: uint64 length (little-endian), masked crc32c of those
// 8 bytes, the data, masked crc32c of the data.
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

namespace hone {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI and TFRecord use it.
// `crc` continues a previous result: crc32c(ab) == crc32c(b, crc32c(a)).
uint32_t crc32c(std::string_view data, uint32_t crc = 0);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::string_view data);

// One TFRecord: length, masked crc of length, data, masked crc of data.
std::string tfrecord_frame(std::string_view data);

// Writes one event file. Not copyable; the methods may be called from several threads.
// Every I/O failure throws hone::Error naming the file.
class TensorBoardWriter {
 public:
  // Creates log_dir (and parents) and log_dir/events.out.tfevents.<%010d unix seconds>.
  // <hostname>.<pid>.<n>, n counting the writers of this process from 0 (TensorBoard's
  // own naming), then writes the file_version "brain.Event:2" event.
  explicit TensorBoardWriter(const std::string& log_dir);
  ~TensorBoardWriter();  // flushes and closes; never throws
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Summary.Value{tag, simple_value (float)}, wall_time = now: SummaryWriter.add_scalar.
  void add_scalar(const std::string& tag, double value, int64_t step);
  // SummaryWriter.add_text: the tag becomes `tag + "/text_summary"` (torch appends that,
  // so HF's "args" shows as "args/text_summary"), a DT_STRING tensor of shape [1] with
  // metadata plugin_name "text".
  void add_text(const std::string& tag, const std::string& text, int64_t step);
  // fflush + fsync.
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
  std::mutex mutex_;
};

}  // namespace hone

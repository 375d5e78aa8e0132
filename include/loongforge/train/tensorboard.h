// TensorBoard event files written natively: TFRecord framing (length, masked CRC-32C of the
// length, the record, its masked CRC-32C) around Event protocol buffers (wall_time, step, a
// Summary of scalar values), the format tensorboard's EventAccumulator and tf.summary read. One
// file per run, events.out.tfevents.<seconds>.<host>.<pid>.loongforge. Scalars only. Not a
// metrics logger (the trainer decides what to write and when).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace lf::train {

class TensorBoardWriter {
 public:
  // Creates `dir` and the event file (its first event names the file version). Throws lf::Error
  // naming the directory when it cannot be written.
  explicit TensorBoardWriter(const std::string& dir);
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::ofstream out_;
};

// CRC-32C (Castagnoli), as TFRecord frames use it.
uint32_t crc32c(const void* data, size_t size);

}  // namespace lf::train

#include "loongforge/train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "loongforge/core/error.h"

namespace lf::train {
namespace {

// Protocol buffer wire format: varints, tags, fixed-width little-endian values.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void tag(std::string& out, int field, int wire) { varint(out, static_cast<uint64_t>(field) << 3 | wire); }
template <class T>
void fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& v) {
  tag(out, field, 2);
  varint(out, v.size());
  out += v;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5.
std::string event(double wall_time, int64_t step) {
  std::string e;
  tag(e, 1, 1);
  fixed(e, wall_time);
  if (step != 0) {
    tag(e, 2, 0);
    varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> out{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected Castagnoli
      out[i] = c;
    }
    return out;
  }();
  return t;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto& t = crc_table();
  uint32_t c = 0xffffffffu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) +
                                         "." + host + "." + std::to_string(::getpid()) + ".loongforge"))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  LF_CHECK(!ec && out_.good(), "cannot write TensorBoard events to ", dir, ec ? ": " + ec.message() : std::string(),
           lf::hint("--tensorboard-dir must name a writable directory"));
  std::string e = event(now_seconds(), 0);
  bytes_field(e, 3, "brain.Event:2");
  write_record(e);
  flush();
}

void TensorBoardWriter::write_record(const std::string& data) {
  const uint64_t n = data.size();
  char len[8];
  std::memcpy(len, &n, 8);
  const uint32_t len_crc = masked(crc32c(len, 8)), data_crc = masked(crc32c(data.data(), data.size()));
  out_.write(len, 8);
  out_.write(reinterpret_cast<const char*>(&len_crc), 4);
  out_.write(data.data(), static_cast<std::streamsize>(data.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), 4);
}

void TensorBoardWriter::add_scalar(const std::string& name, double value, int64_t step) {
  // Summary.Value: tag = 1 (string), simple_value = 2 (float); Summary: value = 1 (repeated).
  std::string v;
  bytes_field(v, 1, name);
  tag(v, 2, 5);
  fixed(v, static_cast<float>(value));
  std::string summary;
  bytes_field(summary, 1, v);
  std::string e = event(now_seconds(), step);
  bytes_field(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::flush() {
  out_.flush();
  LF_CHECK(out_.good(), "writing TensorBoard events to ", path_, " failed");
}

}  // namespace lf::train

// A parquet file read whole into memory, its columns handed out as ATen tensors or strings: what
// the LeRobot reader needs of Arrow (lerobot_dataset.cpp). Arrow lives in a module loaded on first
// use (parquet_reader.cpp, libloongforge_parquet_reader.so), so processes that read no parquet do
// not map it. Internal to the data layer; not a general dataframe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lf::data::parquet {

// A parquet file's columns, as the reader module (parquet_reader.cpp) implements them.
class TableSource {
 public:
  virtual ~TableSource() = default;
  virtual int64_t num_rows() const = 0;
  virtual bool has(const std::string& column) const = 0;
  virtual std::vector<std::string> column_names() const = 0;
  virtual at::Tensor tensor(const std::string& column) const = 0;
  virtual std::vector<std::string> strings(const std::string& column) const = 0;
  virtual std::vector<std::vector<std::string>> string_lists(const std::string& column) const = 0;
  virtual std::vector<std::string> struct_binary(const std::string& column,
                                                 const std::string& field) const = 0;
};

class Table {
 public:
  // Reads `path` (an lf::Error naming it when missing or not parquet). `what` says in messages
  // what the file is to the caller ("episode 3's data"). The first call loads the reader module
  // (kReaderModule), and with it Arrow and Parquet.
  static Table read(const std::string& path, const std::string& what = "");

  const std::string& path() const { return path_; }
  int64_t num_rows() const { return source_->num_rows(); }
  bool has(const std::string& column) const { return source_->has(column); }
  std::vector<std::string> column_names() const { return source_->column_names(); }
  // A numeric or boolean column, lists nested to any depth with equal lengths per level (LeRobot's
  // fixed-size vectors, stats' [C, 1, 1]), as a [rows, ...] tensor of the leaf's dtype (float32,
  // float64, int64, int32, int16, int8, uint8, bool). Errors name the file and column: absent,
  // nulls, ragged lists, another type.
  at::Tensor tensor(const std::string& column) const { return source_->tensor(column); }
  std::vector<std::string> strings(const std::string& column) const {
    return source_->strings(column);
  }
  std::vector<std::vector<std::string>> string_lists(const std::string& column) const {
    return source_->string_lists(column);
  }
  // Binary values of a struct column's field (LeRobot's image features: {bytes, path}).
  std::vector<std::string> struct_binary(const std::string& column, const std::string& field) const {
    return source_->struct_binary(column, field);
  }

 private:
  std::string path_;
  std::shared_ptr<const TableSource> source_;
};

// The reader module and its entry point: reads `path` into *out, throwing what Table::read does.
inline constexpr const char* kReaderModule = "libloongforge_parquet_reader.so";
inline constexpr const char* kReadTableSymbol = "lf_parquet_read_table";
using ReadTableFn = void (*)(const std::string& path, const std::string& what,
                             std::shared_ptr<const TableSource>* out);

}  // namespace lf::data::parquet

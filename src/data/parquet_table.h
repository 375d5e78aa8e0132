// A parquet file read whole into memory, its columns handed out as ATen tensors or strings: what
// the LeRobot reader needs of Arrow (lerobot_dataset.cpp), with the Arrow headers kept to one TU.
// Internal to the data layer; not a general dataframe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace arrow {
class Table;
}

namespace lf::data::parquet {

class Table {
 public:
  // Reads `path` (an lf::Error naming it when missing or not parquet). `what` says in messages
  // what the file is to the caller ("episode 3's data").
  static Table read(const std::string& path, const std::string& what = "");

  const std::string& path() const { return path_; }
  int64_t num_rows() const;
  bool has(const std::string& column) const;
  std::vector<std::string> column_names() const;
  // A numeric or boolean column, lists nested to any depth with equal lengths per level (LeRobot's
  // fixed-size vectors, stats' [C, 1, 1]), as a [rows, ...] tensor of the leaf's dtype (float32,
  // float64, int64, int32, int16, int8, uint8, bool). Errors name the file and column: absent,
  // nulls, ragged lists, another type.
  at::Tensor tensor(const std::string& column) const;
  std::vector<std::string> strings(const std::string& column) const;
  std::vector<std::vector<std::string>> string_lists(const std::string& column) const;
  // Binary values of a struct column's field (LeRobot's image features: {bytes, path}).
  std::vector<std::string> struct_binary(const std::string& column, const std::string& field) const;

 private:
  std::string path_;
  std::shared_ptr<arrow::Table> table_;
};

}  // namespace lf::data::parquet

// Table::read (parquet_table.h): the reader module's entry point, loaded on first use.
#include "parquet_table.h"

#include "loongforge/core/modules.h"

namespace lf::data::parquet {

Table Table::read(const std::string& path, const std::string& what) {
  static const auto read_fn = reinterpret_cast<ReadTableFn>(
      lf::module_symbol(kReaderModule, kReadTableSymbol, "reading parquet files (LeRobot datasets)"));
  Table t;
  t.path_ = path;
  read_fn(path, what, &t.source_);
  return t;
}

}  // namespace lf::data::parquet

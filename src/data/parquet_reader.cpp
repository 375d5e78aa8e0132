// The parquet reader module, libloongforge_parquet_reader.so: parquet files through the Arrow C++
// libraries, behind parquet_table.h's TableSource. Loaded by Table::read on first use, so only a
// process that reads a LeRobot dataset maps Arrow and Parquet.
#include "parquet_table.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>

#include <ATen/ops/empty.h>

#include <cstring>
#include <filesystem>

#include "loongforge/core/error.h"

namespace lf::data::parquet {
namespace {

std::string label(const std::string& path, const std::string& what) {
  return what.empty() ? path : path + " (" + what + ")";
}

bool list_like(arrow::Type::type t) {
  return t == arrow::Type::LIST || t == arrow::Type::LARGE_LIST || t == arrow::Type::FIXED_SIZE_LIST;
}

// Leaf element type -> ATen dtype; false for types a tensor cannot hold.
bool scalar_type_of(arrow::Type::type t, at::ScalarType& out) {
  switch (t) {
    case arrow::Type::FLOAT: out = at::kFloat; return true;
    case arrow::Type::DOUBLE: out = at::kDouble; return true;
    case arrow::Type::INT64: out = at::kLong; return true;
    case arrow::Type::INT32: out = at::kInt; return true;
    case arrow::Type::INT16: out = at::kShort; return true;
    case arrow::Type::INT8: out = at::kChar; return true;
    case arrow::Type::UINT8: out = at::kByte; return true;
    case arrow::Type::BOOL: out = at::kBool; return true;
    default: return false;
  }
}

// The list lengths of `a` (all equal, or an error) and its values, in row order.
std::shared_ptr<arrow::Array> flatten_level(const std::shared_ptr<arrow::Array>& a, int64_t& length,
                                            const std::string& where) {
  const int64_t n = a->length();
  auto check_equal = [&](auto* list) {
    length = n > 0 ? int64_t(list->value_length(0)) : 0;
    for (int64_t i = 1; i < n; ++i) {
      LF_CHECK(int64_t(list->value_length(i)) == length, where, ": row ", i, " holds ", list->value_length(i),
               " values, row 0 ", length, lf::hint("a tensor column needs the same shape in every row"));
    }
  };
  arrow::Result<std::shared_ptr<arrow::Array>> flat;
  switch (a->type_id()) {
    case arrow::Type::FIXED_SIZE_LIST: {
      auto* l = static_cast<arrow::FixedSizeListArray*>(a.get());
      length = l->list_type()->list_size();
      flat = l->Flatten();
      break;
    }
    case arrow::Type::LIST: {
      auto* l = static_cast<arrow::ListArray*>(a.get());
      check_equal(l);
      flat = l->Flatten();
      break;
    }
    default: {
      auto* l = static_cast<arrow::LargeListArray*>(a.get());
      check_equal(l);
      flat = l->Flatten();
      break;
    }
  }
  LF_CHECK(flat.ok(), where, ": ", flat.status().ToString());
  return *flat;
}

std::shared_ptr<arrow::Array> single_chunk(const std::shared_ptr<arrow::ChunkedArray>& c, const std::string& where) {
  if (c->num_chunks() == 1) return c->chunk(0);
  if (c->num_chunks() == 0) {
    auto empty = arrow::MakeEmptyArray(c->type());
    LF_CHECK(empty.ok(), where, ": ", empty.status().ToString());
    return *empty;
  }
  auto r = arrow::Concatenate(c->chunks());
  LF_CHECK(r.ok(), where, ": ", r.status().ToString());
  return *r;
}

}  // namespace

class ArrowTable final : public TableSource {
 public:
  ArrowTable(std::string path, std::shared_ptr<arrow::Table> table)
      : path_(std::move(path)), table_(std::move(table)) {}
  int64_t num_rows() const override;
  bool has(const std::string& column) const override;
  std::vector<std::string> column_names() const override;
  at::Tensor tensor(const std::string& column) const override;
  std::vector<std::string> strings(const std::string& column) const override;
  std::vector<std::vector<std::string>> string_lists(const std::string& column) const override;
  std::vector<std::string> struct_binary(const std::string& column, const std::string& field) const override;

 private:
  std::string path_;
  std::shared_ptr<arrow::Table> table_;
};

std::shared_ptr<const TableSource> read_table(const std::string& path, const std::string& what) {
  const std::string name = label(path, what);
  LF_CHECK(std::filesystem::exists(path), name, " is missing",
           lf::hint("the dataset is incomplete: download or copy it again (all of meta/, data/ and videos/)"));
  auto in = arrow::io::ReadableFile::Open(path);
  LF_CHECK(in.ok(), name, ": cannot open (", in.status().ToString(), ")");
  auto reader = ::parquet::arrow::OpenFile(*in, arrow::default_memory_pool());
  LF_CHECK(reader.ok(), name, ": not a readable parquet file (", reader.status().ToString(), ")",
           lf::hint("the file is damaged or truncated: fetch it again"));
  auto table = (*reader)->ReadTable();
  LF_CHECK(table.ok(), name, ": cannot read (", table.status().ToString(), ")");
  return std::make_shared<const ArrowTable>(path, *table);
}

int64_t ArrowTable::num_rows() const { return table_->num_rows(); }

bool ArrowTable::has(const std::string& column) const { return table_->GetColumnByName(column) != nullptr; }

std::vector<std::string> ArrowTable::column_names() const { return table_->ColumnNames(); }

namespace {
std::shared_ptr<arrow::Array> column_array(const arrow::Table& t, const std::string& path, const std::string& column) {
  auto c = t.GetColumnByName(column);
  if (!c) {
    std::string names;
    for (const auto& n : t.ColumnNames()) names += (names.empty() ? "" : ", ") + n;
    LF_FAIL(path, ": no column '", column, "' (columns: ", names, ")",
            lf::hint("the file does not follow the LeRobot layout its meta/info.json declares"));
  }
  return single_chunk(c, path + " column '" + column + "'");
}
}  // namespace

at::Tensor ArrowTable::tensor(const std::string& column) const {
  const std::string where = path_ + " column '" + column + "'";
  std::shared_ptr<arrow::Array> a = column_array(*table_, path_, column);
  std::vector<int64_t> shape{a->length()};
  while (list_like(a->type_id())) {
    LF_CHECK(a->null_count() == 0, where, ": ", a->null_count(), " null rows");
    int64_t length = 0;
    a = flatten_level(a, length, where);
    shape.push_back(length);
  }
  at::ScalarType dtype;
  LF_CHECK(scalar_type_of(a->type_id(), dtype), where, ": values of type ", a->type()->ToString(),
           " cannot become a tensor");
  LF_CHECK(a->null_count() == 0, where, ": ", a->null_count(), " null values");
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  LF_CHECK(out.numel() == a->length(), where, ": ", a->length(), " values for shape ", out.sizes());
  if (dtype == at::kBool) {
    auto* b = static_cast<arrow::BooleanArray*>(a.get());
    auto* dst = out.data_ptr<bool>();
    for (int64_t i = 0; i < b->length(); ++i) dst[i] = b->Value(i);
  } else if (a->length() > 0) {
    // Primitive arrays: values start at the array's offset within its buffer.
    const auto& data = *a->data();
    const int64_t width = int64_t(out.element_size());
    std::memcpy(out.data_ptr(), data.buffers[1]->data() + data.offset * width, size_t(a->length() * width));
  }
  return out;
}

std::vector<std::string> ArrowTable::strings(const std::string& column) const {
  std::shared_ptr<arrow::Array> a = column_array(*table_, path_, column);
  std::vector<std::string> out;
  out.reserve(size_t(a->length()));
  if (a->type_id() == arrow::Type::STRING) {
    auto* s = static_cast<arrow::StringArray*>(a.get());
    for (int64_t i = 0; i < s->length(); ++i) out.push_back(s->GetString(i));
  } else if (a->type_id() == arrow::Type::LARGE_STRING) {
    auto* s = static_cast<arrow::LargeStringArray*>(a.get());
    for (int64_t i = 0; i < s->length(); ++i) out.push_back(s->GetString(i));
  } else {
    LF_FAIL(path_, " column '", column, "': ", a->type()->ToString(), ", not strings");
  }
  return out;
}

std::vector<std::vector<std::string>> ArrowTable::string_lists(const std::string& column) const {
  std::shared_ptr<arrow::Array> a = column_array(*table_, path_, column);
  LF_CHECK(a->type_id() == arrow::Type::LIST || a->type_id() == arrow::Type::LARGE_LIST, path_, " column '", column,
           "': ", a->type()->ToString(), ", not lists of strings");
  std::vector<std::vector<std::string>> out(size_t(a->length()));
  for (int64_t i = 0; i < a->length(); ++i) {
    std::shared_ptr<arrow::Array> v = a->type_id() == arrow::Type::LIST
                                          ? static_cast<arrow::ListArray*>(a.get())->value_slice(i)
                                          : static_cast<arrow::LargeListArray*>(a.get())->value_slice(i);
    if (v->type_id() == arrow::Type::LARGE_STRING) {
      auto* s = static_cast<arrow::LargeStringArray*>(v.get());
      for (int64_t k = 0; k < s->length(); ++k) out[size_t(i)].push_back(s->GetString(k));
      continue;
    }
    LF_CHECK(v->type_id() == arrow::Type::STRING, path_, " column '", column, "': lists of ",
             v->type()->ToString(), ", not strings");
    auto* s = static_cast<arrow::StringArray*>(v.get());
    for (int64_t k = 0; k < s->length(); ++k) out[size_t(i)].push_back(s->GetString(k));
  }
  return out;
}

std::vector<std::string> ArrowTable::struct_binary(const std::string& column, const std::string& field) const {
  std::shared_ptr<arrow::Array> a = column_array(*table_, path_, column);
  LF_CHECK(a->type_id() == arrow::Type::STRUCT, path_, " column '", column, "': ", a->type()->ToString(),
           ", not a struct");
  auto f = static_cast<arrow::StructArray*>(a.get())->GetFieldByName(field);
  LF_CHECK(f != nullptr, path_, " column '", column, "': no field '", field, "'");
  std::vector<std::string> out;
  out.reserve(size_t(f->length()));
  if (f->type_id() == arrow::Type::BINARY) {
    auto* b = static_cast<arrow::BinaryArray*>(f.get());
    for (int64_t i = 0; i < b->length(); ++i) out.push_back(b->GetString(i));
  } else if (f->type_id() == arrow::Type::LARGE_BINARY) {
    auto* b = static_cast<arrow::LargeBinaryArray*>(f.get());
    for (int64_t i = 0; i < b->length(); ++i) out.push_back(b->GetString(i));
  } else {
    LF_FAIL(path_, " column '", column, "' field '", field, "': ", f->type()->ToString(), ", not binary");
  }
  return out;
}

}  // namespace lf::data::parquet

// The module's entry point (parquet_table.h: ReadTableFn).
extern "C" __attribute__((visibility("default"))) void lf_parquet_read_table(
    const std::string& path, const std::string& what,
    std::shared_ptr<const lf::data::parquet::TableSource>* out) {
  *out = lf::data::parquet::read_table(path, what);
}

#include "loongforge/data/batch.h"

#include <algorithm>
#include <sstream>

#include "loongforge/core/error.h"

namespace lf::data {

void TensorMap::set(const std::string& name, at::Tensor tensor) {
  for (auto& [n, t] : items_)
    if (n == name) {
      t = std::move(tensor);
      return;
    }
  items_.emplace_back(name, std::move(tensor));
}

const at::Tensor* TensorMap::find(const std::string& name) const {
  for (const auto& [n, t] : items_)
    if (n == name) return &t;
  return nullptr;
}

const at::Tensor& TensorMap::at(const std::string& name) const {
  const at::Tensor* t = find(name);
  if (!t) {
    std::string present;
    for (const auto& [n, _] : items_) present += (present.empty() ? "" : ", ") + n;
    LF_FAIL("no tensor named '", name, "' (present: ", present.empty() ? "none" : present, ")",
            lf::hint("the model reads a field the data source or the previous pipeline stage does "
                     "not provide"));
  }
  return *t;
}

void TensorMap::erase(const std::string& name) {
  items_.erase(std::remove_if(items_.begin(), items_.end(), [&](const Item& i) { return i.first == name; }),
               items_.end());
}

std::string TensorMap::describe() const {
  std::ostringstream os;
  for (size_t i = 0; i < items_.size(); ++i) {
    const auto& [n, t] = items_[i];
    os << (i ? ", " : "") << n << " ";
    if (t.defined())
      os << t.sizes() << " " << c10::toString(t.scalar_type());
    else
      os << "(undefined)";
  }
  return os.str();
}

void Batch::set(const std::string& name, at::Tensor tensor, int64_t sequence_dim) {
  LF_CHECK(tensor.defined(), "batch field '", name, "' is undefined");
  LF_CHECK(sequence_dim < tensor.dim(), "batch field '", name, "' of shape ", tensor.sizes(),
           " has no sequence dim ", sequence_dim);
  fields_.set(name, std::move(tensor));
  auto it = std::find_if(sequence_dims_.begin(), sequence_dims_.end(), [&](const auto& p) { return p.first == name; });
  if (it != sequence_dims_.end())
    it->second = sequence_dim;
  else
    sequence_dims_.emplace_back(name, sequence_dim);
}

int64_t Batch::sequence_dim(const std::string& name) const {
  for (const auto& [n, d] : sequence_dims_)
    if (n == name) return d;
  return -1;
}

Batch Batch::slice_sequence(int64_t start, int64_t length) const {
  Batch out;
  out.sample_indices = sample_indices;
  for (const auto& [name, t] : fields_.items()) {
    const int64_t d = sequence_dim(name);
    if (d < 0) {
      out.set(name, t, -1);
      continue;
    }
    LF_CHECK(start >= 0 && length >= 0 && start + length <= t.size(d), "batch field '", name, "' of shape ",
             t.sizes(), ": positions [", start, ", ", start + length, ") are outside its sequence of ",
             t.size(d));
    out.set(name, t.narrow(d, start, length), d);
  }
  return out;
}

Batch Batch::to(const c10::Device& device) const {
  Batch out;
  out.sample_indices = sample_indices;
  for (const auto& [name, t] : fields_.items()) out.set(name, t.device() == device ? t : t.to(device), sequence_dim(name));
  return out;
}

int64_t Batch::samples() const { return fields_.empty() ? 0 : fields_.items().front().second.size(0); }

}  // namespace lf::data

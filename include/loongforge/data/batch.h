// Named tensors: TensorMap (an ordered set of name -> tensor, what pipeline stages exchange) and
// Batch (one micro-batch as the trainer hands it to a model: `tokens`, `labels`, `loss_mask`,
// `position_ids`, `features`, later `pixel_values`, `timesteps`, `actions` ...), whose
// sequence-aligned fields can be sliced (ChunkPipe). Only containers: which fields a model
// reads, and what they mean, is the model's business (models/model.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lf::data {

// Insertion-ordered name -> tensor. Order matters: both ends of a pipeline exchange walk it.
class TensorMap {
 public:
  using Item = std::pair<std::string, at::Tensor>;

  // Adds `name`, or replaces its tensor keeping its place.
  void set(const std::string& name, at::Tensor tensor);
  // The tensor of `name`; an lf::Error naming the missing field and the present ones otherwise.
  const at::Tensor& at(const std::string& name) const;
  // nullptr when absent.
  const at::Tensor* find(const std::string& name) const;
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  void erase(const std::string& name);

  const std::vector<Item>& items() const { return items_; }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  // "tokens [2, 16] Long, labels [2, 16] Long": for messages.
  std::string describe() const;

 private:
  std::vector<Item> items_;
};

// One micro-batch. Every field's dim 0 is the sample; fields set with a sequence dim (tokens,
// labels, loss_mask, position_ids ... : dim 1) are cut by slice_sequence.
class Batch {
 public:
  void set(const std::string& name, at::Tensor tensor, int64_t sequence_dim = -1);
  const at::Tensor& at(const std::string& name) const { return fields_.at(name); }
  const at::Tensor* find(const std::string& name) const { return fields_.find(name); }
  bool contains(const std::string& name) const { return fields_.contains(name); }
  const TensorMap& fields() const { return fields_; }
  int64_t sequence_dim(const std::string& name) const;

  // Positions [start, start + length) of every sequence field; other fields unchanged.
  Batch slice_sequence(int64_t start, int64_t length) const;
  // Every field on `device` (a no-op for fields already there).
  Batch to(const c10::Device& device) const;
  // Samples in the batch (dim 0 of its fields; 0 when empty).
  int64_t samples() const;

  // The global indices of the samples (dataset order), when the source knows them: lets a model
  // derive per-sample data (mock features) that does not depend on the data-parallel layout.
  std::vector<int64_t> sample_indices;

 private:
  TensorMap fields_;
  std::vector<std::pair<std::string, int64_t>> sequence_dims_;
};

}  // namespace lf::data

#include "loongforge/parallel/data/grad_buffer.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <limits>

#include "loongforge/backend/mixed_add.h"
#include "loongforge/core/error.h"

namespace lf::parallel {
namespace {

// Runs after AccumulateGrad has stored the parameter's gradient in .grad: moves it into the
// fp32 main-gradient slot (Megatron's main_grad) so .grad never outlives one backward.
struct MainGradHook : torch::autograd::PostAccumulateGradHook {
  MainGradHook(GradBuffer* buffer, int index) : buffer(buffer), index(index) {}
  void operator()(const torch::autograd::Variable& /*param*/) override {
    buffer->on_grad_ready(index);
  }
  GradBuffer* buffer;
  int index;
};

bool active(const lf::backend::Communicator* c) { return c && c->size() > 1; }

}  // namespace

GradBuffer::GradBuffer(std::vector<Parameter> params,
                       lf::backend::Communicator* dp, lf::backend::Communicator* tp,
                       GradBufferOptions options)
    : params_(std::move(params)), dp_(dp), tp_(tp), options_(options) {
  LF_CHECK(!params_.empty(), "GradBuffer: no parameters");
  const int64_t dp_n = dp_size();
  const int64_t limit = options_.bucket_size > 0 ? options_.bucket_size
                                                 : std::numeric_limits<int64_t>::max();
  slots_.resize(params_.size());
  // Reverse registration order: backward produces the last layers' gradients first, so bucket 0
  // completes first and its reduction overlaps with the rest of backward.
  int64_t offset = 0;
  GradBucket current;
  auto close = [&] {
    if (current.params.empty()) return;
    current.numel = offset - current.offset;
    if (options_.distributed_optimizer) {  // equal shards need a multiple of dp
      const int64_t padded = (current.numel + dp_n - 1) / dp_n * dp_n;
      offset += padded - current.numel;
      current.numel = padded;
    }
    buckets_.push_back(current);
    current = GradBucket{};
    current.offset = offset;
  };
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    const auto& p = params_[static_cast<size_t>(i)];
    LF_CHECK(p.tensor.defined() && p.tensor.requires_grad() && p.tensor.is_leaf(), "parameter ",
             p.name, " is not a leaf tensor that requires grad");
    if (!current.params.empty() && p.tensor.scalar_type() != current.param_dtype) close();
    if (current.params.empty()) current.param_dtype = p.tensor.scalar_type();
    GradSlot& s = slots_[static_cast<size_t>(i)];
    s.offset = offset;
    s.numel = p.tensor.numel();
    s.bucket = static_cast<int>(buckets_.size());
    current.params.push_back(i);
    offset += s.numel;
    if (offset - current.offset >= limit) close();
  }
  close();
  if (!params_.empty()) has_sequence_parallel_ = std::any_of(
      params_.begin(), params_.end(), [](const auto& p) { return p.sequence_parallel; });

  const auto device = params_.front().tensor.device();
  buffer_ = at::zeros({offset}, at::TensorOptions().dtype(at::kFloat).device(device));
  const int64_t rank = dp_rank();
  for (auto& b : buckets_) {
    if (options_.distributed_optimizer) {
      const int64_t shard = b.numel / dp_n;
      b.owned_begin = b.offset + rank * shard;
      b.owned_end = b.owned_begin + shard;
      reduced_.push_back(dp_n > 1 ? at::zeros({shard}, buffer_.options())
                                  : buffer_.narrow(0, b.owned_begin, shard));
    } else {
      b.owned_begin = b.offset;
      b.owned_end = b.offset + b.numel;
      reduced_.push_back(buffer_.narrow(0, b.offset, b.numel));
    }
  }
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (int i : buckets_[b].params) {
      const auto& s = slots_[static_cast<size_t>(i)];
      const int64_t begin = std::max(s.offset, buckets_[b].owned_begin);
      const int64_t end = std::min(s.offset + s.numel, buckets_[b].owned_end);
      if (end > begin)
        pieces_.push_back({i, static_cast<int>(b), begin - s.offset,
                           begin - buckets_[b].owned_begin, end - begin});
    }
  stale_.assign(params_.size(), false);  // the buffer starts zeroed
  work_.resize(buckets_.size());
  pending_.resize(buckets_.size());
  launched_.resize(buckets_.size());
  zero_grad();
  for (size_t i = 0; i < params_.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(
        params_[i].tensor, std::make_unique<MainGradHook>(this, static_cast<int>(i)));
}

GradBuffer::~GradBuffer() {
  for (auto& p : params_) torch::autograd::impl::post_acc_grad_hooks(p.tensor).reset();
}

int GradBuffer::dp_size() const { return active(dp_) ? dp_->size() : 1; }
int GradBuffer::dp_rank() const { return active(dp_) ? dp_->rank() : 0; }

at::Tensor GradBuffer::main_grad(int i) const {
  if (stale_[static_cast<size_t>(i)]) {  // what was accumulated this step: nothing yet
    at::NoGradGuard no_grad;
    slot_view(i).zero_();
    stale_[static_cast<size_t>(i)] = false;
  }
  return slot_view(i);
}

const at::Tensor& GradBuffer::main_grad() const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (stale_[i]) main_grad(static_cast<int>(i));
  return buffer_;
}

at::Tensor GradBuffer::slot_view(int i) const {
  const auto& s = slots_[static_cast<size_t>(i)];
  return buffer_.narrow(0, s.offset, s.numel).view(params_[static_cast<size_t>(i)].tensor.sizes());
}

void GradBuffer::begin_micro_batch(bool is_last) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_micro_batch_ = is_last;
  hooks_fired_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b)
    pending_[b] = static_cast<int>(buckets_[b].params.size());
}

void GradBuffer::on_grad_ready(int i) {
  RECORD_USER_SCOPE("lf::grad_accumulate");
  std::lock_guard<std::mutex> lock(mutex_);
  auto& p = params_[static_cast<size_t>(i)].tensor;
  const auto& s = slots_[static_cast<size_t>(i)];
  LF_CHECK(!launched_[static_cast<size_t>(s.bucket)], "gradient of ",
           params_[static_cast<size_t>(i)].name,
           " arrived after its bucket's reduction started (a second backward on the last "
           "micro-batch?)",
           lf::hint("call begin_micro_batch(is_last) before each micro-batch's backward"));
  {
    at::NoGradGuard no_grad;
    at::Tensor g = p.grad();
    if (g.defined()) {
      // The first gradient of the step is copied in (the buffer was not zeroed: zero_grad marks
      // every slot stale instead of filling the whole buffer); later ones are added.
      if (stale_[static_cast<size_t>(i)])
        slot_view(i).copy_(g);  // fp32 = param-dtype gradient
      else
        lf::ops::add_converted(slot_view(i), g);  // fp32 += param-dtype gradient
      stale_[static_cast<size_t>(i)] = false;
      p.mutable_grad() = at::Tensor();
    }
  }
  ++hooks_fired_;
  if (!last_micro_batch_) return;
  if (--pending_[static_cast<size_t>(s.bucket)] == 0 && options_.overlap_grad_reduce)
    launch_ready_in_order();
}

GradBuffer::DirectSlot GradBuffer::direct_slot(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].tensor.is_same(param)) continue;
    const auto& s = slots_[i];
    if (launched_[static_cast<size_t>(s.bucket)]) return {};
    DirectSlot d{static_cast<int>(i), slot_view(static_cast<int>(i)), !stale_[i]};
    stale_[i] = false;  // the writer writes the whole slot now; later gradients add
    return d;
  }
  return {};
}

// Buckets start strictly in index order, so every DP rank issues the same sequence of
// collectives even if two buckets complete in a different order on different ranks.
void GradBuffer::launch_ready_in_order() {
  while (next_launch_ < static_cast<int>(buckets_.size()) &&
         pending_[static_cast<size_t>(next_launch_)] == 0) {
    buckets_[static_cast<size_t>(next_launch_)].launched_after_hooks = hooks_fired_;
    launch(next_launch_++);
  }
}

void GradBuffer::launch(int b) {
  auto& bucket = buckets_[static_cast<size_t>(b)];
  launched_[static_cast<size_t>(b)] = true;
  if (!active(dp_)) return;
  at::NoGradGuard no_grad;
  at::Tensor view = buffer_.narrow(0, bucket.offset, bucket.numel);
  if (options_.average) view.div_(static_cast<double>(dp_->size()));
  if (options_.distributed_optimizer)
    work_[static_cast<size_t>(b)] = dp_->reduce_scatter(reduced_[static_cast<size_t>(b)], view,
                                                        lf::backend::ReduceOp::sum, true);
  else
    work_[static_cast<size_t>(b)] = dp_->all_reduce(view, lf::backend::ReduceOp::sum, true);
}

void GradBuffer::finish_grad_sync() {
  RECORD_USER_SCOPE("lf::grad_sync");
  std::lock_guard<std::mutex> lock(mutex_);
  zero_stale();  // parameters that got no gradient this step (their buckets have not launched)
  while (next_launch_ < static_cast<int>(buckets_.size())) launch(next_launch_++);
  for (auto& w : work_)
    if (w) {
      w->wait();
      w.reset();
    }
  if (!has_sequence_parallel_ || !active(tp_)) return;
  // Sequence-parallel parameters (replicated over TP, applied to sequence shards) have partial
  // gradients on each TP rank. Summing after the DP reduction equals summing before (both are
  // sums), and TP peers own the same ranges (same layout), so only the owned part is needed.
  std::vector<at::Tensor> pieces;
  for (const auto& piece : pieces_)
    if (params_[static_cast<size_t>(piece.param)].sequence_parallel)
      pieces.push_back(reduced_[static_cast<size_t>(piece.bucket)].narrow(0, piece.reduced_offset,
                                                                          piece.numel));
  if (pieces.empty()) return;
  at::NoGradGuard no_grad;
  at::Tensor flat = at::cat(pieces);
  tp_->all_reduce(flat, lf::backend::ReduceOp::sum);
  int64_t at_ = 0;
  for (auto& piece : pieces) {
    piece.copy_(flat.narrow(0, at_, piece.numel()));
    at_ += piece.numel();
  }
}

void GradBuffer::zero_stale() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i)
    if (stale_[i]) {
      slot_view(static_cast<int>(i)).zero_();
      stale_[i] = false;
    }
}

void GradBuffer::zero_unreported() {
  std::lock_guard<std::mutex> lock(mutex_);
  zero_stale();
}

void GradBuffer::zero_grad() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Not a fill of the whole buffer: each slot is marked stale and its first gradient of the next
  // step is copied in (finish_grad_sync zeroes the slots that got none). Padding (ZeRO-1) stays 0.
  std::fill(stale_.begin(), stale_.end(), true);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (options_.distributed_optimizer && dp_size() > 1) reduced_[b].zero_();
    pending_[b] = static_cast<int>(buckets_[b].params.size());
    launched_[b] = false;
    buckets_[b].launched_after_hooks = -1;
    work_[b].reset();
  }
  for (auto& p : params_)
    if (p.tensor.grad().defined()) p.tensor.mutable_grad() = at::Tensor();
  next_launch_ = 0;
  last_micro_batch_ = true;
  hooks_fired_ = 0;
}

}  // namespace lf::parallel

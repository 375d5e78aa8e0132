#include "loongforge/parallel/data/master_params.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include "loongforge/core/error.h"

namespace lf::parallel {
namespace {
bool gathers(const GradBuffer& g) { return g.options().distributed_optimizer && g.dp_size() > 1; }

// fp32 parameters: the parameters can be their own masters (under ZeRO-1 each rank updates its
// shard of the flat buffer in place and the all-gather fills in the rest).
bool aliasable(const GradBuffer& g) {
  for (const auto& p : g.parameters())
    if (p.tensor.scalar_type() != at::kFloat || p.tensor.device() != g.main_grad().device()) return false;
  return true;
}

// The flat fp32 buffer the parameters already live in, laid out as the gradient buffer (a second
// optimizer over the same buffer), or an undefined tensor.
at::Tensor existing_flat(const GradBuffer& g) {
  const auto& params = g.parameters();
  const auto& first = params.front().tensor;
  if (!first.has_storage()) return {};
  const int64_t total = g.main_grad().numel();
  if (static_cast<int64_t>(first.storage().nbytes()) < total * 4) return {};
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& t = params[i].tensor;
    if (!t.is_contiguous() || !t.storage().is_alias_of(first.storage()) ||
        t.storage_offset() != g.slots()[i].offset)
      return {};
  }
  at::Tensor flat = at::empty({0}, g.main_grad().options());
  flat.set_(first.storage(), 0, {total}, {1});
  return flat;
}
}  // namespace

MasterParams::MasterParams(const GradBuffer& grads) : grads_(grads) {
  at::NoGradGuard no_grad;
  const auto& buckets = grads.buckets();
  const auto options = grads.main_grad().options();  // fp32 on the parameters' device
  if (aliasable(grads)) {
    // Megatron's fp32 case (params are masters): the parameters move into one flat buffer laid
    // out as the gradient buffer (ZeRO-1 padding included), and each bucket's master shard is a
    // view of it, so the optimizer updates the model in place: publish() copies nothing, and
    // under ZeRO-1 gathers the other ranks' shards straight into the buffer.
    aliased_ = true;
    at::Tensor flat = existing_flat(grads);
    if (!flat.defined()) {
      flat = at::zeros({grads.main_grad().numel()}, options);
      const auto& params = grads.parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& slot = grads.slots()[i];
        at::Tensor view = flat.narrow(0, slot.offset, slot.numel).view(params[i].tensor.sizes());
        view.copy_(params[i].tensor.detach());
        params[i].tensor.set_data(view);  // the same parameter (autograd identity), new storage
      }
    }
    flat_ = flat;
    for (const auto& b : buckets) shards_.push_back(flat.narrow(0, b.owned_begin, b.owned_end - b.owned_begin));
    return;
  }
  for (const auto& b : buckets) {
    shards_.push_back(at::zeros({b.owned_end - b.owned_begin}, options));
    if (gathers(grads))
      gathered_.push_back(at::empty({b.numel}, options.dtype(b.param_dtype)));
  }
  reset_from_model();
}

void MasterParams::reset_from_model() {
  if (aliased_) return;  // the masters are the model
  at::NoGradGuard no_grad;
  const auto& params = grads_.parameters();
  for (const auto& piece : grads_.owned_pieces()) {
    at::Tensor flat = params[static_cast<size_t>(piece.param)].tensor.detach().reshape({-1});
    shards_[static_cast<size_t>(piece.bucket)]
        .narrow(0, piece.reduced_offset, piece.numel)
        .copy_(flat.narrow(0, piece.param_offset, piece.numel));
  }
}

void MasterParams::publish() {
  at::NoGradGuard no_grad;
  const auto& params = grads_.parameters();
  const auto& buckets = grads_.buckets();
  if (aliased_) {  // updated in place; under ZeRO-1 the other shards arrive in place
    if (!gathers(grads_)) return;
    std::vector<std::shared_ptr<lf::backend::Work>> work;
    for (size_t b = 0; b < buckets.size(); ++b) {
      at::Tensor out = flat_.narrow(0, buckets[b].offset, buckets[b].numel);
      work.push_back(grads_.dp()->all_gather(out, shards_[b], true));
    }
    for (auto& w : work) w->wait();
    return;
  }
  if (!gathers(grads_)) {
    for (const auto& piece : grads_.owned_pieces()) {
      at::Tensor p = params[static_cast<size_t>(piece.param)].tensor.detach();
      LF_CHECK(p.is_contiguous(), "parameter ", params[static_cast<size_t>(piece.param)].name,
               " is not contiguous");
      p.view({-1})
          .narrow(0, piece.param_offset, piece.numel)
          .copy_(shards_[static_cast<size_t>(piece.bucket)].narrow(0, piece.reduced_offset,
                                                                   piece.numel));
    }
    return;
  }
  // ZeRO-1: gather the rounded shards; every rank then copies whole parameters out.
  std::vector<std::shared_ptr<lf::backend::Work>> work;
  std::vector<at::Tensor> inputs;
  for (size_t b = 0; b < buckets.size(); ++b) {
    inputs.push_back(shards_[b].to(buckets[b].param_dtype));
    work.push_back(grads_.dp()->all_gather(gathered_[b], inputs.back(), true));
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    work[b]->wait();
    for (int i : buckets[b].params) {
      const auto& slot = grads_.slots()[static_cast<size_t>(i)];
      at::Tensor p = params[static_cast<size_t>(i)].tensor.detach();
      p.copy_(gathered_[b].narrow(0, slot.offset - buckets[b].offset, slot.numel).view(p.sizes()));
    }
  }
}

int64_t MasterParams::bytes() const {
  if (aliased_) return 0;  // views of the model's own parameters
  int64_t n = 0;
  for (const auto& s : shards_) n += s.numel() * static_cast<int64_t>(s.element_size());
  return n;
}

}  // namespace lf::parallel

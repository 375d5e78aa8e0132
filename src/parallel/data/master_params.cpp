#include "loongforge/parallel/data/master_params.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include "loongforge/core/error.h"

namespace lf::parallel {
namespace {
bool gathers(const GradBuffer& g) { return g.options().distributed_optimizer && g.dp_size() > 1; }
}  // namespace

MasterParams::MasterParams(const GradBuffer& grads) : grads_(grads) {
  at::NoGradGuard no_grad;
  const auto& buckets = grads.buckets();
  const auto options = grads.main_grad().options();  // fp32 on the parameters' device
  for (const auto& b : buckets) {
    shards_.push_back(at::zeros({b.owned_end - b.owned_begin}, options));
    if (gathers(grads))
      gathered_.push_back(at::empty({b.numel}, options.dtype(b.param_dtype)));
  }
  reset_from_model();
}

void MasterParams::reset_from_model() {
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
  int64_t n = 0;
  for (const auto& s : shards_) n += s.numel() * static_cast<int64_t>(s.element_size());
  return n;
}

}  // namespace lf::parallel

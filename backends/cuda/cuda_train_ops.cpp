// CudaOps' output layer + cross entropy, optimizer, MoE (un)permutation and DSA indexer ops
// through kernels/ (cross_entropy.cu with backend/chunked_cross_entropy.h's driver, optimizer.cu,
// moe.cu, dsa_indexer.cu): CUDA tensors of fp32/bf16/fp16 storage; anything else (fp64, mixed
// devices, non-contiguous optimizer state) takes the reference, which also gives the argument
// errors their messages. The op harness holds each to the CPU reference on a GPU machine; the
// kernels' per-item math is also run on the host by tests/backend/test_cuda_kernel_math.cpp.
#include <ATen/Functions.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "cuda_kernel_call.h"
#include "cuda_ops.h"
#include "loongforge/backend/chunked_cross_entropy.h"

namespace lf::backend::cuda {
namespace {

constexpr int64_t kChunk = int64_t{1} << 16;  // elements per block of the multi-tensor kernels

bool on_cuda(at::TensorList ts, const c10::Device& device) {
  for (const auto& t : ts)
    if (!t.is_cuda() || t.device() != device || !t.is_contiguous()) return false;
  return true;
}

// values as an int64 [rows, cols] tensor on device: staged in pinned memory and copied on the
// current stream without waiting (the caching host allocator keeps the staging block until the
// copy has run).
at::Tensor to_device(const std::vector<int64_t>& values, int64_t cols, const c10::Device& device) {
  const auto rows = static_cast<int64_t>(values.size()) / cols;
  at::Tensor host = at::empty({rows, cols}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::copy(values.begin(), values.end(), host.data_ptr<int64_t>());
  return host.to(device, /*non_blocking=*/true);
}

// The chunk table [chunks, 2] (tensor, first element) of tensors with these sizes, on device.
at::Tensor chunk_table(const std::vector<int64_t>& numels, const c10::Device& device) {
  std::vector<int64_t> flat;
  for (size_t t = 0; t < numels.size(); ++t)
    for (int64_t first = 0; first < numels[t]; first += kChunk) {
      flat.push_back(static_cast<int64_t>(t));
      flat.push_back(first);
    }
  return to_device(flat, 2, device);
}

// The cross entropy's row passes on the GPU (kernels/cross_entropy.cu); the weight gradient's GEMM
// accumulates in fp32 (cuBLAS with an fp32 output for bf16/fp16 operands).
class CudaCrossEntropyRows final : public CrossEntropyRowOps {
 public:
  explicit CudaCrossEntropyRows(cuda_kernels::DType dtype) : dtype_(dtype) {}
  at::Tensor row_max(const at::Tensor& z) const override {
    at::Tensor m = at::empty({z.size(0)}, z.options().dtype(at::kFloat));
    run(cuda_kernels::CeRowStep::max, z, m, {}, {}, {}, {});
    return m;
  }
  at::Tensor exp_sums(const at::Tensor& z, const at::Tensor& m, const at::Tensor& safe,
                      const at::Tensor& mine) const override {
    at::Tensor sums = at::empty({2, z.size(0)}, z.options().dtype(at::kFloat));
    run(cuda_kernels::CeRowStep::exp_sums, z, m, sums, safe, mine, {});
    return sums;
  }
  void grad_in_place(at::Tensor& z, const at::Tensor& m, const at::Tensor& sums, const at::Tensor& safe,
                     const at::Tensor& mine, const at::Tensor& wt) const override {
    run(cuda_kernels::CeRowStep::grad, z, m, sums, safe, mine, wt);
  }
  void add_weight_grad(at::Tensor& dw, const at::Tensor& dz, const at::Tensor& x, bool write,
                       double alpha) const override {
    const double beta = write ? 0.0 : 1.0;  // 0: dw's old contents are not read
    if (dz.scalar_type() == at::kFloat)
      at::addmm_out(dw, dw, dz.t(), x, beta, alpha);
    else
      at::addmm_out(dw, dw, dz.t(), x, at::kFloat, beta, alpha);
  }

 private:
  void run(cuda_kernels::CeRowStep step, const at::Tensor& z, const at::Tensor& m, const at::Tensor& sums,
           const at::Tensor& safe, const at::Tensor& mine, const at::Tensor& wt) const {
    auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; };
    check_launch(cuda_kernels::cross_entropy_rows(step, z.data_ptr(), static_cast<float*>(ptr(m)),
                                                  static_cast<float*>(ptr(sums)),
                                                  static_cast<const int64_t*>(ptr(safe)),
                                                  static_cast<const bool*>(ptr(mine)),
                                                  static_cast<const float*>(ptr(wt)), z.size(0), z.size(1), dtype_,
                                                  stream_of(z)),
                 "cross_entropy_rows");
  }
  cuda_kernels::DType dtype_;
};

}  // namespace

LinearCrossEntropyFwd CudaOps::linear_cross_entropy(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                                                    const at::Tensor& weight, int64_t ignore_index,
                                                    const VocabShard& shard, int64_t chunk_tokens,
                                                    const GradInto& into) const {
  check_linear_cross_entropy_args(x, w, target, weight, shard);
  check_grad_into(into, w);
  const auto dt = kernel_dtype(x.scalar_type());
  const auto dev = x.device();
  if (!x.is_cuda() || !dt || w.device() != dev || target.device() != dev || weight.device() != dev ||
      (into.dw.defined() && into.dw.device() != dev))
    return ReferenceOps::linear_cross_entropy(x, w, target, weight, ignore_index, shard, chunk_tokens, into);
  const c10::cuda::CUDAGuard guard(dev);
  // Default chunk: 256 MiB of logits in x's dtype (1024 rows of a 128K bf16 vocabulary shard), at
  // least 128 rows so the weight gradient's GEMM is not thin. From w's rows, which every TP rank
  // shares (valid differs on the rank holding the padding): the ranks' reductions must match.
  const int64_t chunk =
      chunk_tokens > 0 ? chunk_tokens
                       : std::max<int64_t>(128, (int64_t{256} << 20) / (x.element_size() * std::max<int64_t>(1, w.size(0))));
  return chunked_linear_cross_entropy(x, w, target, weight, ignore_index, shard, chunk, into,
                                      CudaCrossEntropyRows(*dt));
}

void CudaOps::adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avg,
                         at::TensorList exp_avg_sq, const AdamWHyper& hp) const {
  const size_t k = params.size();
  if (k == 0 || grads.size() != k || exp_avg.size() != k || exp_avg_sq.size() != k || hp.step < 1)
    return ReferenceOps::adamw_step(params, grads, exp_avg, exp_avg_sq, hp);  // checks and messages
  const c10::Device device = params[0].device();
  bool fits = on_cuda(params, device) && on_cuda(grads, device) && on_cuda(exp_avg, device) &&
              on_cuda(exp_avg_sq, device);
  for (size_t i = 0; fits && i < k; ++i)
    fits = params[i].scalar_type() == at::kFloat && exp_avg[i].scalar_type() == at::kFloat &&
           exp_avg_sq[i].scalar_type() == at::kFloat && kernel_dtype(grads[i].scalar_type()).has_value();
  if (!fits) return ReferenceOps::adamw_step(params, grads, exp_avg, exp_avg_sq, hp);
  // One launch per gradient dtype (usually one: fp32 main grads).
  std::map<int, std::vector<size_t>> by_dtype;
  for (size_t i = 0; i < k; ++i) {
    const auto& p = params[i];
    LF_CHECK(grads[i].sizes() == p.sizes() && exp_avg[i].sizes() == p.sizes() && exp_avg_sq[i].sizes() == p.sizes(),
             "adamw_step: tensor ", i, " shapes differ: param ", p.sizes(), ", grad ", grads[i].sizes(),
             ", exp_avg ", exp_avg[i].sizes(), ", exp_avg_sq ", exp_avg_sq[i].sizes());
    by_dtype[static_cast<int>(*kernel_dtype(grads[i].scalar_type()))].push_back(i);
  }
  // The reference's ATen ops take their scalars as fp32 for fp32 tensors: so do the constants.
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const cuda_kernels::AdamWConsts consts{
      static_cast<float>(hp.grad_scale),
      static_cast<float>(1.0 - hp.lr * hp.weight_decay),
      hp.weight_decay != 0,
      static_cast<float>(hp.beta1),
      static_cast<float>(1.0 - hp.beta1),
      static_cast<float>(hp.beta2),
      static_cast<float>(1.0 - hp.beta2),
      static_cast<float>(std::sqrt(1.0 - std::pow(hp.beta2, static_cast<double>(hp.step)))),
      static_cast<float>(hp.eps),
      static_cast<float>(-hp.lr / bc1)};
  const c10::cuda::CUDAGuard guard(device);
  for (const auto& [dtype, members] : by_dtype) {
    std::vector<int64_t> table, numels;
    for (size_t i : members) {
      table.insert(table.end(), {reinterpret_cast<int64_t>(params[i].data_ptr()),
                                 reinterpret_cast<int64_t>(grads[i].data_ptr()),
                                 reinterpret_cast<int64_t>(exp_avg[i].data_ptr()),
                                 reinterpret_cast<int64_t>(exp_avg_sq[i].data_ptr()), params[i].numel()});
      numels.push_back(params[i].numel());
    }
    const at::Tensor dev_table = to_device(table, 5, device);
    const at::Tensor chunks = chunk_table(numels, device);
    check_launch(cuda_kernels::adamw_multi(dev_table.data_ptr<int64_t>(), chunks.data_ptr<int64_t>(),
                                           chunks.size(0), kChunk, consts,
                                           static_cast<cuda_kernels::DType>(dtype), stream_of(params[0])),
                 "adamw_multi");
  }
}

at::Tensor CudaOps::squared_norm(at::TensorList tensors) const {
  if (tensors.empty() || !on_cuda(tensors, tensors[0].device())) return ReferenceOps::squared_norm(tensors);
  for (const auto& t : tensors)
    if (!kernel_dtype(t.scalar_type())) return ReferenceOps::squared_norm(tensors);
  const c10::Device device = tensors[0].device();
  const c10::cuda::CUDAGuard guard(device);
  std::vector<int64_t> table, numels;
  for (const auto& t : tensors) {
    table.insert(table.end(), {reinterpret_cast<int64_t>(t.data_ptr()), t.numel(),
                               static_cast<int64_t>(*kernel_dtype(t.scalar_type()))});
    numels.push_back(t.numel());
  }
  const at::Tensor dev_table = to_device(table, 3, device);
  const at::Tensor chunks = chunk_table(numels, device);
  const auto opts = tensors[0].options().dtype(at::kDouble);
  if (chunks.size(0) == 0) return at::zeros({1}, opts);
  at::Tensor partial = at::empty({chunks.size(0)}, opts);
  check_launch(cuda_kernels::square_sum_multi(dev_table.data_ptr<int64_t>(), chunks.data_ptr<int64_t>(),
                                              chunks.size(0), kChunk, partial.data_ptr<double>(),
                                              stream_of(tensors[0])),
               "square_sum_multi");
  return partial.sum().reshape({1});  // the partials in a fixed order: the same bits every call
}

at::Tensor CudaOps::moe_permute_bwd(const at::Tensor& dpermuted0, const at::Tensor& source,
                                    int64_t num_tokens) const {
  const auto dt = kernel_dtype(dpermuted0.scalar_type());
  if (!dpermuted0.is_cuda() || !dt || dpermuted0.dim() != 2 || source.dim() != 1 ||
      source.size(0) != dpermuted0.size(0) || source.device() != dpermuted0.device() ||
      source.scalar_type() != at::kLong)
    return ReferenceOps::moe_permute_bwd(dpermuted0, source, num_tokens);  // checks and messages
  const c10::cuda::CUDAGuard guard(dpermuted0.device());
  const at::Tensor dpermuted = dpermuted0.contiguous();
  const int64_t h = dpermuted.size(1);
  // Each token's permuted rows, in token order (stable: slot order within a token), and the
  // offsets of each token's run.
  const at::Tensor rows = at::argsort(source, /*stable=*/true, /*dim=*/0, /*descending=*/false).contiguous();
  // first[t]: the first position of token t in the sorted sources (a search, no host sync).
  const at::Tensor first =
      at::searchsorted(source.index_select(0, rows), at::arange(num_tokens + 1, source.options())).contiguous();
  at::Tensor dx = at::empty({num_tokens, h}, dpermuted.options());
  check_launch(cuda_kernels::moe_permute_bwd(dpermuted.data_ptr(), rows.data_ptr<int64_t>(),
                                             first.data_ptr<int64_t>(), dx.data_ptr(), num_tokens, h, *dt,
                                             stream_of(dpermuted)),
               "moe_permute_bwd");
  return dx;
}

at::Tensor CudaOps::moe_unpermute_fwd(const at::Tensor& y0, const at::Tensor& position0,
                                      const at::Tensor& probs0) const {
  check_moe_unpermute_args(y0, position0, probs0);
  const auto dt = kernel_dtype(y0.scalar_type()), pt = kernel_dtype(probs0.scalar_type());
  if (!y0.is_cuda() || !dt || !pt || position0.device() != y0.device() || probs0.device() != y0.device())
    return ReferenceOps::moe_unpermute_fwd(y0, position0, probs0);
  const c10::cuda::CUDAGuard guard(y0.device());
  const at::Tensor y = y0.contiguous(), position = position0.contiguous(), probs = probs0.contiguous();
  const int64_t n = position.size(0), k = position.size(1), h = y.size(1);
  at::Tensor out = at::empty({n, h}, y.options());
  check_launch(cuda_kernels::moe_unpermute_fwd(y.data_ptr(), position.data_ptr<int64_t>(), probs.data_ptr(),
                                               out.data_ptr(), n, k, h, *dt, *pt, stream_of(y)),
               "moe_unpermute_fwd");
  return out;
}

MoeUnpermuteBwd CudaOps::moe_unpermute_bwd(const at::Tensor& dout0, const at::Tensor& y0,
                                           const at::Tensor& position0, const at::Tensor& probs0) const {
  check_moe_unpermute_args(y0, position0, probs0);
  const auto dt = kernel_dtype(y0.scalar_type()), pt = kernel_dtype(probs0.scalar_type());
  const int64_t n = position0.size(0), k = position0.size(1), h = y0.size(1);
  if (!y0.is_cuda() || !dt || !pt || dout0.scalar_type() != y0.scalar_type() || dout0.device() != y0.device() ||
      position0.device() != y0.device() || probs0.device() != y0.device() || dout0.dim() != 2 ||
      dout0.size(0) != n || dout0.size(1) != h)
    return ReferenceOps::moe_unpermute_bwd(dout0, y0, position0, probs0);  // checks and messages
  const c10::cuda::CUDAGuard guard(y0.device());
  const at::Tensor dout = dout0.contiguous(), y = y0.contiguous(), position = position0.contiguous(),
                   probs = probs0.contiguous();
  MoeUnpermuteBwd r;
  r.dy = at::zeros_like(y);  // rows no valid slot owns stay 0
  r.dprobs = at::empty({n, k}, probs.options());
  check_launch(cuda_kernels::moe_unpermute_bwd(dout.data_ptr(), y.data_ptr(), position.data_ptr<int64_t>(),
                                               probs.data_ptr(), r.dy.data_ptr(), r.dprobs.data_ptr(), n, k, h, *dt,
                                               *pt, stream_of(y)),
               "moe_unpermute_bwd");
  return r;
}

namespace {

// The indexer's tensors on one CUDA device in one kernel dtype.
std::optional<cuda_kernels::DType> indexer_dtype(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w) {
  const auto dt = kernel_dtype(qi.scalar_type());
  if (!qi.is_cuda() || !dt || ki.scalar_type() != qi.scalar_type() || w.scalar_type() != qi.scalar_type() ||
      ki.device() != qi.device() || w.device() != qi.device())
    return std::nullopt;
  return dt;
}

}  // namespace

at::Tensor CudaOps::dsa_indexer_topk(const at::Tensor& qi0, const at::Tensor& ki0, const at::Tensor& w0,
                                     double scale, int64_t topk) const {
  const auto dt = indexer_dtype(qi0, ki0, w0);
  if (!dt) return ReferenceOps::dsa_indexer_topk(qi0, ki0, w0, scale, topk);
  check_dsa_indexer_args(qi0, ki0, w0);
  const int64_t b = qi0.size(0), sq = qi0.size(1), nh = qi0.size(2), di = qi0.size(3), sk = ki0.size(1);
  LF_CHECK(topk >= 1 && topk <= sk, "dsa_indexer_topk: topk ", topk, " must lie in [1, ", sk, "] (the keys)");
  const c10::cuda::CUDAGuard guard(qi0.device());
  const at::Tensor qi = qi0.contiguous(), ki = ki0.contiguous(), w = w0.contiguous();
  at::Tensor scores = at::empty({b, sq, sk}, qi.options().dtype(at::kFloat));
  check_launch(cuda_kernels::dsa_index_scores(qi.data_ptr(), ki.data_ptr(), w.data_ptr(), nullptr,
                                              scores.data_ptr<float>(), b, sq, sk, nh, di, 0,
                                              static_cast<float>(scale), *dt, stream_of(qi)),
               "dsa_index_scores (dense)");
  // As the reference: stable, so equal scores keep the lower key first; invisible keys are -1.
  auto [sorted, order] = at::sort(scores, /*stable=*/true, /*dim=*/-1, /*descending=*/true);
  const at::Tensor top = order.narrow(-1, 0, topk);
  return at::where(at::isinf(sorted.narrow(-1, 0, topk)), at::full_like(top, -1), top).contiguous();
}

at::Tensor CudaOps::dsa_indexer_scores_fwd(const at::Tensor& qi0, const at::Tensor& ki0, const at::Tensor& w0,
                                           const at::Tensor& indices0, double scale) const {
  const auto dt = indexer_dtype(qi0, ki0, w0);
  if (!dt || indices0.device() != qi0.device()) return ReferenceOps::dsa_indexer_scores_fwd(qi0, ki0, w0, indices0, scale);
  check_dsa_indexer_args(qi0, ki0, w0);
  const int64_t b = qi0.size(0), sq = qi0.size(1), nh = qi0.size(2), di = qi0.size(3), sk = ki0.size(1);
  check_dsa_indices(indices0, b, sq, sk);
  const c10::cuda::CUDAGuard guard(qi0.device());
  const at::Tensor qi = qi0.contiguous(), ki = ki0.contiguous(), w = w0.contiguous(), indices = indices0.contiguous();
  const int64_t topk = indices.size(2);
  at::Tensor out = at::empty({b, sq, topk}, qi.options().dtype(at::kFloat));
  check_launch(cuda_kernels::dsa_index_scores(qi.data_ptr(), ki.data_ptr(), w.data_ptr(), indices.data_ptr<int64_t>(),
                                              out.data_ptr<float>(), b, sq, sk, nh, di, topk,
                                              static_cast<float>(scale), *dt, stream_of(qi)),
               "dsa_index_scores (selected)");
  return out;
}

}  // namespace lf::backend::cuda

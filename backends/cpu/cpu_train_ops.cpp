// CpuOps' training kernels (backends/cpu/cpu_ops.h):
// - linear_cross_entropy: the output layer and the cross entropy over chunks of tokens. Each
//   chunk's logits live in one reused fp32 buffer of chunk x v_local (never [n, v]): one pass finds
//   each row's max, one turns the row into exp(z - max) and sums it; the GEMMs into dx and an fp32
//   dw accumulator read that buffer with the softmax's row scale moved to their [c, h] sides and
//   the target's one-hot term done as a row gather/scatter. Same three GEMMs as the unfused path,
//   two passes over each chunk instead of about eight over three fresh [n, v] tensors.
// - adamw_step: one threaded pass over every element of every tensor of the list (the tensors
//   are laid end to end and split into equal ranges), reading p, g, m, v once and writing p, m, v
//   once, with the gradient scale (unscale x clip) applied on the fly. Instead of nine ATen ops
//   per tensor, each its own pass and parallel region.
// - squared_norm: fixed blocks summed in fp64, partial sums added in block order: the same
//   bits for any thread count.
// Anything these kernels do not cover (non-contiguous, other dtypes, other devices) goes to the
// reference. The op harness (tests/backend/op_cases.cpp) checks each against ReferenceOps.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_math.h"
#include "cpu_ops.h"
#include "loongforge/backend/chunked_cross_entropy.h"
#include "loongforge/backend/gemm.h"
#include "loongforge/backend/mixed_add.h"
#include "loongforge/core/error.h"

namespace lf::backend {
namespace {

// Logit rows per chunk: about 8 MiB of fp32 logits for fp32 (32 MiB for bf16), at least 16 rows. Fewer rows make the three
// GEMMs thin (K = rows for dw): measured on 2 cores at h 256 / v 16K (llama_10m), the head's
// GEMMs take 1.40-1.49x the time of the layers' GEMMs at 64 rows, 1.16-1.21x at 128, 1.09-1.15x
// at 256 and 512 (a ratio within one profiled run, so it holds under the machine's noise). The
// chunk is what the output layer adds to the step's peak (at its forward, every layer's
// activations are held): 32 MiB at first, then 16 (131 rows at 32K, 262 at 16K; tokens/s
// within the noise), now 8 (65 / 131 rows): llama_100m's peak 8 MiB lower for ~2-3% of tokens/s
// at both bench sizes (3 alternating runs each), the price of its 0.7x memory target. bf16 keeps
// 32 MiB: its chunks' weight gradients are separate [v, h] products added into the fp32
// accumulator, and 8 MiB chunks cost it 20-25% of tokens/s (tools/bench, 10M and 100M).
int64_t default_chunk(int64_t v, at::ScalarType dtype) {
  const int64_t bytes = dtype == at::kFloat ? int64_t{8} << 20 : int64_t{32} << 20;
  return std::max<int64_t>(16, bytes / (4 * std::max<int64_t>(1, v)));
}

bool contiguous_cpu(at::TensorList ts, at::ScalarType dtype) {
  for (const auto& t : ts)
    if (!t.device().is_cpu() || t.scalar_type() != dtype || !t.is_contiguous()) return false;
  return true;
}

}  // namespace

LinearCrossEntropyFwd CpuOps::linear_cross_entropy(const at::Tensor& x0, const at::Tensor& w, const at::Tensor& target,
                                                   const at::Tensor& weight, int64_t ignore_index,
                                                   const VocabShard& shard, int64_t chunk_tokens,
                                                   const GradInto& into) const {
  check_linear_cross_entropy_args(x0, w, target, weight, shard);
  check_grad_into(into, w);
  const auto dtype = x0.scalar_type();
  if (!x0.device().is_cpu() || (dtype != at::kFloat && dtype != at::kBFloat16))
    return ReferenceOps::linear_cross_entropy(x0, w, target, weight, ignore_index, shard, chunk_tokens, into);
  const at::Tensor x = x0.contiguous();
  const int64_t n = x.size(0), h = x.size(1), v = w.size(0);
  const int64_t valid = shard.valid < 0 ? v : shard.valid;
  const at::Tensor wv = w.narrow(0, 0, valid);  // padding rows take no probability and get no gradient
  // The chunk depends on w's rows (every TP rank's the same), not on valid: the ranks' reductions
  // below must match in number and shape.
  const int64_t chunk = std::min<int64_t>(std::max<int64_t>(1, n), chunk_tokens > 0 ? chunk_tokens : default_chunk(v, dtype));
  // A TP rank holding only padding rows (valid == 0) makes the same reductions with no logits.
  if (valid == 0) return empty_shard_linear_cross_entropy(x, w, target, weight, ignore_index, shard, chunk, into);
  const auto f32 = x.options().dtype(at::kFloat);

  const auto targets = shard_targets(target, shard, valid, ignore_index);
  const at::Tensor& ignored = targets.ignored;
  const at::Tensor safe = targets.safe.unsqueeze(1);  // [n, 1]
  const at::Tensor minef = targets.mine.to(at::kFloat);
  const at::Tensor wt = weight.masked_fill(ignored, 0.0);

  LinearCrossEntropyFwd r;
  r.loss = at::empty({n}, f32);
  r.dx = at::empty({n, h}, x.options());
  // fp32 accumulator over chunks: the first chunk's GEMM writes the real rows (no zero fill of
  // [v, h]: at a 32K vocabulary that fill alone costs a pass over 100 MB), padding rows are zeroed.
  // With a destination (GradInto) the accumulator is that buffer, the scale folded into the GEMMs'
  // [c, h] operands, and with accumulate the first chunk adds instead of writing.
  const WeightGradTarget dest(into, w, valid, n);
  const bool direct = dest.direct, skip = dest.skip;
  const double gscale = dest.alpha;
  at::Tensor dwv = dest.real;
  at::Tensor buf = at::empty({chunk, valid}, f32);
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t c = std::min(chunk, n - c0);
    at::Tensor xc = x.narrow(0, c0, c);
    at::Tensor z = buf.narrow(0, 0, c);
    if (dtype == at::kFloat)
      lf::ops::gemm::mm_into(z, xc, wv.t(), false);
    else
      z.copy_(at::mm(xc, wv.t()));
    float* zp = z.data_ptr<float>();
    at::Tensor m = at::empty({1, c}, f32);
    float* mp = m.data_ptr<float>();
    at::parallel_for(0, c, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) mp[i] = cpu_math::row_max(zp + i * valid, valid);
    });
    if (shard.all_reduce) shard.all_reduce(m, true);
    at::Tensor mc = minef.narrow(0, c0, c), sc = safe.narrow(0, c0, c);
    at::Tensor sums = at::empty({2, c}, f32);
    sums[0].copy_((z.gather(1, sc).squeeze(1) - m[0]) * mc);  // the target's shifted logit, on its owner
    float* sp = sums.data_ptr<float>() + c;
    at::parallel_for(0, c, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        sp[i] = static_cast<float>(cpu_math::row_exp_sum(zp + i * valid, mp[i], valid));  // z = exp(z - m)
    });
    if (shard.all_reduce) shard.all_reduce(sums, false);
    r.loss.narrow(0, c0, c).copy_((sums[1].log() - sums[0]).masked_fill(ignored.narrow(0, c0, c), 0.0));
    // dL/dz = diag(wc / sum) E - diag(wc mine) onehot, with E = exp(z - m) in the buffer. The row
    // scale is applied to the [c, h] sides of the two GEMMs instead of to E, and the onehot part
    // is a row gather / scatter of w and x: E is read by the GEMMs only.
    at::Tensor wc = wt.narrow(0, c0, c);
    at::Tensor scale = (wc / sums[1]).unsqueeze(1);  // [c, 1]
    at::Tensor hit = (wc * mc).unsqueeze(1);         // [c, 1]
    const bool write = c0 == 0 && dest.write_first();  // dw's first touch this call: write, not add
    at::Tensor st = sc.squeeze(1);
    at::Tensor dxc = r.dx.narrow(0, c0, c);
    if (dtype == at::kFloat) {
      lf::ops::gemm::mm_into(dxc, z, wv, false);
      dxc.mul_(scale).sub_(wv.index_select(0, st) * hit);
      if (skip) continue;
      at::Tensor xs = direct ? xc * (scale * gscale) : xc * scale;
      lf::ops::gemm::mm_into(dwv, z.t(), xs, !write);
      dwv.index_add_(0, st, direct ? xc * (hit * gscale) : xc * hit, -1.0);
    } else {
      at::Tensor zb = z.to(dtype);
      at::Tensor xf = xc.to(at::kFloat);
      dxc.copy_(at::mm(zb, wv).to(at::kFloat).mul_(scale).sub_(wv.index_select(0, st).to(at::kFloat) * hit));
      if (skip) continue;
      at::Tensor part = at::mm(zb.t(), (xf * (direct ? scale * gscale : scale)).to(dtype));
      if (write)
        dwv.copy_(part);
      else
        lf::ops::add_converted(dwv, part);
      dwv.index_add_(0, st, direct ? xf * (hit * gscale) : xf * hit, -1.0);
    }
  }
  r.dw = dest.result(w.scalar_type());
  return r;
}

void CpuOps::adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avg,
                        at::TensorList exp_avg_sq, const AdamWHyper& hp) const {
  const size_t k = params.size();
  if (grads.size() != k || exp_avg.size() != k || exp_avg_sq.size() != k || hp.step < 1 ||
      !contiguous_cpu(params, at::kFloat) || !contiguous_cpu(grads, at::kFloat) ||
      !contiguous_cpu(exp_avg, at::kFloat) || !contiguous_cpu(exp_avg_sq, at::kFloat))
    return ReferenceOps::adamw_step(params, grads, exp_avg, exp_avg_sq, hp);  // checks and messages
  std::vector<int64_t> begin(k + 1, 0);
  for (size_t i = 0; i < k; ++i) {
    const auto& p = params[i];
    LF_CHECK(grads[i].sizes() == p.sizes() && exp_avg[i].sizes() == p.sizes() && exp_avg_sq[i].sizes() == p.sizes(),
             "adamw_step: tensor ", i, " shapes differ: param ", p.sizes(), ", grad ", grads[i].sizes(),
             ", exp_avg ", exp_avg[i].sizes(), ", exp_avg_sq ", exp_avg_sq[i].sizes());
    begin[i + 1] = begin[i] + p.numel();
  }
  // The reference's ATen ops take their scalars as fp32 for fp32 tensors: so does this loop.
  const float b1 = static_cast<float>(hp.beta1), b2 = static_cast<float>(hp.beta2);
  const float one_b1 = static_cast<float>(1.0 - hp.beta1), one_b2 = static_cast<float>(1.0 - hp.beta2);
  const float eps = static_cast<float>(hp.eps), gs = static_cast<float>(hp.grad_scale);
  const float decay = static_cast<float>(1.0 - hp.lr * hp.weight_decay);
  const bool decays = hp.weight_decay != 0;
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(hp.beta2, static_cast<double>(hp.step))));
  const float step_size = static_cast<float>(-hp.lr / bc1);
  at::parallel_for(0, begin[k], int64_t{1} << 15, [&](int64_t lo, int64_t hi) {
    size_t t = static_cast<size_t>(std::upper_bound(begin.begin(), begin.end(), lo) - begin.begin()) - 1;
    for (int64_t at_ = lo; at_ < hi; ++t) {
      const int64_t j0 = at_ - begin[t], j1 = std::min(hi, begin[t + 1]) - begin[t];
      cpu_math::adamw(params[t].data_ptr<float>() + j0, grads[t].data_ptr<float>() + j0,
                      exp_avg[t].data_ptr<float>() + j0, exp_avg_sq[t].data_ptr<float>() + j0, j1 - j0, gs, decay,
                      decays, b1, one_b1, b2, one_b2, bc2_sqrt, eps, step_size);
      at_ = begin[t] + j1;
    }
  });
}

at::Tensor CpuOps::squared_norm(at::TensorList tensors) const {
  if (!contiguous_cpu(tensors, at::kFloat)) return ReferenceOps::squared_norm(tensors);
  constexpr int64_t kBlock = 16384;
  std::vector<int64_t> first_block(tensors.size() + 1, 0);
  for (size_t i = 0; i < tensors.size(); ++i)
    first_block[i + 1] = first_block[i] + (tensors[i].numel() + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(first_block.back()), 0.0);
  at::parallel_for(0, first_block.back(), 8, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const size_t t = static_cast<size_t>(std::upper_bound(first_block.begin(), first_block.end(), b) -
                                           first_block.begin()) - 1;
      const float* x = tensors[t].data_ptr<float>();
      const int64_t j0 = (b - first_block[t]) * kBlock, j1 = std::min(tensors[t].numel(), j0 + kBlock);
      partial[static_cast<size_t>(b)] = cpu_math::sum_sq(x + j0, j1 - j0);
    }
  });
  double sum = 0;
  for (double p : partial) sum += p;
  return at::full({1}, sum, at::TensorOptions().dtype(at::kDouble));
}

}  // namespace lf::backend

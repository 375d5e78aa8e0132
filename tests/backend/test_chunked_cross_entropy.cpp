// chunked_linear_cross_entropy (backend/chunked_cross_entropy.h), the CUDA module's output layer +
// cross entropy driver, run here with its row passes in ATen on the CPU and with the CUDA row
// kernels' per-item math on the host: every linear cross entropy case of the op harness at
// 5-token chunks (37 tokens: a partial last chunk), and two vocabulary shards in two threads
// reducing through VocabShard::all_reduce, against the reference. The kernels' launch and their
// bf16 storage are the op harness's on a GPU.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <barrier>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernel_math.h"
#include "loongforge/backend/chunked_cross_entropy.h"
#include "loongforge/backend/reference_ops.h"
#include "loongforge/backend/registry.h"
#include "op_cases.h"

namespace lf::testing {
namespace {

using backend::CrossEntropyRowOps;
using backend::ReferenceOps;

// The row passes in ATen, as the contract in chunked_cross_entropy.h states them.
class AtenRows final : public CrossEntropyRowOps {
 public:
  at::Tensor row_max(const at::Tensor& z) const override { return z.to(at::kFloat).amax(1); }
  at::Tensor exp_sums(const at::Tensor& z, const at::Tensor& m, const at::Tensor& safe,
                      const at::Tensor& mine) const override {
    const at::Tensor zf = z.to(at::kFloat);
    const at::Tensor shifted = (zf.gather(1, safe.unsqueeze(1)).squeeze(1) - m).masked_fill(mine.logical_not(), 0.0);
    return at::stack({shifted, (zf - m.unsqueeze(1)).exp().sum(1)});
  }
  void grad_in_place(at::Tensor& z, const at::Tensor& m, const at::Tensor& sums, const at::Tensor& safe,
                     const at::Tensor& mine, const at::Tensor& wt) const override {
    at::Tensor p = (z.to(at::kFloat) - m.unsqueeze(1)).exp() / sums[1].unsqueeze(1);
    p -= at::zeros_like(p).scatter_(1, safe.unsqueeze(1), mine.to(at::kFloat).unsqueeze(1));
    z.copy_(p * wt.unsqueeze(1));
  }
  void add_weight_grad(at::Tensor& dw, const at::Tensor& dz, const at::Tensor& x, bool write,
                       double alpha) const override {
    const at::Tensor part = at::mm(dz.t().to(at::kFloat), x.to(at::kFloat)) * alpha;
    if (write)
      dw.copy_(part);
    else
      dw.add_(part);
  }
};

// The CUDA row kernels' per-item math (kernels/kernel_math.h: ce_*) run on the host for fp32
// chunks: 256 "threads" per row as the kernels' blocks, their partials combined as the block
// reductions do (in another order: the sums are compared to tolerance).
class KernelMathRows final : public CrossEntropyRowOps {
 public:
  static constexpr int kThreads = 256;
  at::Tensor row_max(const at::Tensor& z) const override {
    const int64_t c = z.size(0), valid = z.size(1);
    at::Tensor m = at::empty({c});
    for (int64_t row = 0; row < c; ++row) {
      float best = -INFINITY;
      for (int tid = 0; tid < kThreads; ++tid)
        best = std::max(best, lf::cuda_kernels::ce_max_partial(z.data_ptr<float>(), row, valid, tid, kThreads));
      m.data_ptr<float>()[row] = best;
    }
    return m;
  }
  at::Tensor exp_sums(const at::Tensor& z, const at::Tensor& m, const at::Tensor& safe,
                      const at::Tensor& mine) const override {
    const int64_t c = z.size(0), valid = z.size(1);
    at::Tensor sums = at::empty({2, c});
    float* s = sums.data_ptr<float>();
    for (int64_t row = 0; row < c; ++row) {
      const float mr = m.data_ptr<float>()[row];
      float total = 0.0f;
      for (int tid = 0; tid < kThreads; ++tid)
        total += lf::cuda_kernels::ce_exp_sum_partial(z.data_ptr<float>(), row, valid, mr, tid, kThreads);
      // As the kernel's thread 0.
      s[row] = mine.data_ptr<bool>()[row] ? z.data_ptr<float>()[row * valid + safe.data_ptr<int64_t>()[row]] - mr : 0.0f;
      s[c + row] = total;
    }
    return sums;
  }
  void grad_in_place(at::Tensor& z, const at::Tensor& m, const at::Tensor& sums, const at::Tensor& safe,
                     const at::Tensor& mine, const at::Tensor& wt) const override {
    const int64_t c = z.size(0), valid = z.size(1);
    for (int64_t row = 0; row < c; ++row)
      for (int64_t j = 0; j < valid; ++j)
        lf::cuda_kernels::ce_grad_item(z.data_ptr<float>(), row, j, valid, m.data_ptr<float>()[row],
                                       sums.data_ptr<float>()[c + row], safe.data_ptr<int64_t>()[row],
                                       mine.data_ptr<bool>()[row], wt.data_ptr<float>()[row]);
  }
  void add_weight_grad(at::Tensor& dw, const at::Tensor& dz, const at::Tensor& x, bool write,
                       double alpha) const override {
    AtenRows().add_weight_grad(dw, dz, x, write, alpha);
  }
};

// The reference with its linear cross entropy replaced by the driver at 5-token chunks.
class ChunkedOps final : public ReferenceOps {
 public:
  explicit ChunkedOps(const CrossEntropyRowOps& rows) : rows_(rows) {}
  backend::LinearCrossEntropyFwd linear_cross_entropy(const at::Tensor& x, const at::Tensor& w,
                                                      const at::Tensor& target, const at::Tensor& weight,
                                                      int64_t ignore_index, const backend::VocabShard& shard,
                                                      int64_t chunk_tokens, const backend::GradInto& into) const override {
    backend::check_linear_cross_entropy_args(x, w, target, weight, shard);
    backend::check_grad_into(into, w);
    return backend::chunked_linear_cross_entropy(x, w, target, weight, ignore_index, shard,
                                                 chunk_tokens > 0 ? chunk_tokens : 5, into, rows_);
  }

 private:
  const CrossEntropyRowOps& rows_;
};

// Runs the harness's linear cross entropy cases (fp32 only, or all) through rows; returns how many.
int expect_cases_equal_the_reference(const CrossEntropyRowOps& rows, bool fp32_only) {
  const ReferenceOps reference;
  const ChunkedOps chunked(rows);
  int ran = 0;
  for (const OpCase& c : op_cases()) {
    if (c.name.rfind("linear_cross_entropy", 0) != 0) continue;
    if (fp32_only && c.name.find("_f32") == std::string::npos) continue;
    ++ran;
    const auto inputs = c.make_inputs();
    const NamedTensors want = c.run(reference, inputs), got = c.run(chunked, inputs);
    EXPECT_EQ(got.size(), want.size()) << c.name;
    for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
      const auto r = compare(got[i].second, want[i].second, c.atol, c.rtol);
      EXPECT_TRUE(r.ok) << c.name << " " << want[i].first << ": " << r.detail;
    }
  }
  return ran;
}

TEST(ChunkedCrossEntropy, EveryHarnessCaseEqualsTheReference) {
  EXPECT_GE(expect_cases_equal_the_reference(AtenRows(), false), 10)
      << "the harness's linear cross entropy cases were not found";
}

TEST(ChunkedCrossEntropy, TheCudaRowKernelsMathEqualsTheReference) {
  EXPECT_GE(expect_cases_equal_the_reference(KernelMathRows(), true), 5)
      << "the harness's fp32 linear cross entropy cases were not found";
}

// Three ranks' vocabulary shards of 35 rows (105 rows, 64 real: 35, 29 and 0 real rows, the last
// all padding), each in its own thread, the max and the sums all-reduced between them, against
// the whole vocabulary: the chunked driver (row passes in ATen, 4-token chunks) and the CPU
// backend's own kernel (4-token chunks and its default).
// run(rank, shard) computes rank's part.
void expect_shards_equal_the_whole(
    const std::function<backend::LinearCrossEntropyFwd(int rank, const backend::VocabShard& shard)>& run,
    const backend::LinearCrossEntropyFwd& want, const std::string& what) {
  constexpr int kRanks = 3;
  auto shard_of = [](int r) {
    backend::VocabShard shard;
    shard.start = 35 * r;
    shard.valid = std::clamp<int64_t>(64 - shard.start, 0, 35);
    return shard;
  };
  // First each rank alone, recording its reductions: ranks whose calls differ would wait on each
  // other forever at the barrier below, so that is a failure here instead of a hang.
  std::array<std::vector<std::string>, kRanks> calls;
  for (int r = 0; r < kRanks; ++r) {
    backend::VocabShard shard = shard_of(r);
    shard.all_reduce = [&calls, r](at::Tensor& t, bool max) {
      calls[r].push_back(std::string(max ? "max " : "sum ") + std::to_string(t.numel()));
    };
    run(r, shard);
  }
  ASSERT_EQ(calls[1], calls[0]) << what << ": rank 1 (padding) reduces otherwise than rank 0";
  ASSERT_EQ(calls[2], calls[0]) << what << ": rank 2 (padding only) reduces otherwise than rank 0";
  std::barrier sync(kRanks);
  std::array<at::Tensor, kRanks> slot;
  std::array<backend::LinearCrossEntropyFwd, kRanks> got;
  auto rank = [&](int r) {
    backend::VocabShard shard = shard_of(r);
    shard.all_reduce = [&, r](at::Tensor& t, bool max) {
      slot[r] = t.clone();
      sync.arrive_and_wait();
      at::Tensor total = slot[0].clone();
      for (int k = 1; k < kRanks; ++k) total = max ? at::maximum(total, slot[k]) : total + slot[k];
      sync.arrive_and_wait();  // every rank has read the slots before any writes them again
      t.copy_(total);
    };
    got[r] = run(r, shard);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) threads.emplace_back(rank, r);
  for (auto& t : threads) t.join();
  at::Tensor dx = got[0].dx;
  for (int r = 0; r < kRanks; ++r) {
    auto c = compare(got[r].loss, want.loss, 1e-5, 1e-5);
    EXPECT_TRUE(c.ok) << what << ", rank " << r << " loss: " << c.detail;
    if (r > 0) dx = dx + got[r].dx;  // the caller sums dx over TP
  }
  auto c = compare(dx, want.dx, 1e-5, 1e-5);
  EXPECT_TRUE(c.ok) << what << " dx: " << c.detail;
  c = compare(at::cat({got[0].dw, got[1].dw, got[2].dw}), want.dw, 1e-5, 1e-5);
  EXPECT_TRUE(c.ok) << what << " dw: " << c.detail;
}

TEST(ChunkedCrossEntropy, VocabularyShardsReduceToTheWholeVocabulary) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor x = at::randn({23, 16}, gen, f32), w = at::randn({105, 16}, gen, f32) * 0.5;
  at::Tensor target = at::randint(64, {23}, gen, at::TensorOptions().dtype(at::kLong));
  target.index_fill_(0, at::arange(0, 23, 5), -100);
  const at::Tensor weight = at::rand({23}, gen, f32);
  backend::VocabShard whole;
  whole.valid = 64;
  const auto want = ReferenceOps().linear_cross_entropy(x, w, target, weight, -100, whole, 0);
  auto driver = [&](int r, const backend::VocabShard& shard) {
    return backend::chunked_linear_cross_entropy(x, w.narrow(0, 35 * r, 35), target, weight, -100, shard, 4,
                                                 backend::GradInto{}, AtenRows());
  };
  expect_shards_equal_the_whole(driver, want, "chunked driver, 4-token chunks");
  for (const int64_t chunk : {int64_t{4}, int64_t{0}}) {
    auto cpu = [&, chunk](int r, const backend::VocabShard& shard) {
      return backend::cpu_backend().ops().linear_cross_entropy(x, w.narrow(0, 35 * r, 35), target, weight, -100,
                                                               shard, chunk);
    };
    expect_shards_equal_the_whole(cpu, want, chunk ? "CPU backend, 4-token chunks" : "CPU backend, default chunks");
  }
}

// Every rank of a vocabulary split must make the same reductions (number, order, shapes), or the
// group's collectives would not match (a hang, or sums of different rows). With the default chunk
// and a shard large enough for several chunks, the rank with fewer real rows (the padding) and one
// with none record the calls they make, each alone; all three sequences must be equal.
TEST(ChunkedCrossEntropy, EveryRankMakesTheSameReductions) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(22);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const int64_t rows = 40000, n = 150;  // the CPU's default fp32 chunk: 8 MiB / (4 x 40000) = 52 rows
  const at::Tensor x = at::randn({n, 8}, gen, f32), w = at::randn({rows, 8}, gen, f32) * 0.1;
  const at::Tensor target = at::randint(100000, {n}, gen, at::TensorOptions().dtype(at::kLong));
  const at::Tensor weight = at::ones({n}, f32);
  auto calls = [&](const backend::OpTable& ops, int64_t valid, int64_t chunk) {
    std::vector<std::string> seen;
    backend::VocabShard shard;
    shard.start = rows;
    shard.valid = valid;
    shard.all_reduce = [&seen](at::Tensor& t, bool max) {
      seen.push_back(std::string(max ? "max " : "sum ") + std::to_string(t.size(0)) + "x" + std::to_string(t.size(1)));
    };
    ops.linear_cross_entropy(x, w, target, weight, -100, shard, chunk);
    return seen;
  };
  const auto& cpu = backend::cpu_backend().ops();
  const auto full = calls(cpu, rows, 0);
  EXPECT_GE(full.size(), 6u) << "the case must take several chunks";
  EXPECT_EQ(calls(cpu, 25000, 0), full) << "the CPU backend, a shard with padding";
  EXPECT_EQ(calls(cpu, 0, 0), full) << "the CPU backend, a shard of padding only";
  const AtenRows aten_rows;
  const ChunkedOps chunked(aten_rows);
  const auto driver = calls(chunked, rows, 7);
  EXPECT_EQ(calls(chunked, 25000, 7), driver) << "the chunked driver, a shard with padding";
  EXPECT_EQ(calls(chunked, 0, 7), driver) << "the chunked driver, a shard of padding only";
}

}  // namespace
}  // namespace lf::testing

// lf::backend::init_cpu_math: a process's first parallel exp is as accurate as every later one. And
// lf::backend::intra_op_team_size: the backend's own kernels run on the whole OpenMP team.
// Without the serial first call, MKL's vector math sometimes computed the second intra-op thread's
// half of the process's first exp up to 1.5e-4 off (it broke the op harness's dsa case on CI). It
// is timing-dependent: here 2 to 10 of every 100 processes at two threads. The check is therefore
// statistical: 64 fresh processes, one at a time, each picking the backend as the engine's
// programs do and then making its first VML call through two threads; without the initialisation
// at least one of them fails with probability about 0.7 to 0.999. And lf::ops::add_converted, the
// bf16 row conversions and the bf16 fused ops that use them.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>

#include <c10/util/BFloat16.h>

#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu_math.h"
#include "loongforge/backend/mixed_add.h"
#include "loongforge/backend/registry.h"
#include "multiprocess.h"

namespace lf::testing {
namespace {

LF_WORKER_CASE(cpu_math_first_parallel_exp) {
  backend::select_backend();  // what loongforge-train and the other programs do first
  ASSERT_EQ(at::get_num_threads(), 2);
  auto x = at::linspace(-3.0, -1e-3, 3072, at::TensorOptions().dtype(at::kFloat));
  // Some parallel work first (as a model's first step has: matmuls before the first softmax).
  auto a = at::randn({2, 4, 16, 24}), b = at::randn({2, 4, 24, 24});
  x = x + at::matmul(a, b).flatten().narrow(0, 0, 3072) * 0;
  // ATen's vml.h splits exp in chunks of at least 2048 elements: both threads take part (the
  // wrong values were the second thread's half).
  auto y = at::exp(x);  // the process's first VML call
  auto ref = at::exp(x.to(at::kDouble));
  const double rel = ((y.to(at::kDouble) - ref).abs() / ref).max().item<double>();
  EXPECT_LE(rel, 3e-7) << "the first parallel exp of this process is off by " << rel << " relative";
}

TEST(CpuMath, FirstParallelExpIsAccurateInEveryProcess) {
  SpawnOptions o;
  o.world_size = 1;
  o.env = {{"LF_TEST_NO_CPU_MATH_INIT", "1"}, {"OMP_NUM_THREADS", "2"}, {"MKL_NUM_THREADS", "2"},
           {"LOONGFORGE_DEVICE", "cpu"}};
  for (int round = 0; round < 64; ++round) {
    const auto results = run_workers("cpu_math_first_parallel_exp", o);
    expect_all_ok(results);
    if (::testing::Test::HasFailure()) return;
  }
}

// The backend's own kernels parallelise with at::parallel_for, a header template whose OpenMP body
// exists only in code compiled with OpenMP. Built without it, they ran on one thread while MKL used
// two (pi05's bench step: half its time serial, the second thread spinning).
LF_WORKER_CASE(intra_op_team) {
  backend::select_backend();
  ASSERT_EQ(at::get_num_threads(), 2);
  EXPECT_EQ(backend::intra_op_team_size(), 2) << "the backend library's at::parallel_for ran on fewer threads";
  at::set_num_threads(1);
  EXPECT_EQ(backend::intra_op_team_size(), 1);
}

TEST(CpuMath, OwnKernelsUseTheWholeOpenMpTeam) {
  SpawnOptions o;
  o.world_size = 1;
  o.env = {{"OMP_NUM_THREADS", "2"}, {"MKL_NUM_THREADS", "2"}, {"LOONGFORGE_DEVICE", "cpu"}};
  expect_all_ok(run_workers("intra_op_team", o));
}

// The blocked conversion equals ATen's mixed-dtype add_ bit for bit, across block boundaries and a
// short last block, for bf16 and fp16 gradients; an fp32 gradient is a plain add.
TEST(AddConverted, ConvertsInBlocksWithTheSameValuesAsAtenAdd) {
  at::manual_seed(3);
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    const at::Tensor main = at::randn({37, 11});
    const at::Tensor g = at::randn({37, 11}).to(dtype);
    at::Tensor want = main.clone();
    want.add_(g);
    for (int64_t block : {int64_t{7}, int64_t{64}, int64_t{1} << 18}) {
      at::Tensor got = main.clone();
      lf::ops::add_converted(got, g, block);
      EXPECT_TRUE(at::equal(got, want)) << dtype << " block " << block;
    }
  }
}

// Every bf16 widens exactly; fp32 narrows bit for bit as c10::BFloat16(float): random bit
// patterns, ties to even both ways, the largest finite value rounding to infinity, denormals,
// infinities and NaNs of either sign and any payload (all become 0x7FC0).
TEST(CpuMath, Bf16ConversionsAreC10s) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(all.size());
  backend::cpu_math::bf16_to_float(all.data(), wide.data(), static_cast<int64_t>(all.size()));
  for (size_t i = 0; i < all.size(); ++i) {
    const float want = static_cast<float>(c10::BFloat16(all[i], c10::BFloat16::from_bits()));
    ASSERT_EQ(std::memcmp(&wide[i], &want, sizeof want), 0) << "bf16 bits 0x" << std::hex << i;
  }
  std::vector<uint32_t> patterns{0x3F808000u, 0x3F818000u, 0xBF808000u, 0x3F808001u, 0x3F807FFFu, 0x7F7FFFFFu,
                                 0xFF7FFFFFu, 0x7F7F7FFFu, 0x00000001u, 0x80008000u, 0x00018000u, 0x7F800000u,
                                 0xFF800000u, 0x7F800001u, 0xFFC00000u, 0x7FFFFFFFu, 0x7FBFFFFFu, 0u, 0x80000000u};
  std::mt19937 rng(5);
  for (int i = 0; i < 100003; ++i) patterns.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> narrow_in(patterns.size());
  std::memcpy(narrow_in.data(), patterns.data(), sizeof(float) * patterns.size());
  std::vector<uint16_t> narrowed(patterns.size());
  backend::cpu_math::float_to_bf16(narrow_in.data(), narrowed.data(), static_cast<int64_t>(patterns.size()));
  for (size_t i = 0; i < patterns.size(); ++i)
    ASSERT_EQ(narrowed[i], c10::BFloat16(narrow_in[i]).x) << "fp32 bits 0x" << std::hex << patterns[i];
}

// The CPU backend's bf16 RMSNorm, SwiGLU, RoPE, GELU and GeGLU (tanh forms; forward and backward)
// are its fp32 kernels on the widened inputs, rounded once: bit for bit, over rows whose length is
// no multiple of the vector width and more rows than one task's grain (16384 / row length), so
// both threads take rows with their own buffers (RoPE: bf16 x with the fp32 tables the decoder
// makes, rotating 24 of 40 dims; the element-wise ops over 37,001 elements: several
// 4096-element buffers per task and a short last one). (NaN outputs would differ in their bits:
// c10's conversion makes 0x7FC0, ATen's vectorised one 0xFFFF; none occur here.)
TEST(CpuMath, Bf16FusedOpsAreTheFp32KernelsRoundedOnce) {
  const auto& ops = backend::cpu_backend().ops();
  at::manual_seed(11);
  const auto bf = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
  const auto wide = [](const at::Tensor& t) { return t.to(at::kFloat); };
  const at::Tensor x = bf(at::randn({67, 13, 45}) * 3), w = bf(at::randn({45}) + 1), dy = bf(at::randn({67, 13, 45}));
  const auto f = ops.rms_norm_fwd(x, w, 1e-5), f32 = ops.rms_norm_fwd(wide(x), wide(w), 1e-5);
  EXPECT_TRUE(at::equal(f.y, bf(f32.y))) << "rms_norm_fwd";
  EXPECT_TRUE(at::equal(f.rstd, f32.rstd)) << "rms_norm_fwd rstd";
  const auto b = ops.rms_norm_bwd(dy, x, w, f.rstd), b32 = ops.rms_norm_bwd(wide(dy), wide(x), wide(w), f.rstd);
  EXPECT_TRUE(at::equal(b.dx, bf(b32.dx))) << "rms_norm_bwd dx";
  EXPECT_TRUE(at::equal(b.dw, bf(b32.dw))) << "rms_norm_bwd dw";
  const at::Tensor gu = bf(at::randn({601, 2 * 37}) * 4), dy2 = bf(at::randn({601, 37}));
  EXPECT_TRUE(at::equal(ops.swiglu_fwd(gu), bf(ops.swiglu_fwd(wide(gu))))) << "swiglu_fwd";
  EXPECT_TRUE(at::equal(ops.swiglu_bwd(dy2, gu), bf(ops.swiglu_bwd(wide(dy2), wide(gu))))) << "swiglu_bwd";
  const at::Tensor angles = at::outer(at::arange(29, at::kFloat), at::rand({12}));
  const at::Tensor cos = at::cat({angles.cos(), angles.cos()}, 1), sin = at::cat({angles.sin(), angles.sin()}, 1);
  const at::Tensor xr = bf(at::randn({29, 4, 8, 40})), dyr = bf(at::randn({29, 4, 8, 40}));
  EXPECT_TRUE(at::equal(ops.rope_fwd(xr, cos, sin, false), bf(ops.rope_fwd(wide(xr), cos, sin, false)))) << "rope_fwd";
  EXPECT_TRUE(at::equal(ops.rope_bwd(dyr, cos, sin, false), bf(ops.rope_bwd(wide(dyr), cos, sin, false))))
      << "rope_bwd";
  const at::Tensor ge = bf(at::randn({37001}) * 3), up = bf(at::randn({37001})), dge = bf(at::randn({37001}));
  EXPECT_TRUE(at::equal(ops.gelu_tanh_fwd(ge), bf(ops.gelu_tanh_fwd(wide(ge))))) << "gelu_tanh_fwd";
  EXPECT_TRUE(at::equal(ops.gelu_tanh_bwd(dge, ge), bf(ops.gelu_tanh_bwd(wide(dge), wide(ge))))) << "gelu_tanh_bwd";
  EXPECT_TRUE(at::equal(ops.geglu_tanh_fwd(ge, up), bf(ops.geglu_tanh_fwd(wide(ge), wide(up))))) << "geglu_tanh_fwd";
  const auto gb = ops.geglu_tanh_bwd(dge, ge, up), gb32 = ops.geglu_tanh_bwd(wide(dge), wide(ge), wide(up));
  EXPECT_TRUE(at::equal(gb.dgate, bf(gb32.dgate)) && at::equal(gb.dup, bf(gb32.dup))) << "geglu_tanh_bwd";
}

// A zero last dim reaches the reference, not the row kernels (which divide numel by it): fp32 and
// bf16 RMSNorm and SwiGLU give empty results (the reference's RMSNorm backward refuses the shape
// with an ATen error) instead of a division by zero that kills the process.
TEST(CpuMath, EmptyRowsGoToTheReference) {
  const auto& ops = backend::cpu_backend().ops();
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    const auto o = at::TensorOptions().dtype(dt);
    EXPECT_EQ(ops.swiglu_fwd(at::empty({3, 0}, o)).sizes(), at::IntArrayRef({3, 0}));
    EXPECT_EQ(ops.swiglu_bwd(at::empty({3, 0}, o), at::empty({3, 0}, o)).sizes(), at::IntArrayRef({3, 0}));
    const auto f = ops.rms_norm_fwd(at::empty({3, 0}, o), at::empty({0}, o), 1e-5);
    EXPECT_EQ(f.y.sizes(), at::IntArrayRef({3, 0}));
    EXPECT_THROW(ops.rms_norm_bwd(at::empty({3, 0}, o), at::empty({3, 0}, o), at::empty({0}, o), f.rstd),
                 c10::Error);
  }
}

}  // namespace
}  // namespace lf::testing

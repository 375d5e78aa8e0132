// lf::backend::init_cpu_math: a process's first parallel exp is as accurate as every later one. And
// lf::backend::intra_op_team_size: the backend's own kernels run on the whole OpenMP team.
// Without the serial first call, MKL's vector math sometimes computed the second intra-op thread's
// half of the process's first exp up to 1.5e-4 off (it broke the op harness's dsa case on CI). It
// is timing-dependent: here 2 to 10 of every 100 processes at two threads. The check is therefore
// statistical: 64 fresh processes, one at a time, each picking the backend as the engine's
// programs do and then making its first VML call through two threads; without the initialisation
// at least one of them fails with probability about 0.7 to 0.999. And lf::ops::add_converted.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>

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

}  // namespace
}  // namespace lf::testing

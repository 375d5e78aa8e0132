// Shared-memory collectives (backend/shm_communicator.h) across real processes: every reducible
// dtype and every reduce op over sizes that span many small slots and split unevenly over 3
// ranks; reduce_scatter, all_gather (also in place), all_to_all (uneven, empty and equal splits),
// async ops in flight with Gloo ops between;
// bit-equality with Gloo's all-reduce for 2 ranks; the fallback when the segment cannot be
// reserved, the environment switch, and a second handshake on the same store. Failures
// (timeouts, dead peers) are in test_failures.cpp, whose groups now run over shared memory.
#include <ATen/Functions.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "loongforge/backend/c10d_communicator.h"
#include "loongforge/backend/shm_communicator.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/rendezvous.h"
#include "multiprocess.h"
#include "tensor_values.h"

namespace lf::dist {
namespace {

using backend::Communicator;
using backend::ReduceOp;

using lf::testing::values;

backend::CommunicatorSpec spec_for(const Rendezvous& rdzv, const std::string& name) {
  backend::CommunicatorSpec spec;
  spec.name = name;
  for (int r = 0; r < rdzv.world_size(); ++r) spec.ranks.push_back(r);
  spec.group_rank = spec.global_rank = rdzv.rank();
  spec.timeout = std::chrono::seconds(30);
  spec.store = c10::make_intrusive<c10d::PrefixStore>("test/" + name, rdzv.store());
  return spec;
}

// Element i of group rank k's contribution: base(i) + k - 1 with base in 1..5. With 3 ranks the
// sum is 3 base, the mean base, max base + 1, min base - 1, the product (base - 1) base (base + 1):
// exact in every dtype, int8 included.
double base(int64_t i) { return static_cast<double>((i * 7) % 5 + 1); }

at::Tensor contribution(int64_t n, int k, at::ScalarType dtype) {
  at::Tensor b = (at::arange(n, at::kLong) * 7).remainder(5) + 1;
  return (b + (k - 1)).to(dtype);
}

std::vector<double> expected(int64_t n, ReduceOp op, int64_t offset = 0) {
  std::vector<double> want;
  for (int64_t i = 0; i < n; ++i) {
    const double b = base(i + offset);
    switch (op) {
      case ReduceOp::sum: want.push_back(3 * b); break;
      case ReduceOp::avg: want.push_back(b); break;
      case ReduceOp::max: want.push_back(b + 1); break;
      case ReduceOp::min: want.push_back(b - 1); break;
      case ReduceOp::product: want.push_back((b - 1) * b * (b + 1)); break;
    }
  }
  return want;
}

LF_WORKER_CASE(shm_three_ranks) {
  Rendezvous rdzv(detect_launch_env(), std::chrono::seconds(30));
  ASSERT_EQ(rdzv.world_size(), 3);
  const auto spec = spec_for(rdzv, "three");
  // 4 KiB slots: 1024 floats per all_reduce chunk, 341 per reduce_scatter piece.
  auto c = backend::with_shared_memory(backend::make_gloo_communicator(spec), spec,
                                       {.slot_bytes = 4096});
  ASSERT_TRUE(backend::uses_shared_memory(*c));
  const int k = c->rank();

  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt,
                     at::kShort, at::kChar, at::kByte})
    for (auto op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::product})
      for (int64_t n : {0, 1, 5, 1000, 4099, 9000}) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << backend::to_string(op) << " n=" << n);
        at::Tensor t = contribution(n, k, dtype);
        c->all_reduce(t, op);
        EXPECT_EQ(t.scalar_type(), dtype);
        EXPECT_EQ(values(t), expected(n, op));
      }

  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong})
    for (int64_t m : {1, 700, 2000}) {
      SCOPED_TRACE(::testing::Message() << "reduce_scatter " << dtype << " m=" << m);
      at::Tensor in = contribution(3 * m, k, dtype), out = at::full({m}, -7, dtype);
      c->reduce_scatter(out, in, ReduceOp::sum);
      EXPECT_EQ(values(out), expected(m, ReduceOp::sum, k * m));
      c->reduce_scatter(out, in, ReduceOp::avg);
      EXPECT_EQ(values(out), expected(m, ReduceOp::avg, k * m));
    }

  for (int64_t m : {1, 3000}) {
    SCOPED_TRACE(::testing::Message() << "all_gather m=" << m);
    at::Tensor in = at::arange(m, at::kFloat) + 10000.0 * k;
    at::Tensor out = at::full({3 * m}, -1.0, at::kFloat);
    c->all_gather(out, in);
    std::vector<double> want;
    for (int r = 0; r < 3; ++r)
      for (int64_t i = 0; i < m; ++i) want.push_back(10000.0 * r + static_cast<double>(i));
    EXPECT_EQ(values(out), want);
    // In place: the input is this rank's part of the output (ZeRO-1's parameter gather).
    at::Tensor flat = at::full({3 * m}, -1.0, at::kFloat);
    flat.narrow(0, k * m, m).copy_(in);
    c->all_gather(flat, flat.narrow(0, k * m, m));
    EXPECT_EQ(values(flat), want);
    // Two dims: rows gathered along dim 0.
    at::Tensor rows = at::full({6, 2}, -1.0, at::kFloat);
    c->all_gather(rows, at::full({2, 2}, static_cast<double>(k), at::kFloat));
    EXPECT_EQ(values(rows), (std::vector<double>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
  }

  // all_to_all with uneven splits (MoE's dispatch): rank k sends (k + d) * m rows of width 3 to
  // rank d, each row tagged (source, destination, row); with m = 0 every piece but none is empty,
  // with m = 200 the pieces span many 1344-byte slot pieces (4 KiB slot / 3 members, 64-aligned);
  // one member's own rows are copied directly. Also equal splits (empty split vectors), int64 rows.
  for (int64_t m : {0, 1, 200}) {
    SCOPED_TRACE(::testing::Message() << "all_to_all m=" << m);
    std::vector<int64_t> in_splits, out_splits;
    std::vector<at::Tensor> pieces;
    for (int d = 0; d < 3; ++d) {
      const int64_t rows = (k + d) * m;
      in_splits.push_back(rows);
      out_splits.push_back((d + k) * m);
      at::Tensor p = at::empty({rows, 3}, at::kFloat);
      if (rows > 0) {
        p.select(1, 0).fill_(k);
        p.select(1, 1).fill_(d);
        p.select(1, 2).copy_(at::arange(rows, at::kFloat));
      }
      pieces.push_back(p);
    }
    const at::Tensor in = at::cat(pieces);
    int64_t total = 0;
    for (int64_t v : out_splits) total += v;
    at::Tensor out = at::full({total, 3}, -1.0, at::kFloat);
    c->all_to_all(out, in, out_splits, in_splits);
    std::vector<double> want;
    for (int s = 0; s < 3; ++s)
      for (int64_t i = 0; i < (s + k) * m; ++i) want.insert(want.end(), {double(s), double(k), double(i)});
    EXPECT_EQ(values(out), want);
  }
  {
    at::Tensor in = at::arange(6, at::kLong) + 100 * k, out = at::full({6}, -1, at::kLong);
    c->all_to_all(out, in, {}, {});
    std::vector<double> want;
    for (int s = 0; s < 3; ++s) want.insert(want.end(), {100.0 * s + 2 * k, 100.0 * s + 2 * k + 1});
    EXPECT_EQ(values(out), want);
  }

  // Async ops in flight, a Gloo broadcast and a blocking shared-memory op between them: all run
  // in issue order and complete.
  std::vector<at::Tensor> ts;
  std::vector<std::shared_ptr<backend::Work>> works;
  for (int j = 0; j < 4; ++j) {
    ts.push_back(contribution(5000 + j, k, at::kFloat));
    works.push_back(c->all_reduce(ts.back(), ReduceOp::sum, /*async=*/true));
    ASSERT_TRUE(works.back());
  }
  at::Tensor rs_in = contribution(3 * 900, k, at::kFloat), rs_out = at::empty({900}, at::kFloat);
  works.push_back(c->reduce_scatter(rs_out, rs_in, ReduceOp::sum, /*async=*/true));
  at::Tensor a2a_in = at::arange(3 * 700, at::kFloat) + 10000.0 * k, a2a_out = at::empty({3 * 700}, at::kFloat);
  works.push_back(c->all_to_all(a2a_out, a2a_in, {}, {}, /*async=*/true));
  at::Tensor b = at::full({3}, k == 2 ? 42.0 : 0.0, at::kFloat);
  c->broadcast(b, 2);
  EXPECT_EQ(values(b), std::vector<double>(3, 42.0));
  at::Tensor now = contribution(2500, k, at::kDouble);
  c->all_reduce(now, ReduceOp::max);
  EXPECT_EQ(values(now), expected(2500, ReduceOp::max));
  for (auto& w : works) w->wait();
  for (int j = 0; j < 4; ++j) EXPECT_EQ(values(ts[j]), expected(5000 + j, ReduceOp::sum));
  EXPECT_EQ(values(rs_out), expected(900, ReduceOp::sum, k * 900));
  for (int s = 0; s < 3; ++s)  // source s's rows [700 k, 700 (k + 1)) of its arange
    EXPECT_TRUE(at::equal(a2a_out.narrow(0, 700 * s, 700), at::arange(700 * k, 700 * (k + 1), at::kFloat) + 10000.0 * s));
  EXPECT_TRUE(works.front()->is_completed());
  c->barrier();
  std::printf("rank %d shared-memory collectives ok\n", k);
}

TEST(ShmCollectives, EveryDtypeOpAndSizeOverThreeRanks) {
  auto res = lf::testing::run_workers("shm_three_ranks",
                                      {.world_size = 3, .timeout = std::chrono::seconds(120)});
  lf::testing::expect_all_ok(res);
  EXPECT_NE(res[2].output.find("rank 2 shared-memory collectives ok"), std::string::npos)
      << res[2].output;
}

LF_WORKER_CASE(shm_two_ranks) {
  Rendezvous rdzv(detect_launch_env(), std::chrono::seconds(30));
  // An unknown value of the switch is an error naming it, on every rank, before any handshake
  // (Gloo's included: a rank failing after it would cut a slower rank's handshake short).
  setenv("LOONGFORGE_SHM_COLLECTIVES", "yes", 1);
  {
    const auto spec = spec_for(rdzv, "bad-switch");
    try {
      backend::make_cpu_communicator(spec);
      ADD_FAILURE() << "LOONGFORGE_SHM_COLLECTIVES=yes was accepted";
    } catch (const lf::Error& e) {
      EXPECT_NE(std::string(e.what()).find("LOONGFORGE_SHM_COLLECTIVES='yes' is not 0 or 1"),
                std::string::npos) << e.what();
    }
  }
  unsetenv("LOONGFORGE_SHM_COLLECTIVES");

  // A segment /dev/shm cannot hold: every member falls back to the wrapped communicator.
  const auto huge_spec = spec_for(rdzv, "huge");
  auto huge = backend::with_shared_memory(backend::make_gloo_communicator(huge_spec), huge_spec,
                                          {.slot_bytes = int64_t{1} << 42});
  EXPECT_FALSE(backend::uses_shared_memory(*huge));
  at::Tensor t = at::full({3}, rdzv.rank() + 1.0, at::kFloat);
  huge->all_reduce(t);
  EXPECT_EQ(values(t), std::vector<double>(3, 3.0));

  // Bit for bit Gloo's all-reduce (two ranks: a + b either way), over many default-sized slots.
  const auto shm_spec = spec_for(rdzv, "shm"), gloo_spec = spec_for(rdzv, "gloo");
  auto shm = backend::with_shared_memory(backend::make_gloo_communicator(shm_spec), shm_spec);
  auto gloo = backend::make_gloo_communicator(gloo_spec);
  ASSERT_TRUE(backend::uses_shared_memory(*shm));
  at::manual_seed(100 + rdzv.rank());
  const at::Tensor x = at::randn({1000003}, at::kFloat);
  for (auto op : {ReduceOp::sum, ReduceOp::avg}) {
    at::Tensor a = x.clone(), b = x.clone();
    shm->all_reduce(a, op);
    gloo->all_reduce(b, op);
    EXPECT_TRUE(at::equal(a, b)) << backend::to_string(op);
  }
  // all_to_all equals Gloo's over many default-sized slot pieces (128 KiB each for two members).
  {
    const std::vector<int64_t> in_splits = rdzv.rank() == 0 ? std::vector<int64_t>{3000, 70001}
                                                             : std::vector<int64_t>{5, 0};
    const std::vector<int64_t> out_splits = rdzv.rank() == 0 ? std::vector<int64_t>{3000, 5}
                                                              : std::vector<int64_t>{70001, 0};
    const int64_t rows_in = in_splits[0] + in_splits[1], rows_out = out_splits[0] + out_splits[1];
    const at::Tensor in = at::randn({rows_in, 4}, at::kFloat);
    at::Tensor a = at::empty({rows_out, 4}, at::kFloat), b = at::empty({rows_out, 4}, at::kFloat);
    shm->all_to_all(a, in, out_splits, in_splits);
    gloo->all_to_all(b, in, out_splits, in_splits);
    EXPECT_TRUE(at::equal(a, b)) << "all_to_all";
  }
  // The same group's handshake again on the same store (a context rebuilt under its name): fresh
  // keys, so the members agree again instead of one of them reading the last handshake's.
  auto again = backend::with_shared_memory(backend::make_gloo_communicator(spec_for(rdzv, "again")),
                                           shm_spec);
  ASSERT_TRUE(backend::uses_shared_memory(*again));
  t = at::full({5}, rdzv.rank() + 1.0, at::kFloat);
  again->all_reduce(t);
  EXPECT_EQ(values(t), std::vector<double>(5, 3.0));
  std::printf("rank %d fallback and gloo equality ok\n", rdzv.rank());
}

TEST(ShmCollectives, FallBackWhenTheSegmentDoesNotFitAndMatchGlooBitForBit) {
  auto res = lf::testing::run_workers("shm_two_ranks",
                                      {.world_size = 2, .timeout = std::chrono::seconds(90)});
  lf::testing::expect_all_ok(res);
  EXPECT_NE(res[1].output.find("rank 1 fallback and gloo equality ok"), std::string::npos)
      << res[1].output;
  EXPECT_NE(res[0].output.find("no shared memory, its collectives keep their usual transport: "
                               "group rank 0: cannot reserve"),
            std::string::npos) << res[0].output;
}

}  // namespace
}  // namespace lf::dist

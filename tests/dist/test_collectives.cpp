// Every collective in every group of a ParallelContext, across real processes over Gloo, checked
// against values computed by hand from the group's ranks: global rank g contributes f(g), so an
// all-reduce over ranks R must give sum over R of f(g), and so on. Two layouts: 4 ranks TP=2 x
// PP=2 and 8 ranks TP=2 x CP=2 x DP=2; plus two contexts over different rank sets in one process.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "loongforge/backend/c10d_communicator.h"
#include "loongforge/backend/shm_communicator.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/dist/rendezvous.h"
#include "multiprocess.h"
#include "tensor_values.h"

namespace lf::dist {
namespace {

using backend::Communicator;
using backend::ReduceOp;

using lf::testing::values;

int arg_int(const std::string& key, int fallback) {
  for (const auto& a : lf::testing::worker_args())
    if (a.rfind(key + "=", 0) == 0) return std::stoi(a.substr(key.size() + 1));
  return fallback;
}

// All collectives of one group. g = this global rank, R = the group's global ranks, k = index.
void check_group(Communicator& c, const char* kind) {
  SCOPED_TRACE(std::string("group ") + kind + " '" + c.name() + "'");
  const std::vector<int>& R = c.ranks();
  const int n = c.size(), k = c.rank(), g = R[k];
  const double sum_r = std::accumulate(R.begin(), R.end(), 0.0);

  // all_reduce: f(g) = g + 1.
  at::Tensor t = at::full({3}, g + 1.0, at::kFloat);
  c.all_reduce(t);
  EXPECT_EQ(values(t), std::vector<double>(3, sum_r + n));
  t = at::full({2}, g + 1.0, at::kFloat);
  c.all_reduce(t, ReduceOp::avg);
  EXPECT_EQ(values(t), std::vector<double>(2, (sum_r + n) / n));
  t = at::full({2}, static_cast<double>(g), at::kFloat);
  c.all_reduce(t, ReduceOp::max);
  EXPECT_EQ(values(t), std::vector<double>(2, *std::max_element(R.begin(), R.end())));
  t = at::full({2}, static_cast<double>(g), at::kFloat);
  c.all_reduce(t, ReduceOp::min);
  EXPECT_EQ(values(t), std::vector<double>(2, *std::min_element(R.begin(), R.end())));
  at::Tensor ti = at::full({2}, static_cast<int64_t>(g + 1), at::kLong);
  c.all_reduce(ti);
  EXPECT_EQ(values(ti), std::vector<double>(2, sum_r + n));

  // all_gather: member g contributes [10g, 10g + 1].
  at::Tensor in = at::arange(2, at::kFloat) + 10.0 * g;
  at::Tensor out = at::empty({2 * n}, at::kFloat);
  c.all_gather(out, in);
  std::vector<double> want;
  for (int r : R) want.insert(want.end(), {10.0 * r, 10.0 * r + 1});
  EXPECT_EQ(values(out), want);

  // reduce_scatter: member g's input element j is 100g + j; this rank keeps chunk k (2 rows).
  in = at::arange(2 * n, at::kFloat) + 100.0 * g;
  out = at::empty({2}, at::kFloat);
  c.reduce_scatter(out, in);
  EXPECT_EQ(values(out),
            (std::vector<double>{100 * sum_r + n * (2.0 * k), 100 * sum_r + n * (2.0 * k + 1)}));
  in = at::arange(2 * n, at::kFloat) + 100.0 * g;
  c.reduce_scatter(out, in, ReduceOp::avg);
  EXPECT_EQ(values(out),
            (std::vector<double>{100 * sum_r / n + 2.0 * k, 100 * sum_r / n + 2.0 * k + 1}));

  // broadcast from the last member.
  t = at::full({2}, k == n - 1 ? static_cast<double>(g) : -1.0, at::kFloat);
  c.broadcast(t, n - 1);
  EXPECT_EQ(values(t), std::vector<double>(2, R[n - 1]));

  // all_to_all, uneven: member i sends i + j + 1 rows to member j, row r valued
  // 1000 R[i] + 10 j + r.
  std::vector<int64_t> in_splits(n), out_splits(n);
  std::vector<at::Tensor> parts;
  for (int j = 0; j < n; ++j) {
    in_splits[j] = k + j + 1;
    out_splits[j] = j + k + 1;
    parts.push_back(at::arange(in_splits[j], at::kFloat) + (1000.0 * g + 10.0 * j));
  }
  in = at::cat(parts);
  const int64_t out_rows = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
  out = at::full({out_rows}, -1.0, at::kFloat);
  c.all_to_all(out, in, out_splits, in_splits);
  want.clear();
  for (int i = 0; i < n; ++i)
    for (int r = 0; r < i + k + 1; ++r) want.push_back(1000.0 * R[i] + 10.0 * k + r);
  EXPECT_EQ(values(out), want);
  // Equal splits (empty split vectors): one row to each member.
  in = at::arange(n, at::kFloat) + 1000.0 * g;
  out = at::empty({n}, at::kFloat);
  c.all_to_all(out, in, {}, {});
  want.clear();
  for (int i = 0; i < n; ++i) want.push_back(1000.0 * R[i] + k);
  EXPECT_EQ(values(out), want);

  // Async: two all-reduces in flight, then wait.
  at::Tensor a = at::full({4}, 1.0, at::kFloat), b = at::full({4}, g + 1.0, at::kFloat);
  auto wa = c.all_reduce(a, ReduceOp::sum, /*async=*/true);
  auto wb = c.all_reduce(b, ReduceOp::avg, /*async=*/true);
  ASSERT_TRUE(wa && wb);
  wa->wait();
  wb->wait();
  EXPECT_TRUE(wa->is_completed());
  EXPECT_EQ(values(a), std::vector<double>(4, n));
  EXPECT_EQ(values(b), std::vector<double>(4, (sum_r + n) / n));
  at::Tensor ga = at::empty({n}, at::kFloat);
  at::Tensor gin = at::full({1}, static_cast<double>(g), at::kFloat);
  c.all_gather(ga, gin, /*async=*/true)->wait();
  EXPECT_EQ(values(ga), std::vector<double>(R.begin(), R.end()));

  // Ring send/recv inside the group: async send to k+1, blocking recv from k-1.
  if (n > 1) {
    at::Tensor s = at::full({2}, 7.0 * g, at::kFloat);
    auto ws = c.send(s, (k + 1) % n, /*tag=*/3, /*async=*/true);
    at::Tensor r = at::empty({2}, at::kFloat);
    c.recv(r, (k + n - 1) % n, /*tag=*/3);
    ws->wait();
    EXPECT_EQ(values(r), std::vector<double>(2, 7.0 * R[(k + n - 1) % n]));
  }
  c.barrier();
}

LF_WORKER_CASE(all_groups) {
  Rendezvous rdzv(detect_launch_env(), std::chrono::seconds(60));
  ParallelContext ctx(rdzv, ParallelLayout(rdzv.world_size(), {.tp = arg_int("tp", 1),
                                                               .cp = arg_int("cp", 1),
                                                               .ep = arg_int("ep", 1),
                                                               .pp = arg_int("pp", 1)}),
                      {.timeout = std::chrono::seconds(60)});
  int checked = 0;
  for (GroupKind kind : kAllGroupKinds)
    if (ctx.has(kind)) {
      check_group(ctx.group(kind), to_string(kind));
      ++checked;
    }

  // Pipeline send/recv between stages: forward activations, then gradients back.
  const int g = rdzv.rank();
  if (ctx.pp_size() > 1) {
    Communicator& pp = ctx.pp();
    at::Tensor act = at::empty({3}, at::kFloat);
    if (!ctx.is_first_stage()) {
      pp.recv(act, ctx.pp_rank() - 1);
      EXPECT_EQ(values(act), std::vector<double>(3, 10.0 * ctx.prev_stage_rank()));
    }
    if (!ctx.is_last_stage()) pp.send(at::full({3}, 10.0 * g, at::kFloat), ctx.pp_rank() + 1);
    if (!ctx.is_last_stage()) {
      pp.recv(act, ctx.pp_rank() + 1);
      EXPECT_EQ(values(act), std::vector<double>(3, -1.0 * ctx.next_stage_rank()));
    }
    if (!ctx.is_first_stage()) pp.send(at::full({3}, -1.0 * g, at::kFloat), ctx.pp_rank() - 1);
  }
  // The tied-embedding gradient all-reduce: first + last stage of each pipeline.
  if (ctx.in_embedding_group()) {
    at::Tensor e = at::full({1}, g + 1.0, at::kFloat);
    ctx.embedding().all_reduce(e);
    const auto& R = ctx.embedding().ranks();
    EXPECT_EQ(values(e)[0], (R.front() + 1.0) + (R.size() > 1 ? R.back() + 1.0 : 0.0));
  }
  std::printf("rank %d tp %d cp %d dp %d pp %d checked %d kinds ok (shared memory %d)\n", g,
              ctx.tp_rank(), ctx.cp_rank(), ctx.dp_rank(), ctx.pp_rank(), checked,
              static_cast<int>(backend::uses_shared_memory(ctx.world())));
}

// Hand-written results for TP=2 x PP=2 (rank = tp + 2 * pp): tp groups [0,1] [2,3], pp groups
// [0,2] [1,3], embedding = pp groups. Contribution g + 1.
LF_WORKER_CASE(tp2_pp2_literal) {
  Rendezvous rdzv(detect_launch_env(), std::chrono::seconds(60));
  ParallelContext ctx(rdzv, ParallelLayout(4, {.tp = 2, .pp = 2}),
                      {.timeout = std::chrono::seconds(60)});
  const int g = rdzv.rank();
  const double tp_sum[] = {3, 3, 7, 7};   // 1+2, 1+2, 3+4, 3+4
  const double pp_sum[] = {4, 6, 4, 6};   // 1+3, 2+4, 1+3, 2+4
  at::Tensor t = at::full({1}, g + 1.0, at::kFloat);
  ctx.tp().all_reduce(t);
  EXPECT_EQ(values(t)[0], tp_sum[g]);
  t = at::full({1}, g + 1.0, at::kFloat);
  ctx.pp().all_reduce(t);
  EXPECT_EQ(values(t)[0], pp_sum[g]);
  t = at::full({1}, g + 1.0, at::kFloat);
  ctx.mp().all_reduce(t);
  EXPECT_EQ(values(t)[0], 10.0);
  t = at::full({1}, g + 1.0, at::kFloat);
  ctx.dp().all_reduce(t);  // dp = 1: each rank alone
  EXPECT_EQ(values(t)[0], g + 1.0);
  EXPECT_EQ(ctx.embedding().ranks(), (std::vector<int>{g % 2, g % 2 + 2}));
  EXPECT_EQ(ctx.is_first_stage(), g < 2);
  EXPECT_EQ(ctx.is_last_stage(), g >= 2);
}

// Two contexts in one process over different rank sets: "decoder" over all 4 ranks (tp 2 x pp 2)
// and "encoder" over ranks [3, 1] only (tp 2), as a VLM with heterogeneous parallelism would have.
LF_WORKER_CASE(two_contexts) {
  Rendezvous rdzv(detect_launch_env(), std::chrono::seconds(60));
  const int g = rdzv.rank();
  ParallelContext decoder(rdzv, ParallelLayout(4, {.tp = 2, .pp = 2}),
                          {.name = "decoder", .timeout = std::chrono::seconds(60)});
  std::unique_ptr<ParallelContext> encoder;
  if (g == 1 || g == 3)
    encoder = std::make_unique<ParallelContext>(
        rdzv, ParallelLayout(2, {.tp = 2}),
        ParallelContextOptions{.name = "encoder", .world_ranks = {3, 1},
                               .timeout = std::chrono::seconds(60),
                               .kinds = {GroupKind::world, GroupKind::tp}});
  at::Tensor t = at::full({1}, g + 1.0, at::kFloat);
  decoder.tp().all_reduce(t);
  EXPECT_EQ(values(t)[0], g < 2 ? 3.0 : 7.0);
  EXPECT_EQ(decoder.tp().name(), "decoder/tp");
  if (encoder) {
    EXPECT_EQ(encoder->tp().ranks(), (std::vector<int>{3, 1}));
    EXPECT_EQ(encoder->rank(), g == 3 ? 0 : 1);
    EXPECT_EQ(encoder->tp_rank(), g == 3 ? 0 : 1);
    t = at::full({1}, g + 1.0, at::kFloat);
    encoder->tp().all_reduce(t);
    EXPECT_EQ(values(t)[0], 6.0);  // 4 + 2
    at::Tensor out = at::empty({2}, at::kFloat);
    encoder->tp().all_gather(out, at::full({1}, static_cast<double>(g), at::kFloat));
    EXPECT_EQ(values(out), (std::vector<double>{3, 1}));  // group-rank order
    EXPECT_THROW(encoder->dp(), lf::Error);  // not created
  }
  decoder.world().barrier();
}

TEST(DistCollectives, FourRanksTp2Pp2EveryGroup) {
  auto res = lf::testing::run_workers("all_groups", {.world_size = 4,
                                                     .timeout = std::chrono::seconds(90),
                                                     .args = {"tp=2", "pp=2"}});
  lf::testing::expect_all_ok(res);
  EXPECT_NE(res[3].output.find("rank 3 tp 1 cp 0 dp 0 pp 1 checked 13 kinds ok (shared memory 1)"),
            std::string::npos) << res[3].output;
}

// The same with shared memory turned off: every collective on Gloo's sockets.
TEST(DistCollectives, FourRanksTp2Pp2EveryGroupOnGlooAlone) {
  auto res = lf::testing::run_workers("all_groups", {.world_size = 4,
                                                     .timeout = std::chrono::seconds(90),
                                                     .env = {{"LOONGFORGE_SHM_COLLECTIVES", "0"}},
                                                     .args = {"tp=2", "pp=2"}});
  lf::testing::expect_all_ok(res);
  EXPECT_NE(res[3].output.find("rank 3 tp 1 cp 0 dp 0 pp 1 checked 13 kinds ok (shared memory 0)"),
            std::string::npos) << res[3].output;
}

TEST(DistCollectives, FourRanksTp2Pp2Literal) {
  lf::testing::expect_all_ok(lf::testing::run_workers(
      "tp2_pp2_literal", {.world_size = 4, .timeout = std::chrono::seconds(90)}));
}

TEST(DistCollectives, EightRanksTp2Cp2Dp2EveryGroup) {
  auto res = lf::testing::run_workers("all_groups", {.world_size = 8,
                                                     .timeout = std::chrono::seconds(150),
                                                     .args = {"tp=2", "cp=2", "ep=2"}});
  lf::testing::expect_all_ok(res);
  // rank 6 = tp 0 + 2 * cp 1 + 4 * dp 1.
  EXPECT_NE(res[6].output.find("rank 6 tp 0 cp 1 dp 1 pp 0 checked 13 kinds ok (shared memory 1)"),
            std::string::npos) << res[6].output;
}

TEST(DistCollectives, TwoContextsOverDifferentRanks) {
  lf::testing::expect_all_ok(lf::testing::run_workers(
      "two_contexts", {.world_size = 4, .timeout = std::chrono::seconds(90)}));
}

}  // namespace
}  // namespace lf::dist

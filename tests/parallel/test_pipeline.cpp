// Pipeline parallelism in-process: the layer split (even, uneven, errors naming the values), the
// stage-to-stage exchange with shapes agreed at run time (variable shapes and dtypes, both
// directions), the interleaved order (simulated: no deadlock, the theoretical bubble), and the
// decoder split into PP = 2 / 4 stages under the no-pipelining, 1F1B and interleaved schedules,
// whose loss and every gradient equal the single-process decoder from the same seed over
// micro-batches of different sequence lengths (tied and untied embeddings, uneven split).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ThreadLocalState.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/core/stream_pair.h"
#include "error_message.h"
#include "loongforge/dist/launch_env.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/dist/rendezvous.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/parallel/pipeline/p2p.h"
#include "loongforge/parallel/pipeline/schedules.h"
#include "loongforge/parallel/pipeline/stages.h"
#include "multiprocess.h"
#include "../models/tiny_decoder.h"

namespace {
using Decoder = lf::models::CausalLm;
using lf::models::DecoderConfig;
namespace pl = lf::parallel::pipeline;

// pp stages over the worker's world (dp = world / pp). Once per process.
std::unique_ptr<lf::dist::ParallelContext> make_pp_context(int pp) {
  static lf::dist::Rendezvous rendezvous(lf::dist::detect_launch_env(), std::chrono::seconds(60));
  lf::dist::ParallelSizes sizes;
  sizes.pp = pp;
  lf::dist::ParallelLayout layout(rendezvous.world_size(), sizes);
  lf::dist::ParallelContextOptions options;
  options.timeout = std::chrono::seconds(60);
  options.kinds = {lf::dist::GroupKind::world, lf::dist::GroupKind::pp, lf::dist::GroupKind::dp,
                   lf::dist::GroupKind::embedding};
  return std::make_unique<lf::dist::ParallelContext>(rendezvous, layout, options);
}

TEST(PipelineSplit, EvenAndUneven) {
  auto even = pl::split_layers(8, 4);
  ASSERT_EQ(even.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(even[k].begin, 2 * k);
    EXPECT_EQ(even[k].end, 2 * k + 2);
  }
  // Megatron's uneven split: first / last given, the rest even over the other stages.
  auto uneven = pl::split_layers(10, 4, 1, 3);
  std::vector<int64_t> sizes;
  for (const auto& r : uneven) sizes.push_back(r.size());
  EXPECT_EQ(sizes, (std::vector<int64_t>{1, 3, 3, 3}));
  EXPECT_EQ(uneven.back().end, 10);
  auto first_only = pl::split_layers(5, 3, 1);
  EXPECT_EQ(first_only[0].size(), 1);
  EXPECT_EQ(first_only[1].size(), 2);
  EXPECT_EQ(first_only[2].size(), 2);
  EXPECT_EQ(pl::warmup_forwards(0, 4, 8), 3);
  EXPECT_EQ(pl::warmup_forwards(3, 4, 8), 0);
  EXPECT_EQ(pl::warmup_forwards(0, 4, 2), 2);
}

TEST(PipelineSplit, VirtualStagesGoRoundTheRanks) {
  // 8 layers, pp 2, 2 layers per virtual stage: virtual stages 0..3; rank r holds c * 2 + r.
  auto v = pl::split_virtual_layers(8, 2, 2);
  ASSERT_EQ(v.size(), 2u);
  ASSERT_EQ(v[0].size(), 2u);
  EXPECT_EQ(v[0][0].begin, 0);
  EXPECT_EQ(v[0][1].begin, 4);
  EXPECT_EQ(v[1][0].begin, 2);
  EXPECT_EQ(v[1][1].end, 8);
  auto m = lf::testing::error_message([] { pl::split_virtual_layers(6, 2, 2); });
  EXPECT_NE(m.find("num_layers 6 is not divisible by parallel.pipeline_model_parallel_size 2 x "
                   "parallel.num_layers_per_virtual_pipeline_stage 2 = 4"),
            std::string::npos)
      << m;
  DecoderConfig c;
  c.num_layers = 8;
  auto stage = lf::models::pipeline_stage(c, 2, 1, {}, {}, 2);
  EXPECT_FALSE(stage.first);
  EXPECT_TRUE(stage.last);
  EXPECT_EQ(stage.num_chunks(), 2);
  m = lf::testing::error_message([&] { lf::models::pipeline_stage(c, 2, 1, 2, {}, 2); });
  EXPECT_NE(m.find("cannot be combined"), std::string::npos) << m;
}

TEST(PipelineSplit, LayoutStringsAsMegatron) {
  // 4 stages over pp 2 (v = 2), an embedding-only first stage and a loss-only last stage:
  // stage 0 "E" (no layers), 1 "ttt" (0..2), 2 "t" (3), 3 "L" (none).
  auto l = pl::split_by_layout("E|t*3|t|L", 4, 2);
  ASSERT_EQ(l.size(), 2u);
  ASSERT_EQ(l[0].size(), 2u);
  EXPECT_EQ(l[0][0].size(), 0);
  EXPECT_EQ(l[0][1].begin, 3);
  EXPECT_EQ(l[0][1].end, 4);
  EXPECT_EQ(l[1][0].begin, 0);
  EXPECT_EQ(l[1][0].end, 3);
  EXPECT_EQ(l[1][1].size(), 0);
  // Groups, commas and spaces: "Et*2|(t|)*2, tL" = Ett | t | t | tL over pp 4.
  auto g = pl::split_by_layout("Et*2|(t|)*2, tL", 5, 4);
  std::vector<int64_t> sizes;
  for (const auto& r : g) sizes.push_back(r[0].size());
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 1, 1, 1}));
  for (const auto& [layout, want] : std::vector<std::pair<std::string, std::string>>{
           {"Et|t|tL", "has 3 stages, not a multiple of parallel.pipeline_model_parallel_size 2"},
           {"Et|ttL", "places 3 decoder layers ('t'), model.foundation.num_layers is 4"},
           {"Ett|ttm|L", "symbol 'm' at position 6 (MTP layers) is not supported"},
           {"tEt|ttL", "'E' in stage 0 must open the first stage"},
           {"Ett|tt", "needs 'E' (embedding) in the first stage and 'L' (loss) in the last"},
           {"E(tt|ttL", "'(' is not closed"}}) {
    auto m = lf::testing::error_message([&] { pl::split_by_layout(layout, 4, 2); });
    EXPECT_NE(m.find(want), std::string::npos) << layout << ": " << m;
  }
  // One rank with two stages would be an interleaved schedule without pipeline parallelism (it
  // trained with no loss term); one stage at pp 1 is the plain model.
  auto one = lf::testing::error_message([&] { pl::split_by_layout("Ett|ttL", 4, 1); });
  EXPECT_NE(one.find("has 2 stages and parallel.pipeline_model_parallel_size is 1"), std::string::npos) << one;
  EXPECT_EQ(pl::split_by_layout("EttttL", 4, 1)[0].size(), 1u);
  DecoderConfig c;
  c.num_layers = 4;
  auto m = lf::testing::error_message([&] { lf::models::pipeline_stage(c, 2, 0, 1, {}, {}, std::string("Et|ttt|L")); });
  EXPECT_NE(m.find("cannot be combined"), std::string::npos) << m;
}

// The interleaved order, executed by a discrete-event simulation of the stages with the runner's
// rules (an op waits for the op that produces its input on the neighbouring stage; sends never
// block): every op runs once (no deadlock), each backward after its forward, and with forward
// cost 1 / v and backward 2 / v per chunk every stage idles exactly (p - 1) / (v m + p - 1) of the
// step, the interleaved bubble (v = 1 reproduces 1F1B's (p - 1) / (m + p - 1)).
TEST(PipelineInterleavedOrder, NoDeadlockAndTheTheoreticalBubble) {
  struct Case {
    int p, v;
    int64_t m;
  };
  for (const Case& c : {Case{2, 2, 2}, Case{2, 2, 4}, Case{4, 2, 4}, Case{4, 2, 8}, Case{4, 4, 8},
                        Case{3, 2, 6}, Case{8, 2, 16}, Case{4, 1, 8}}) {
    SCOPED_TRACE("p " + std::to_string(c.p) + " v " + std::to_string(c.v) + " m " + std::to_string(c.m));
    std::vector<std::vector<pl::ScheduledOp>> orders;
    for (int r = 0; r < c.p; ++r) orders.push_back(pl::interleaved_1f1b_order(r, c.p, c.v, c.m));
    for (const auto& o : orders) ASSERT_EQ(o.size(), static_cast<size_t>(2 * c.v * c.m));
    // (kind, virtual stage, micro-batch) -> finish time
    std::map<std::tuple<char, int64_t, int64_t>, double> done;
    std::vector<size_t> pos(static_cast<size_t>(c.p), 0);
    std::vector<double> clock(static_cast<size_t>(c.p), 0), busy(static_cast<size_t>(c.p), 0);
    const int64_t last = static_cast<int64_t>(c.p) * c.v - 1;
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < c.p; ++r) {
        auto& i = pos[static_cast<size_t>(r)];
        while (i < orders[static_cast<size_t>(r)].size()) {
          const auto op = orders[static_cast<size_t>(r)][i];
          const int64_t vs = static_cast<int64_t>(op.chunk) * c.p + r;
          std::optional<std::tuple<char, int64_t, int64_t>> dep;
          if (op.kind == 'F' && vs > 0) dep = std::make_tuple('F', vs - 1, op.micro_batch);
          if (op.kind == 'B') {
            ASSERT_TRUE(done.count({'F', vs, op.micro_batch})) << "backward before its forward";
            if (vs < last) dep = std::make_tuple('B', vs + 1, op.micro_batch);
          }
          if (dep && !done.count(*dep)) break;
          const double start = std::max(clock[static_cast<size_t>(r)], dep ? done[*dep] : 0.0);
          const double cost = (op.kind == 'F' ? 1.0 : 2.0) / c.v;
          clock[static_cast<size_t>(r)] = start + cost;
          busy[static_cast<size_t>(r)] += cost;
          ASSERT_TRUE(done.emplace(std::make_tuple(op.kind, vs, op.micro_batch), start + cost).second)
              << "op twice";
          ++i;
          progress = true;
        }
      }
    }
    for (int r = 0; r < c.p; ++r)
      ASSERT_EQ(pos[static_cast<size_t>(r)], orders[static_cast<size_t>(r)].size()) << "deadlock at stage " << r;
    const double step = *std::max_element(clock.begin(), clock.end());
    const double theory = (c.p - 1.0) / (c.v * c.m + c.p - 1.0);
    for (int r = 0; r < c.p; ++r) EXPECT_NEAR(1 - busy[static_cast<size_t>(r)] / step, theory, 1e-9) << r;
  }
  // Between every ordered pair of ranks, the messages (activations and gradients together) are sent
  // in the order the receiver needs them, for 140 layouts. So a transport that matches sends to
  // receives by order alone (NCCL, which ignores tags) pairs them right, even at p = 2 where both
  // kinds travel between the same two ranks.
  for (int p = 2; p <= 8; ++p)
    for (int v = 1; v <= 4; ++v)
      for (int64_t m = p; m <= 5 * p; m += p) {
        using Msg = std::tuple<char, int64_t, int64_t>;  // kind, producing virtual stage, micro-batch
        std::map<std::pair<int, int>, std::vector<Msg>> sent, needed;
        const int64_t last = static_cast<int64_t>(p) * v - 1;
        for (int r = 0; r < p; ++r)
          for (const auto& op : pl::interleaved_1f1b_order(r, p, v, m)) {
            const int64_t vs = static_cast<int64_t>(op.chunk) * p + r;
            if (op.kind == 'F') {
              if (vs < last) sent[{r, (r + 1) % p}].emplace_back('a', vs, op.micro_batch);
              if (vs > 0) needed[{(r + p - 1) % p, r}].emplace_back('a', vs - 1, op.micro_batch);
            } else {
              if (vs > 0) sent[{r, (r + p - 1) % p}].emplace_back('g', vs, op.micro_batch);
              if (vs < last) needed[{(r + 1) % p, r}].emplace_back('g', vs + 1, op.micro_batch);
            }
          }
        EXPECT_EQ(sent, needed) << "p " << p << " v " << v << " m " << m;
      }
  auto m = lf::testing::error_message([] { pl::interleaved_1f1b_order(0, 4, 2, 6); });
  EXPECT_NE(m.find("needs the number of micro-batches (6) to be a multiple of parallel.pipeline_model_parallel_size 4"),
            std::string::npos)
      << m;
}

// The paired interleaved order (the MoE overlap across micro-batches): each marked forward is
// followed by a backward, and the runner receives both inputs, computes both as one pair, then
// sends both (forward first). Simulated with each pair as one step that starts only when both
// its inputs exist, every op runs once on 140 layouts (no deadlock: neither half of a pair waits
// for the other on any stage, and a backward never pairs with its own forward), every steady-state
// forward is paired, and between every ordered pair of ranks the messages are sent in the order
// the receiver takes them. Without the extra warm-up forward the same simulation deadlocks.
TEST(PipelineInterleavedOrder, PairsNeverWaitOnEachOther) {
  using Op = std::tuple<char, int64_t, int64_t>;  // kind, virtual stage, micro-batch
  auto groups_of = [](int r, int p, int v, int64_t m, bool extra_warmup) {
    // The paired order, or (extra_warmup false) Megatron's with its steady-state F, B grouped alike.
    std::vector<std::vector<Op>> groups;
    const auto ops = pl::interleaved_1f1b_order(r, p, v, m, extra_warmup);
    for (size_t i = 0; i < ops.size(); ++i) {
      auto vs = [&](const pl::ScheduledOp& o) { return static_cast<int64_t>(o.chunk) * p + r; };
      const bool pair = extra_warmup ? ops[i].paired : ops[i].kind == 'F' && i + 1 < ops.size() && ops[i + 1].kind == 'B';
      groups.push_back({{ops[i].kind, vs(ops[i]), ops[i].micro_batch}});
      if (pair) {
        EXPECT_EQ(ops[i + 1].kind, 'B');
        ++i;
        groups.back().emplace_back(ops[i].kind, vs(ops[i]), ops[i].micro_batch);
      }
    }
    return groups;
  };
  auto runs_through = [&](int p, int v, int64_t m, bool extra_warmup) {
    std::vector<std::vector<std::vector<Op>>> orders;
    for (int r = 0; r < p; ++r) orders.push_back(groups_of(r, p, v, m, extra_warmup));
    const int64_t last = static_cast<int64_t>(p) * v - 1;
    std::set<Op> done;
    std::vector<size_t> pos(static_cast<size_t>(p), 0);
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < p; ++r)
        for (auto& i = pos[static_cast<size_t>(r)]; i < orders[static_cast<size_t>(r)].size(); ++i) {
          bool ready = true;
          for (const auto& [kind, vs, mb] : orders[static_cast<size_t>(r)][i]) {
            if (kind == 'F' && vs > 0) ready = ready && done.count({'F', vs - 1, mb});
            if (kind == 'B') ready = ready && done.count({'F', vs, mb}) && (vs == last || done.count({'B', vs + 1, mb}));
          }
          if (!ready) break;
          for (const auto& op : orders[static_cast<size_t>(r)][i]) EXPECT_TRUE(done.insert(op).second) << "op twice";
          progress = true;
        }
    }
    for (int r = 0; r < p; ++r)
      if (pos[static_cast<size_t>(r)] != orders[static_cast<size_t>(r)].size()) return false;
    return true;
  };
  int layouts = 0;
  for (int p = 2; p <= 8; ++p)
    for (int v = 1; v <= 4; ++v)
      for (int64_t m = p; m <= 5 * p; m += p) {
        SCOPED_TRACE("p " + std::to_string(p) + " v " + std::to_string(v) + " m " + std::to_string(m));
        ++layouts;
        EXPECT_TRUE(runs_through(p, v, m, true));
        if (m > p) EXPECT_FALSE(runs_through(p, v, m, false)) << "Megatron's warm-up pairs without deadlock";
        const int64_t last = static_cast<int64_t>(p) * v - 1;
        std::map<std::pair<int, int>, std::vector<Op>> sent, needed;
        for (int r = 0; r < p; ++r) {
          const auto ops = pl::interleaved_1f1b_order(r, p, v, m, true);
          int64_t pairs = 0, steady = 0;
          for (size_t i = 0; i < ops.size(); ++i) {
            pairs += ops[i].paired;
            steady += ops[i].kind == 'F' && i + 1 < ops.size() && ops[i + 1].kind == 'B';
          }
          EXPECT_EQ(pairs, m == p ? 0 : steady) << "rank " << r;  // m = p: every forward first, no pairs
          if (m > p && r == 0) EXPECT_GT(pairs, 0);
          for (const auto& g : groups_of(r, p, v, m, true)) {
            for (const auto& [kind, vs, mb] : g) {  // receives, before computing
              if (kind == 'F' && vs > 0) needed[{(r + p - 1) % p, r}].emplace_back('a', vs - 1, mb);
              if (kind == 'B' && vs < last) needed[{(r + 1) % p, r}].emplace_back('g', vs + 1, mb);
            }
            for (const auto& [kind, vs, mb] : g) {  // sends, after computing
              if (kind == 'F' && vs < last) sent[{r, (r + 1) % p}].emplace_back('a', vs, mb);
              if (kind == 'B' && vs > 0) sent[{r, (r + p - 1) % p}].emplace_back('g', vs, mb);
            }
          }
        }
        EXPECT_EQ(sent, needed);
      }
  EXPECT_EQ(layouts, 140);
}

TEST(PipelineSplit, ErrorsNameTheValues) {
  auto m = lf::testing::error_message([] { pl::split_layers(3, 2); });
  EXPECT_NE(m.find("num_layers 3 is not divisible by parallel.pipeline_model_parallel_size 2"),
            std::string::npos)
      << m;
  m = lf::testing::error_message([] { pl::split_layers(10, 4, 2); });  // 8 left for 3 stages
  EXPECT_NE(m.find("leaves 8 layers for the other 3"), std::string::npos) << m;
  m = lf::testing::error_message([] { pl::split_layers(4, 1, 2); });
  EXPECT_NE(m.find("pipeline_model_parallel_size > 1"), std::string::npos) << m;
}

// Every stage sends forward tensors whose shape and dtype change per message (the receiver knows
// neither in advance), each stage checks what it got and passes it on plus one; then the same
// backward. Single direction and the combined calls of 1F1B.
LF_WORKER_CASE(pp_exchange) {
  auto ctx = make_pp_context(lf::testing::worker_world_size());
  pl::StageExchange ex(ctx->pp(), c10::Device(c10::kCPU));
  const int stage = ex.stage(), n = ex.num_stages();
  ASSERT_EQ(n, lf::testing::worker_world_size());
  auto make = [](int i) {
    // [i + 1, 2, 3] float, then a 1-d bf16, then a 4-d int64: shapes and dtypes vary.
    if (i % 3 == 0) return at::arange(6 * (i + 1), at::kFloat).view({i + 1, 2, 3});
    if (i % 3 == 1) return at::arange(5 + i, at::kFloat).to(at::kBFloat16);
    return at::arange(2 * 1 * 3 * (i + 1), at::kLong).view({2, 1, 3, i + 1});
  };
  for (int i = 0; i < 6; ++i) {
    at::Tensor t = ex.is_first() ? make(i) : ex.recv_forward();
    if (!ex.is_first()) {
      ASSERT_EQ(t.sizes(), make(i).sizes()) << "message " << i << " at stage " << stage;
      ASSERT_EQ(t.scalar_type(), make(i).scalar_type());
      EXPECT_TRUE(at::equal(t, make(i) + stage)) << "message " << i << " at stage " << stage;
    }
    ex.send_forward(t + 1);
  }
  for (int i = 0; i < 6; ++i) {
    at::Tensor t = ex.is_last() ? make(i) * 2 : ex.recv_backward();
    if (!ex.is_last()) EXPECT_TRUE(at::equal(t, make(i) * 2 + (n - 1 - stage))) << i;
    ex.send_backward(t + 1);
  }
  // Opposite directions at once: stage k sends forward and waits for the gradient while stage
  // k + 1 sends its gradient and waits for the activation (the 1F1B steady state).
  for (int i = 0; i < 3; ++i) {
    at::Tensor act = at::full({i + 2, 3}, 10.0 * stage + i);
    if (stage % 2 == 0) {
      at::Tensor g = ex.send_forward_recv_backward(act);
      if (!ex.is_last()) EXPECT_TRUE(at::equal(g, at::full({i + 4}, -1.0 * (stage + 1))));
    } else {
      at::Tensor a = ex.send_backward_recv_forward(at::full({i + 4}, -1.0 * stage));
      EXPECT_TRUE(at::equal(a, at::full({i + 2, 3}, 10.0 * (stage - 1) + i)));
    }
  }
  ex.flush();
}

TEST(PipelineExchange, VariableShapesBothDirectionsPp2) {
  lf::testing::expect_all_ok(lf::testing::run_workers("pp_exchange", {.world_size = 2}));
}
TEST(PipelineExchange, VariableShapesBothDirectionsPp4) {
  lf::testing::expect_all_ok(lf::testing::run_workers("pp_exchange", {.world_size = 4}));
}

// A stage passes a named set (hidden states that carry gradients, integer positions and a float
// tap that do not) through 1F1B: the next stage gets every entry with its name, dtype and
// requires-grad flag, and gradients come back for the differentiable entry only; the loss and
// the first stage's gradient equal the same computation in one process.
LF_WORKER_CASE(pp_named_exchange) {
  auto ctx = make_pp_context(2);
  pl::StageExchange ex(ctx->pp(), c10::Device(c10::kCPU));
  const int64_t m_total = 3;
  at::Tensor w = at::full({4}, 0.5).set_requires_grad(true);  // stage 0's parameter
  auto inputs = [](int64_t m) { return at::arange(8, at::kFloat).view({2, 4}) * (m + 1) * 0.1; };
  pl::StageStep step;
  step.forward = [&](int64_t m, const pl::TensorMap& in) {
    pl::StageResult r;
    if (ex.is_first()) {
      r.activations.set("hidden_states", inputs(m) * w);
      r.activations.set("positions", at::arange(2, at::kLong) + m);
      r.activations.set("tap", at::full({2}, 3.0 * m));
      return r;
    }
    EXPECT_EQ(in.size(), 3u);
    EXPECT_TRUE(in.at("hidden_states").requires_grad());
    EXPECT_FALSE(in.at("positions").requires_grad());
    EXPECT_EQ(in.at("positions").scalar_type(), at::kLong);
    EXPECT_TRUE(at::equal(in.at("positions"), at::arange(2, at::kLong) + m));
    EXPECT_FALSE(in.at("tap").requires_grad());
    auto scale = (in.at("positions").to(at::kFloat) + in.at("tap")).unsqueeze(1);  // [2, 1]
    r.loss = (in.at("hidden_states").pow(2) * scale).sum();
    return r;
  };
  const double loss = pl::run_1f1b(ex, m_total, step);
  // One process: the same two stages composed.
  at::Tensor w1 = at::full({4}, 0.5).set_requires_grad(true);
  double want = 0;
  for (int64_t m = 0; m < m_total; ++m) {
    auto h = inputs(m) * w1;
    auto scale = ((at::arange(2, at::kLong) + m).to(at::kFloat) + 3.0 * m).unsqueeze(1);
    auto l = (h.pow(2) * scale).sum();
    l.backward();
    want += l.item<double>();
  }
  if (ex.is_last()) EXPECT_NEAR(loss, want, 1e-5 * want);
  if (ex.is_first()) EXPECT_TRUE(at::allclose(w.grad(), w1.grad())) << w.grad() << " vs " << w1.grad();
}

TEST(PipelineExchange, NamedTensorSetsCarryNamesDtypesAndGradientFlags) {
  lf::testing::expect_all_ok(lf::testing::run_workers("pp_named_exchange", {.world_size = 2}));
}

DecoderConfig tiny(bool untied) {
  DecoderConfig c = lf::testing::tiny_decoder_config();  // vocabulary 50 padded to 56, 16 positions
  c.num_layers = 4;
  if (untied) {
    c.untie_embeddings_and_output_weights = true;
    c.qk_layernorm = true;
    c.add_qkv_bias = true;
  }
  return c;
}

// Micro-batches of different sequence lengths (the stages learn each shape from the header).
constexpr int64_t kMicroBatches = 4;
std::pair<at::Tensor, at::Tensor> micro_batch(int64_t m, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + m);
  const int64_t s = 6 + 2 * m;  // 6, 8, 10, 12
  auto tokens = at::randint(0, vocab, {2, s}, gen, at::TensorOptions().dtype(at::kLong));
  auto labels = at::randint(0, vocab, {2, s}, gen, at::TensorOptions().dtype(at::kLong));
  labels.index_put_({0, 1}, -100);
  return {tokens, labels};
}

// The scaled per-micro-batch loss of the trainer: sum / (tokens x micro-batches).
at::Tensor scaled(const at::Tensor& per_token) {
  return per_token.sum() / static_cast<double>(per_token.numel() * kMicroBatches);
}

// Tolerance (fp32, relative to the largest magnitude of the reference): the stages compute the
// same ops on the same numbers as the single process; only the accumulation order of gradients
// that meet (the tied embedding: two stages' parts summed by an all-reduce) and ATen's kernel
// choices for different-sized blocks differ, a few ulps (1e-7). 1e-5 is far below any real
// error (a lost micro-batch, a wrong stage boundary or a missing gradient is O(1e-2) or more).
constexpr double kRel = 1e-5;

// virtual_layers: interleaved 1F1B with that many layers per virtual stage (the model then has
// 8 layers: v = 2 at PP 4).
// paired: 1F1B with StageStep::run_pair, interleaved with VirtualStageStep::run_pair (the MoE
// overlap across micro-batches): each forward hands over to the paired backward twice, as an MoE
// layer's all-to-all waits would.
void check_pipeline(lf::dist::ParallelContext& ctx, bool untied, bool one_f_one_b,
                    std::optional<int64_t> first = {}, std::optional<int64_t> last = {},
                    std::optional<int64_t> virtual_layers = {}, std::optional<std::string> layout = {},
                    bool paired = false) {
  SCOPED_TRACE(std::string(untied ? "untied" : "tied") + (one_f_one_b ? " 1F1B" : " no pipelining") +
               (first || last ? " uneven" : "") + (virtual_layers ? " interleaved" : "") +
               (layout ? " layout " + *layout : "") + (paired ? " paired" : ""));
  const auto& be = lf::backend::cpu_backend();
  auto c = tiny(untied);
  if (virtual_layers) c.num_layers = 8;
  Decoder single(c, be, 11, at::kFloat);
  if (untied) {  // biases start at zero and norms at one: move them so that they matter
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < single.parameters().size(); ++i) {
      auto& q = single.parameters()[i];
      auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + i);
      q.tensor.add_(at::randn(q.tensor.sizes(), gen, at::TensorOptions().dtype(at::kFloat)) * 0.05);
    }
  }
  double want_loss = 0;
  for (int64_t m = 0; m < kMicroBatches; ++m) {
    auto [tokens, labels] = micro_batch(m, c.vocab_size);
    auto l = scaled(single.loss(tokens, labels));
    l.backward();
    want_loss += l.item<double>();
  }

  const auto stage = lf::models::pipeline_stage(c, ctx.pp_size(), ctx.pp_rank(), first, last, virtual_layers, layout);
  Decoder part(c, be, 11, at::kFloat, &ctx, false, stage);
  if (untied) {
    std::map<std::string, at::Tensor> full;
    for (const auto& q : single.parameters()) full[q.name] = q.tensor.detach();
    part.load_full_parameters(full);  // other stages' names are accepted
  }
  std::map<std::string, const lf::parallel::Parameter*> by_name;
  for (const auto& q : single.parameters()) by_name[q.name] = &q;
  // Initialisation independent of the layout: each stage's tensors are the single model's.
  for (const auto& p : part.parameters()) {
    ASSERT_TRUE(by_name.count(p.name)) << p.name;
    EXPECT_TRUE(at::equal(p.tensor, by_name[p.name]->tensor)) << p.name;
    EXPECT_EQ(p.tied_copy, !untied && stage.last && !stage.first && p.name.starts_with("embedding"))
        << p.name;
  }

  pl::StageExchange ex(ctx.pp(), be.device());
  pl::StageStep step;
  lf::StreamPair pair;
  int64_t pairs = 0;
  if (paired)
    step.run_pair = [&](const std::function<void()>& f, const std::function<void()>& b) {
      const at::ThreadLocalState state;
      pair.run(f, [&] {
        const at::ThreadLocalStateGuard guard(state);
        b();
      });
      ++pairs;
    };
  step.forward = [&](int64_t m, const pl::TensorMap& input) {
    auto [tokens, labels] = micro_batch(m, c.vocab_size);
    if (paired) pair.yield();
    auto out = part.stage_forward(stage.first ? tokens : input.at("hidden_states"), labels);
    if (paired) pair.yield();
    pl::StageResult r;
    if (stage.last)
      r.loss = scaled(out);
    else
      r.activations.set("hidden_states", out);
    return r;
  };
  int64_t next_backward = 0;
  step.before_backward = [&](int64_t m) { EXPECT_EQ(m, next_backward++); };
  double loss = 0;
  if (virtual_layers || stage.num_chunks() > 1) {
    const int chunks = static_cast<int>(stage.num_chunks());
    ASSERT_GT(chunks, 1);
    pl::VirtualStageStep vstep;
    vstep.forward = [&](int chunk, int64_t m, const pl::TensorMap& input) {
      auto [tokens, labels] = micro_batch(m, c.vocab_size);
      const bool embeds = stage.first && chunk == 0, heads = stage.last && chunk == chunks - 1;
      if (paired) pair.yield();
      auto out = part.stage_forward(embeds ? tokens : input.at("hidden_states"), heads ? labels : at::Tensor(), chunk);
      if (paired) pair.yield();
      pl::StageResult r;
      if (heads)
        r.loss = scaled(out);
      else
        r.activations.set("hidden_states", out);
      return r;
    };
    int64_t finals = 0;
    vstep.before_backward = [&](int, int64_t, bool final) { finals += final; };
    vstep.run_pair = step.run_pair;
    loss = pl::run_interleaved_1f1b(ex, chunks, kMicroBatches, vstep);
    EXPECT_EQ(finals, 1);
    if (paired) {  // every steady-state forward of the paired order ran with its backward
      int64_t want_pairs = 0;
      for (const auto& op : pl::interleaved_1f1b_order(ctx.pp_rank(), ctx.pp_size(), chunks, kMicroBatches, true))
        want_pairs += op.paired;
      EXPECT_EQ(pairs, want_pairs);  // PP 2: 3 and 5 on stages 0 and 1 (PP 4, m = pp: none)
      if (want_pairs > 0) EXPECT_GT(pair.total_switches(), 0);
    }
  } else {
    loss = one_f_one_b ? pl::run_1f1b(ex, kMicroBatches, step) : pl::run_without_pipelining(ex, kMicroBatches, step);
    EXPECT_EQ(next_backward, kMicroBatches);
    // One more warm-up forward than 1F1B, then pairs: m - min(pp - stage, m).
    if (paired)
      EXPECT_EQ(pairs, kMicroBatches - std::min<int64_t>(ctx.pp_size() - ctx.pp_rank(), kMicroBatches));
  }
  auto t = at::full({1}, loss, at::kDouble);
  ctx.pp().broadcast(t, ctx.pp_size() - 1);
  EXPECT_NEAR(t.item<double>(), want_loss, kRel * std::abs(want_loss));

  for (const auto& p : part.parameters()) {
    at::Tensor g = p.tensor.grad();
    ASSERT_TRUE(g.defined()) << p.name;
    // Tied embeddings: the first stage's and the last stage's copy are summed (the trainer does
    // this over the embedding group).
    if (!untied && p.name.starts_with("embedding") && ctx.pp_size() > 1) {
      g = g.clone();
      ctx.embedding().all_reduce(g, lf::backend::ReduceOp::sum);
    }
    const auto want = by_name[p.name]->tensor.grad();
    const double scale = std::max(1e-3, want.abs().max().item<double>());
    EXPECT_LE((g - want).abs().max().item<double>(), kRel * scale) << p.name;
  }
  // Clear for the next case (the reference is rebuilt).
  for (const auto& p : part.parameters()) p.tensor.mutable_grad() = at::Tensor();
}

LF_WORKER_CASE(pp_decoder) {
  auto ctx = make_pp_context(lf::testing::worker_world_size());
  for (bool untied : {false, true})
    for (bool f1b : {false, true}) check_pipeline(*ctx, untied, f1b);
  if (ctx->pp_size() == 2) {
    check_pipeline(*ctx, false, true, 1, {});  // layers 1 + 3
    check_pipeline(*ctx, true, true, {}, 1);   // layers 3 + 1
  } else {
    check_pipeline(*ctx, false, true, {}, 1);  // 1 + 1 + 1 + 1 via last only
  }
  if (ctx->pp_size() == 2) {
    // A layout string with empty model chunks: rank 0 holds the embedding and layer 3, rank 1
    // layers 0..2 and the head (checked with the virtual-stage schedule below via the layout).
    check_pipeline(*ctx, true, true, {}, {}, {}, std::string("E|t*3|t|L"));
  }
  // 1F1B with the forward of micro-batch i + warm-up paired with the backward of i (PP 4: the
  // first stage has no pairs, the last three: 1, 2, 3).
  check_pipeline(*ctx, false, true, {}, {}, {}, {}, true);
  check_pipeline(*ctx, true, true, {}, {}, {}, {}, true);
  // Interleaved, v = 2 (8 layers): PP 2 with 2 layers per virtual stage, PP 4 with 1; and paired.
  check_pipeline(*ctx, false, true, {}, {}, ctx->pp_size() == 2 ? 2 : 1);
  check_pipeline(*ctx, true, true, {}, {}, ctx->pp_size() == 2 ? 2 : 1);
  check_pipeline(*ctx, true, true, {}, {}, ctx->pp_size() == 2 ? 2 : 1, {}, true);
  // A stage is not a whole model.
  const auto c = tiny(false);
  Decoder part(c, lf::backend::cpu_backend(), 1, at::kFloat, ctx.get(), false,
               lf::models::pipeline_stage(c, ctx->pp_size(), ctx->pp_rank()));
  auto m = lf::testing::error_message([&] { part.loss(at::zeros({1, 4}, at::kLong), at::zeros({1, 4}, at::kLong)); });
  EXPECT_NE(m.find("needs the whole model"), std::string::npos) << m;
}

TEST(PipelineDecoder, Pp2EqualsSingleProcess) {
  lf::testing::expect_all_ok(lf::testing::run_workers("pp_decoder", {.world_size = 2}));
}
TEST(PipelineDecoder, Pp4EqualsSingleProcess) {
  lf::testing::expect_all_ok(lf::testing::run_workers("pp_decoder", {.world_size = 4}));
}

// The Chrome trace writes the model's spans on named rows (one thread_name per row, tids after
// the schedule's), and a span list cut at its limit says so.
// Paired micro-batches interleave a forward and a backward: their spans overlap, and the busy
// time is their union (F [0, 50) and B [25, 75) of a 100 us step: 25% idle, not 0%).
TEST(PipelineTrace, BubbleCountsOverlappingComputeOnce) {
  pl::ScheduleTrace trace;
  trace.steps.emplace_back(0.0, 100.0);
  trace.events.push_back({'B', 0, 25.0, 50.0});
  trace.events.push_back({'F', 1, 0.0, 50.0});
  trace.events.push_back({'F', 2, 30.0, 10.0});  // inside both
  EXPECT_NEAR(trace.bubble_fraction(), 0.25, 1e-12);
  trace.events.push_back({'B', 1, 90.0, 5.0});
  EXPECT_NEAR(trace.bubble_fraction(), 0.20, 1e-12);
}

TEST(PipelineTrace, SpansGoOnNamedRowsAndTheLimitIsReported) {
  pl::ScheduleTrace trace;
  trace.steps.emplace_back(0.0, 100.0);
  trace.events.push_back({'F', 0, 1.0, 10.0});
  trace.spans.add("L0 dispatch 0", "MoE all-to-all", 2.0, 5.0);
  trace.spans.add("L0 experts 0", "MoE experts", 5.0, 9.0);
  trace.spans.add("L0 combine 0", "MoE all-to-all", 9.0, 10.0);
  const std::string path = lf::testing::make_temp_dir("trace-spans") + "/t.json";
  trace.write_chrome_trace(path, 1);
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* s : {"\"tid\": 2, \"args\": {\"name\": \"MoE all-to-all\"}", "\"tid\": 3, \"args\": {\"name\": \"MoE experts\"}",
                        "\"name\": \"L0 combine 0\", \"cat\": \"MoE all-to-all\", \"ph\": \"X\", \"pid\": 1, \"tid\": 2, \"ts\": 9.0, \"dur\": 1.0"})
    EXPECT_NE(json.find(s), std::string::npos) << s << "\n" << json;
  EXPECT_EQ(json.find("spans_truncated_after"), std::string::npos);
  lf::TraceSpans many;
  for (size_t i = 0; i <= lf::TraceSpans::kLimit; ++i) many.add("s", "row", 0.0, 1.0);
  EXPECT_EQ(many.spans.size(), lf::TraceSpans::kLimit);
  EXPECT_TRUE(many.truncated);
  trace.spans = std::move(many);
  trace.write_chrome_trace(path, 1);
  std::ifstream again(path);
  const std::string cut((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>());
  EXPECT_NE(cut.find("\"spans_truncated_after\": 200000"), std::string::npos);
}

}  // namespace

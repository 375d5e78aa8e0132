// The pipeline bubble, measured: stages of fixed cost (a forward sleeps tf, its backward 2 tf)
// under 1F1B at PP = 4 with m = 8 micro-batches. Every stage's traced step spans
// (m + p - 1)(tf + tb) and computes m (tf + tb), so the idle share is (p - 1) / (m + p - 1) =
// 3 / 11 = 0.273. All-forwards-then-all-backwards (GPipe order, run_without_pipelining) has the
// same bubble with more activations in flight; interleaving v = 2 chunks cuts it to
// (p - 1) / (v m + p - 1). Also the Chrome trace file: one event per forward and backward.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "loongforge/dist/launch_env.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/dist/rendezvous.h"
#include "loongforge/parallel/pipeline/p2p.h"
#include "loongforge/parallel/pipeline/schedules.h"
#include "multiprocess.h"

namespace {
namespace pl = lf::parallel::pipeline;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Long enough that the fixed cost of a message and a wake-up (a few ms on a loaded 2-core VM)
// stays small against a slot: at 100 / 200 ms the interleaved bubble measured up to 12% over
// theory under load; at 200 / 400 ms 0.162 against 0.158 (1F1B 0.279 against 0.273).
constexpr int kForwardMs = 200, kBackwardMs = 400;

// Identity whose backward sleeps `ms`: the synthetic stage's backward.
struct SlowBackward : torch::autograd::Function<SlowBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t ms) {
    ctx->saved_data["ms"] = ms;
    return x.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ctx->saved_data["ms"].toInt()));
    return {g[0], at::Tensor()};
  }
};

// A stage, or one model chunk of an interleaved stage, of fixed cost.
pl::StageResult synthetic_forward(const pl::TensorMap& input, bool last, int scale = 1) {
  std::this_thread::sleep_for(std::chrono::milliseconds(kForwardMs * scale));
  at::Tensor x = input.contains("x") ? input.at("x") : at::ones({16}).set_requires_grad(true);
  at::Tensor y = SlowBackward::apply(x, kBackwardMs * scale);
  pl::StageResult r;
  if (last)
    r.loss = y.sum();
  else
    r.activations.set("x", y);
  return r;
}

pl::StageStep synthetic_stage(bool last) {
  pl::StageStep step;
  step.forward = [last](int64_t, const pl::TensorMap& input) { return synthetic_forward(input, last); };
  return step;
}

LF_WORKER_CASE(pp_bubble) {
  static lf::dist::Rendezvous rendezvous(lf::dist::detect_launch_env(), std::chrono::seconds(60));
  lf::dist::ParallelSizes sizes;
  sizes.pp = 4;
  lf::dist::ParallelContextOptions options;
  options.timeout = std::chrono::seconds(60);
  options.kinds = {lf::dist::GroupKind::world, lf::dist::GroupKind::pp};
  lf::dist::ParallelContext ctx(rendezvous, lf::dist::ParallelLayout(rendezvous.world_size(), sizes), options);
  pl::StageExchange ex(ctx.pp(), c10::Device(c10::kCPU));
  const auto step = synthetic_stage(ex.is_last());
  const int64_t m = 8, p = 4;

  pl::ScheduleTrace one_f_one_b, plain;
  // Warm-up at no cost: the first messages also open the connections.
  pl::StageStep free;
  free.forward = [&](int64_t, const pl::TensorMap& input) { return synthetic_forward(input, ex.is_last(), 0); };
  pl::run_1f1b(ex, m, free);
  pl::run_1f1b(ex, m, step, &one_f_one_b);
  pl::run_without_pipelining(ex, m, step, &plain);

  const double theory = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
  ASSERT_EQ(one_f_one_b.events.size(), static_cast<size_t>(2 * m));  // F and B per micro-batch
  // Within 10% of the theory (the bound): p2p messages and scheduling add a little idle
  // time; a schedule that serialised the stages would idle 0.75.
  EXPECT_NEAR(one_f_one_b.bubble_fraction(), theory, 0.1 * theory)
      << "stage " << ex.stage() << " measured " << one_f_one_b.bubble_fraction() << ", theory " << theory;
  EXPECT_NEAR(plain.bubble_fraction(), theory, 0.1 * theory) << "stage " << ex.stage();
  std::printf("stage %d: 1F1B bubble %.3f, all-forwards-first %.3f (theory %.3f)\n", ex.stage(),
              one_f_one_b.bubble_fraction(), plain.bubble_fraction(), theory);

  // Interleaved with v = 2: each stage holds two model chunks of equal cost; the activations go
  // round the ring twice. Bubble (p - 1) / (v m + p - 1) = 3 / 19 = 0.158, whatever the chunk
  // cost: 1F1B's cut by (v m + p - 1) / (m + p - 1) = 1.73 at m = 8 (-> v as m grows). A chunk
  // costs what a whole 1F1B stage does here (a stage of twice the layers), so the fixed latency
  // of the p2p messages weighs the same in both measurements.
  const int v = 2;
  pl::VirtualStageStep vstep;
  vstep.forward = [&](int chunk, int64_t, const pl::TensorMap& input) {
    return synthetic_forward(input, ex.is_last() && chunk == v - 1);
  };
  pl::ScheduleTrace interleaved;
  pl::run_interleaved_1f1b(ex, v, m, vstep, &interleaved);
  const double theory_v = static_cast<double>(p - 1) / static_cast<double>(v * m + p - 1);
  ASSERT_EQ(interleaved.events.size(), static_cast<size_t>(2 * v * m));
  // 15%: the interleaved step sends v times the messages of 1F1B, each with a fixed latency and a
  // wake-up that the theory leaves out; on the loaded 2-core VM that excess measured 0.162-0.176
  // against 0.158 (2.5-11%) over sessions, in a test that runs alone. A schedule that failed to
  // interleave would sit at 1F1B's 0.273 (+73%), and the ratio check below stays at 1.5.
  EXPECT_NEAR(interleaved.bubble_fraction(), theory_v, 0.15 * theory_v)
      << "stage " << ex.stage() << " measured " << interleaved.bubble_fraction() << ", theory " << theory_v;
  EXPECT_GT(one_f_one_b.bubble_fraction() / interleaved.bubble_fraction(), 1.5) << "stage " << ex.stage();
  std::printf("stage %d: interleaved (v 2) bubble %.3f (theory %.3f): 1F1B's / %.2f\n", ex.stage(),
              interleaved.bubble_fraction(), theory_v, one_f_one_b.bubble_fraction() / interleaved.bubble_fraction());

  const std::string path = lf::testing::make_temp_dir("trace") + "/trace.json";
  one_f_one_b.write_chrome_trace(path, ex.stage());
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(json.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(json.find("\"name\": \"F7\""), std::string::npos);
  EXPECT_NE(json.find("\"name\": \"B0\""), std::string::npos);
  EXPECT_NE(json.find("\"bubble_fraction\""), std::string::npos);
  const std::string vpath = lf::testing::make_temp_dir("trace") + "/interleaved.json";
  interleaved.write_chrome_trace(vpath, ex.stage());
  std::ifstream vin(vpath);
  const std::string vjson((std::istreambuf_iterator<char>(vin)), std::istreambuf_iterator<char>());
  EXPECT_NE(vjson.find("\"name\": \"F7.1\""), std::string::npos);  // micro-batch 7 of chunk 1
}

TEST(PipelineBubble, OneFOneBAndInterleavedMatchTheoryAtPp4) {
  const auto results = lf::testing::run_workers("pp_bubble", {.world_size = 4});
  lf::testing::expect_all_ok(results);
  for (const auto& r : results) {  // the measured numbers, for the log
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
      if (line.find("bubble") != std::string::npos) std::cout << line << "\n";
  }
}
}  // namespace

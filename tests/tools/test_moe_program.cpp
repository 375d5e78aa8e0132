// MoE training end to end with loongforge-train / loongforge-run (configs/demo_moe.yaml: tiny
// Qwen3-MoE, the first layer dense, 8 experts top-2; load-balancing loss, z-loss and the expert
// bias all on; --deterministic-mode):
//  - DP = 2 (with ZeRO-1 and overlapped reduction), PP = 2, TP = 2 with SP and full recomputation equal the
//    single process over the same micro-batches, and with the per-sequence balancing loss any
//    micro-batch split equals one batch: every step's loss (the auxiliary losses included) and
//    expert load, and the final parameters (expert biases included);
//  - exact resume: 20 iterations straight == 10 + resume + 10, bit for bit;
//  - aux-loss-free balancing: the expert bias keeps the load even on skewed real text;
//  - expert parallelism (both dispatchers, with TP, PP, ZeRO-1; experts whole or also split over TP)
//    equals the single process, and its checkpoints load at other EP sizes;
//  - the layouts not built for MoE yet are refused with the key to change.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <fstream>
#include <regex>

#include "multiprocess.h"
#include "program_testing.h"

namespace {
namespace fs = std::filesystem;
using lf::testing::bin;
using lf::testing::read_file;
using lf::testing::read_params;

using MoeRun = lf::testing::MetricsRun;

MoeRun train(int procs, const std::string& dir, std::vector<std::string> extra, int iters = 10) {
  std::vector<std::string> t = {"--config-file", lf::testing::source_dir() + "/configs/demo_moe.yaml", "--train-iters",
                                std::to_string(iters), "--global-batch-size", "8", "--seq-length", "32",
                                "--eval-iters", "0", "--lr", "3e-3", "--lr-warmup-iters", "2", "--moe-z-loss-coeff",
                                "1e-3", "--data-cache-path", fs::path(dir).parent_path().string() + "/cache",
                                "--deterministic-mode"};
  t.insert(t.end(), extra.begin(), extra.end());
  return lf::testing::run_training(
      procs, dir, t, "loss|lm loss|load balancing loss|z loss|mtp loss|expert_load_max_over_mean|grad_norm|iteration");
}

const auto& dumped = lf::testing::read_dumped_params;

// fp32 sums of the same numbers in another order (DP all-reduce, accumulation, pipeline
// stages) differ by ~1e-7 relative per step; 1e-5 relative over 10 Adam steps catches a lost
// micro-batch, a wrong auxiliary-loss weight or an expert bias updated from a local load. The
// routing itself is discrete: a wrong gradient flips choices and shows as far larger errors.
void expect_equivalent(const MoeRun& ref, const MoeRun& run, const std::string& what) {
  ASSERT_EQ(run.exit_code, 0) << what << "\n" << run.output;
  ASSERT_EQ(run.steps.size(), ref.steps.size()) << what;
  for (size_t i = 0; i < ref.steps.size(); ++i)
    for (const char* key : {"loss", "lm loss", "load balancing loss", "z loss", "expert_load_max_over_mean"}) {
      ASSERT_TRUE(ref.steps[i].count(key) && run.steps[i].count(key)) << what << " step " << i + 1 << " lacks " << key;
      const double want = ref.steps[i].at(key);
      EXPECT_NEAR(run.steps[i].at(key), want, 1e-5 * std::abs(want) + 1e-9) << what << " step " << i + 1 << " " << key;
    }
  for (size_t i = 0; i < ref.steps.size(); ++i)
    if (ref.steps[i].count("mtp loss")) {
      ASSERT_TRUE(run.steps[i].count("mtp loss")) << what << " step " << i + 1 << " lacks mtp loss";
      const double want = ref.steps[i].at("mtp loss");
      EXPECT_NEAR(run.steps[i].at("mtp loss"), want, 1e-5 * std::abs(want)) << what << " step " << i + 1;
    }
  const double diff = lf::testing::max_abs_diff(dumped(ref.params_path), dumped(run.params_path));
  EXPECT_LE(diff, 1e-5) << what << ": final parameters";
  std::printf("[moe equivalence] %s: final parameters max |diff| %.3g\n", what.c_str(), diff);
}

// The reference is one process over the same micro-batches (4 of 2 sequences): the batch-level
// load-balancing loss is, as in Megatron, computed per micro-batch (its tokens-per-expert times
// mean-probability product does not add up over micro-batches), so the layouts keep the
// micro-batch size. The per-sequence loss and the z-loss are means over sequences / tokens and do
// add up: with seq_aux_loss one micro-batch of 8 equals 4 of 2.
TEST(MoeTraining, ParallelLayoutsEqualSingleProcess) {
  const std::string d = lf::testing::make_temp_dir("moe_layouts");
  const MoeRun one = train(1, d + "/one", {"--micro-batch-size", "2"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(one.steps.size(), 10u);
  EXPECT_LT(one.steps.back().at("lm loss"), one.steps.front().at("lm loss"));  // it learns
  EXPECT_GT(one.steps.front().at("load balancing loss"), 0);
  EXPECT_NE(one.output.find("expert load max/mean"), std::string::npos) << one.output;
  // The expert biases moved (the state group is in the dump).
  auto p = read_params(one.params_path);
  ASSERT_TRUE(p.count("decoder.layers.1.mlp.router.expert_bias")) << "expert bias missing from the dump";
  double moved = 0;
  for (float v : p.at("decoder.layers.1.mlp.router.expert_bias")) moved += std::abs(v);
  EXPECT_GT(moved, 0);
  EXPECT_FALSE(p.count("decoder.layers.0.mlp.router.weight")) << "layer 0 is dense";

  expect_equivalent(one, train(2, d + "/dp2", {"--micro-batch-size", "2"}), "DP=2");
  expect_equivalent(one,
                    train(2, d + "/dp2z", {"--micro-batch-size", "2", "--use-distributed-optimizer",
                                           "--overlap-grad-reduce", "--ddp-bucket-size", "20000"}),
                    "DP=2 + ZeRO-1 + overlapped reduction");
  expect_equivalent(one, train(2, d + "/pp2", {"--micro-batch-size", "2", "--pipeline-model-parallel-size", "2"}),
                    "PP=2");
  expect_equivalent(one,
                    train(2, d + "/tp2sp", {"--micro-batch-size", "2", "--tensor-model-parallel-size", "2",
                                            "--sequence-parallel"}),
                    "TP=2 + SP (expert TP 2)");
  expect_equivalent(one,
                    train(1, d + "/recompute", {"--micro-batch-size", "2", "--recompute-granularity", "full",
                                                "--recompute-method", "uniform", "--recompute-num-layers", "1"}),
                    "full recomputation");
  const std::vector<std::string> seq{"--moe-router-load-balancing-type", "seq_aux_loss"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), seq.begin(), seq.end());
    return a;
  };
  const MoeRun seq_one = train(1, d + "/seq_one", with({"--micro-batch-size", "8"}));
  ASSERT_EQ(seq_one.exit_code, 0) << seq_one.output;
  expect_equivalent(seq_one, train(1, d + "/seq_accum", with({"--micro-batch-size", "2"})),
                    "seq_aux_loss: 4 micro-batches of 2");
  expect_equivalent(seq_one, train(2, d + "/seq_dp2", with({"--micro-batch-size", "2"})), "seq_aux_loss: DP=2");
}

TEST(MoeTraining, ExactResumeKeepsTheExpertBias) {
  const std::string d = lf::testing::make_temp_dir("moe_resume");
  const MoeRun straight = train(1, d + "/straight", {"--micro-batch-size", "4"}, 20);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const MoeRun first = train(1, d + "/resumed", {"--micro-batch-size", "4", "--save", d + "/ck", "--exit-interval", "10"}, 20);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const MoeRun second = train(1, d + "/resumed", {"--micro-batch-size", "4", "--load", d + "/ck"}, 20);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_EQ(straight.lines.size(), 20u);
  ASSERT_EQ(second.lines.size(), 20u);  // the metrics file continues
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(second.lines[i], straight.lines[i]) << "line " << i;
  EXPECT_TRUE(read_file(straight.params_path) == read_file(second.params_path)) << "final parameters differ";
}

// Expert parallelism (each EP rank holds num_experts / ep experts whole, expert TP 1), with both
// token dispatchers, equals the single process over the same micro-batches: EP = 2 over DP = 2
// (also with ZeRO-1 over both the dense and the expert-DP group and overlapped reduction), EP = 2 x
// TP = 2 with SP (world 4: the EP groups are the TP groups, each TP rank routes its own sequence
// chunk), EP = 4 spanning TP = 2 x DP = 2, EP = 2 x PP = 2, and the all-to-all overlapped with the
// experts' computation (CCT: token chunks in a pipeline, forward and backward; with 3 chunks also
// the weight gradients delayed behind the input gradients' all-to-alls, --delay-wgrad-compute).
// Same tolerance as the layouts above (the experts' GEMMs see the rows of several ranks at once:
// other summation order only).
TEST(MoeTraining, ExpertParallelEqualsSingleProcess) {
  const std::string d = lf::testing::make_temp_dir("moe_ep");
  const MoeRun one = train(1, d + "/one", {"--micro-batch-size", "2"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto ep = [](std::vector<std::string> a) {
    a.insert(a.begin(), {"--micro-batch-size", "2"});
    return a;
  };
  const MoeRun a2a = train(2, d + "/ep2_a2a", ep({"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}));
  EXPECT_NE(a2a.output.find("gradients: 2 group(s)"), std::string::npos) << a2a.output;  // dense + experts
  expect_equivalent(one, a2a, "EP=2 all-to-all");
  expect_equivalent(one, train(2, d + "/ep2_ag", ep({"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"})),
                    "EP=2 all-gather");
  expect_equivalent(one,
                    train(2, d + "/ep2_zero", ep({"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                                                  "--use-distributed-optimizer", "--overlap-grad-reduce",
                                                  "--ddp-bucket-size", "20000"})),
                    "EP=2 + ZeRO-1 + overlapped reduction");
  const std::vector<std::string> tp2{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                     "--expert-tensor-parallel-size", "1"};
  auto with_tp = [&](std::vector<std::string> a) {
    a.insert(a.end(), tp2.begin(), tp2.end());
    return ep(a);
  };
  expect_equivalent(one, train(4, d + "/ep2tp2", with_tp({"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"})),
                    "EP=2 x TP=2 + SP (expert TP 1), all-to-all");
  expect_equivalent(one, train(4, d + "/ep4tp2", with_tp({"--expert-model-parallel-size", "4"})),
                    "EP=4 over TP=2 x DP=2 (expert TP 1), all-gather");
  expect_equivalent(one,
                    train(2, d + "/ep2_cct", ep({"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                                                 "--overlap-moe-expert-parallel-comm", "--moe-overlap-num-chunks", "2"})),
                    "EP=2 all-to-all overlapped with the experts (CCT, 2 chunks)");
  expect_equivalent(one,
                    train(4, d + "/ep4_cct", with_tp({"--expert-model-parallel-size", "4", "--moe-token-dispatcher-type",
                                                      "alltoall", "--overlap-moe-expert-parallel-comm",
                                                      "--moe-overlap-num-chunks", "3", "--recompute-granularity",
                                                      "selective", "--delay-wgrad-compute"})),
                    "EP=4 over TP=2 x DP=2, overlapped in 3 chunks, delayed weight gradients, selective recomputation");
  expect_equivalent(one,
                    train(4, d + "/ep2pp2", ep({"--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                                "--moe-token-dispatcher-type", "alltoall"})),
                    "EP=2 x PP=2");
}

// Expert TP = TP (Megatron's default when --expert-tensor-parallel-size is not given) under expert
// parallelism: on TP 2 x DP 2 with EP 2 every expert is split over TP like the dense MLP and the
// experts over EP (rank tp + 2 ep holds its two experts' TP shards), the tokens are gathered over
// TP and dispatched among the ranks of the same TP rank. Both dispatchers, with and without SP,
// ZeRO-1, the overlap (chunks and micro-batch pairs), PP 2 (8 ranks) equal the single process; a
// checkpoint saved so (a two-level split per expert weight)
// trains on at one process and at EP 2 with expert TP 1.
TEST(MoeTraining, ExpertsSplitOverTpAndEpEqualSingleProcess) {
  const std::string d = lf::testing::make_temp_dir("moe_ep_etp");
  const MoeRun one = train(1, d + "/one", {"--micro-batch-size", "2"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto etp = [](std::vector<std::string> a) {
    a.insert(a.begin(), {"--micro-batch-size", "2", "--tensor-model-parallel-size", "2", "--expert-model-parallel-size",
                         "2"});
    return a;
  };
  const MoeRun dry = train(4, d + "/dry", etp({"--sequence-parallel", "--dry-run"}));
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("experts: ep 2 x expert-dp 1 (expert TP 2)"), std::string::npos) << dry.output;
  EXPECT_NE(dry.output.find("routed experts 55296, / ep 2 x tp 2"), std::string::npos) << dry.output;
  expect_equivalent(one,
                    train(4, d + "/a2a", etp({"--sequence-parallel", "--moe-token-dispatcher-type", "alltoall"})),
                    "EP=2 x TP=2 + SP (expert TP 2), all-to-all");
  expect_equivalent(one,
                    train(4, d + "/ag", etp({"--moe-token-dispatcher-type", "allgather", "--use-distributed-optimizer",
                                             "--overlap-grad-reduce", "--ddp-bucket-size", "20000"})),
                    "EP=2 x TP=2 without SP (expert TP 2), all-gather, ZeRO-1 + overlapped reduction");
  expect_equivalent(one,
                    train(4, d + "/cct", etp({"--sequence-parallel", "--moe-token-dispatcher-type", "alltoall",
                                              "--overlap-moe-expert-parallel-comm", "--moe-overlap-num-chunks", "2",
                                              "--delay-wgrad-compute"})),
                    "EP=2 x TP=2 + SP (expert TP 2), overlapped: 2 chunks, micro-batch pairs, delayed weight gradients");
  expect_equivalent(one,
                    train(8, d + "/pp2", etp({"--sequence-parallel", "--moe-token-dispatcher-type", "alltoall",
                                              "--pipeline-model-parallel-size", "2"})),
                    "EP=2 x TP=2 + SP (expert TP 2) x PP=2, all-to-all");
  // Saved at iteration 5 with ZeRO-1, trained on elsewhere: the last 5 steps equal the single process's.
  const MoeRun first = train(4, d + "/first", etp({"--sequence-parallel", "--moe-token-dispatcher-type", "alltoall",
                                                  "--use-distributed-optimizer", "--save", d + "/ck",
                                                  "--exit-interval", "5"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  for (const char* f : {"model_experts_tp3_pp0.safetensors", "optim_experts_tp3_pp0_dp0.safetensors"})
    EXPECT_TRUE(fs::exists(d + "/ck/iter_0000005/" + f)) << f;
  MoeRun tail = one;
  tail.steps.erase(tail.steps.begin(), tail.steps.begin() + 5);
  expect_equivalent(tail, train(1, d + "/at1", {"--micro-batch-size", "2", "--load", d + "/ck", "--use-distributed-optimizer"}),
                    "EP=2 x TP=2 (expert TP 2) checkpoint trained on at one process");
  expect_equivalent(tail,
                    train(2, d + "/at_ep2", {"--micro-batch-size", "2", "--load", d + "/ck", "--expert-model-parallel-size",
                                             "2", "--moe-token-dispatcher-type", "alltoall", "--use-distributed-optimizer"}),
                    "EP=2 x TP=2 (expert TP 2) checkpoint trained on at EP=2 (expert TP 1)");
}

// The overlap across micro-batches (--overlap-moe-expert-parallel-comm at pp 1, on by default with
// 2 or more micro-batches a step): the forward of micro-batch m + 1 and the backward of m take
// turns at each all-to-all wait. Both orders of work are fixed by the program, every backward
// accumulates in micro-batch order and the output layer's gradient (written in its forward)
// too, so with untied embeddings the run equals the unpaired one (--no-moe-overlap-micro-batches)
// bit for bit, and the single process within the tolerance above. The log's hand-over count shows
// the streams switched at the all-to-all waits (none: the overlap did not happen). Where pairs
// run, the token chunks default to 1 (the same run as --moe-overlap-num-chunks 1).
TEST(MoeTraining, OverlapAcrossMicroBatchesEqualsOneMicroBatchAtATime) {
  const std::string d = lf::testing::make_temp_dir("moe_pairs");
  const std::vector<std::string> base{"--micro-batch-size", "1", "--untie-embeddings-and-output-weights"};
  auto with = [&](std::vector<std::string> a, std::vector<std::string> more = {}) {
    a.insert(a.begin(), base.begin(), base.end());
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const MoeRun one = train(1, d + "/one", with({}), 6);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<std::string> cct{"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                                     "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"};
  const std::vector<std::string> two{"--moe-overlap-num-chunks", "2"};
  const MoeRun paired = train(2, d + "/paired", with(cct, two), 6);
  const MoeRun unpaired = train(2, d + "/unpaired", with(cct, {"--moe-overlap-num-chunks", "2", "--no-moe-overlap-micro-batches"}), 6);
  expect_equivalent(one, paired, "EP=2, CCT in 2 chunks, paired over micro-batches");
  ASSERT_EQ(unpaired.exit_code, 0) << unpaired.output;
  // 8 sequences over DP 2 at micro-batch 1: 4 micro-batches a step, 3 pairs.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(paired.output, m, std::regex(R"(across micro-batches.*\((\d+) pairs, (\d+) hand-overs)")))
      << paired.output;
  EXPECT_EQ(std::stoi(m[1]), 3);
  EXPECT_GT(std::stoi(m[2]), 0);
  EXPECT_EQ(unpaired.output.find("across micro-batches"), std::string::npos) << unpaired.output;
  auto expect_same = [](const MoeRun& a, const MoeRun& b, const std::string& what) {
    ASSERT_EQ(a.steps.size(), b.steps.size()) << what;
    for (size_t i = 0; i < a.steps.size(); ++i)
      for (const char* key : {"loss", "load balancing loss", "z loss", "expert_load_max_over_mean", "grad_norm"})
        EXPECT_EQ(a.steps[i].at(key), b.steps[i].at(key)) << what << " step " << i + 1 << " " << key;
    EXPECT_EQ(lf::testing::max_abs_diff(dumped(a.params_path), dumped(b.params_path)), 0.0) << what;
  };
  expect_same(paired, unpaired, "paired against unpaired, 2 chunks");
  {  // --dry-run counts the pair's second micro-batch of activations
    const MoeRun dry = train(2, d + "/dry", with(cct, {"--dry-run"}), 6);
    ASSERT_EQ(dry.exit_code, 0) << dry.output;
    EXPECT_NE(dry.output.find("2 micro-batches in flight"), std::string::npos) << dry.output;
    const MoeRun dry_unpaired = train(2, d + "/dry_unpaired", with(cct, {"--dry-run", "--no-moe-overlap-micro-batches"}), 6);
    EXPECT_NE(dry_unpaired.output.find("1 micro-batch in flight"), std::string::npos) << dry_unpaired.output;
  }
  // Where pairs run the chunks default to 1: the all-to-all overlaps only with the other micro-batch.
  const MoeRun by_default = train(2, d + "/default", with(cct), 6);
  expect_equivalent(one, by_default, "EP=2, CCT paired over micro-batches, chunks by default");
  EXPECT_NE(by_default.output.find("across micro-batches"), std::string::npos) << by_default.output;
  const MoeRun one_chunk = train(2, d + "/one_chunk", with(cct, {"--moe-overlap-num-chunks", "1"}), 6);
  ASSERT_EQ(one_chunk.exit_code, 0) << one_chunk.output;
  expect_same(by_default, one_chunk, "chunks by default against 1 chunk");
  // Full recomputation with dropout: the backward's stream replays the dropout generator while it
  // recomputes a layer group (MoE layers inside, so all-to-all waits inside); it holds its turn
  // until the generator is set back, so both streams draw exactly what they draw unpaired.
  const std::vector<std::string> drop{"--hidden-dropout", "0.1", "--recompute-granularity", "full",
                                      "--recompute-method", "uniform", "--recompute-num-layers", "2"};
  auto dropout_cct = cct;
  dropout_cct.insert(dropout_cct.end(), drop.begin(), drop.end());
  const MoeRun drop_paired = train(2, d + "/drop_paired", with(dropout_cct, two), 6);
  const MoeRun drop_unpaired =
      train(2, d + "/drop_unpaired", with(dropout_cct, {"--moe-overlap-num-chunks", "2", "--no-moe-overlap-micro-batches"}), 6);
  ASSERT_EQ(drop_paired.exit_code, 0) << drop_paired.output;
  ASSERT_EQ(drop_unpaired.exit_code, 0) << drop_unpaired.output;
  EXPECT_NE(drop_paired.output.find("across micro-batches"), std::string::npos) << drop_paired.output;
  expect_same(drop_paired, drop_unpaired, "paired against unpaired, dropout and full recomputation");
  // Under 1F1B (EP 2 x PP 2, 4 micro-batches): one more warm-up forward, then the forward of
  // micro-batch i + warm-up paired with the backward of i on each stage.
  const std::vector<std::string> pp2{"--pipeline-model-parallel-size", "2"};
  auto pp_cct = cct;
  pp_cct.insert(pp_cct.end(), pp2.begin(), pp2.end());
  const MoeRun pp_paired = train(4, d + "/pp_paired", with(pp_cct), 6);
  expect_equivalent(one, pp_paired, "EP=2 x PP=2, CCT paired over micro-batches under 1F1B");
  ASSERT_TRUE(std::regex_search(pp_paired.output, m, std::regex(R"(across micro-batches.*\((\d+) pairs, (\d+) hand-overs)")))
      << pp_paired.output;
  EXPECT_EQ(std::stoi(m[1]), 2);  // rank 0 (stage 0): 4 micro-batches - 2 warm-up forwards
  EXPECT_GT(std::stoi(m[2]), 0);
  const MoeRun pp_two = train(4, d + "/pp_two", with(pp_cct, two), 6);
  const MoeRun pp_two_unpaired = train(4, d + "/pp_two_unpaired", with(pp_cct, {"--moe-overlap-num-chunks", "2",
                                                                                "--no-moe-overlap-micro-batches"}), 6);
  ASSERT_EQ(pp_two.exit_code, 0) << pp_two.output;
  ASSERT_EQ(pp_two_unpaired.exit_code, 0) << pp_two_unpaired.output;
  expect_same(pp_two, pp_two_unpaired, "EP=2 x PP=2, 2 chunks, paired against unpaired");
  // Under the interleaved schedule (2 model chunks of 1 layer per stage): one more warm-up forward
  // than Megatron's order, then each steady-state forward paired with the backward after it.
  auto vpp_cct = pp_cct;
  vpp_cct.insert(vpp_cct.end(), {"--num-layers-per-virtual-pipeline-stage", "1"});
  const MoeRun vpp_paired = train(4, d + "/vpp_paired", with(vpp_cct), 6);
  expect_equivalent(one, vpp_paired, "EP=2 x PP=2 interleaved (2 chunks a stage), paired over micro-batches");
  ASSERT_TRUE(std::regex_search(vpp_paired.output, m, std::regex(R"(across micro-batches.*\((\d+) pairs, (\d+) hand-overs)")))
      << vpp_paired.output;
  EXPECT_EQ(std::stoi(m[1]), 3);  // rank 0: 8 chunk-micro-batches - (2 (pp - 1) + (v - 1) pp + 1) warm-up forwards
  EXPECT_GT(std::stoi(m[2]), 0);
  const MoeRun vpp_unpaired = train(4, d + "/vpp_unpaired", with(vpp_cct, {"--no-moe-overlap-micro-batches"}), 6);
  ASSERT_EQ(vpp_unpaired.exit_code, 0) << vpp_unpaired.output;
  EXPECT_EQ(vpp_unpaired.output.find("across micro-batches"), std::string::npos) << vpp_unpaired.output;
  // The unpaired run's chunks default to 2: compare with the paired run at 2 chunks.
  const MoeRun vpp_two = train(4, d + "/vpp_two", with(vpp_cct, two), 6);
  ASSERT_EQ(vpp_two.exit_code, 0) << vpp_two.output;
  expect_same(vpp_two, vpp_unpaired, "EP=2 x PP=2 interleaved, 2 chunks, paired against unpaired");
}

// --pipeline-trace shows the overlapped all-to-all (CCT): each stage's trace gains the rows "MoE
// all-to-all" and "MoE experts". In a forward, chunk 1's dispatch is in flight (launched before,
// seen complete after) while chunk 0's experts compute; with --delay-wgrad-compute every expert
// weight-gradient span runs while the last chunk's input gradient is on its way back.
TEST(MoeTraining, PipelineTraceShowsTheOverlappedAllToAll) {
  const std::string d = lf::testing::make_temp_dir("moe_trace");
  auto r = train(4, d + "/run", {"--micro-batch-size", "2", "--expert-model-parallel-size", "2",
                                 "--pipeline-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                                 "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--pipeline-trace",
                                 d + "/trace"},
                 3);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // demo_moe: layer 0 dense, layers 1-3 MoE; stage 1 holds MoE layers, its first local one is L0.
  std::ifstream in(d + "/trace.stage1.json");
  ASSERT_TRUE(in.good());
  const auto trace = nlohmann::json::parse(in);
  std::map<std::string, std::pair<double, double>> first;  // span name -> [start, end) of its first occurrence
  std::map<int, std::string> rows;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name") rows[e.at("tid").get<int>()] = e.at("args").at("name");
    if (e.at("ph") != "X" || !e.contains("cat")) continue;
    const double ts = e.at("ts").get<double>();
    first.emplace(e.at("name").get<std::string>(), std::pair{ts, ts + e.at("dur").get<double>()});
  }
  std::vector<std::string> row_names;
  for (const auto& [tid, name] : rows) row_names.push_back(name);
  EXPECT_EQ(row_names, (std::vector<std::string>{"MoE all-to-all", "MoE experts"}));
  auto within = [&](const std::string& outer, const std::string& inner) {
    ASSERT_TRUE(first.count(outer) && first.count(inner)) << outer << " / " << inner;
    EXPECT_LE(first[outer].first, first[inner].first) << outer << " starts after " << inner;
    EXPECT_GE(first[outer].second, first[inner].second) << outer << " ends before " << inner;
  };
  within("L0 dispatch 1", "L0 experts 0");
  within("L0 dispatch grad 1", "L0 experts wgrad 0");
  within("L0 dispatch grad 1", "L0 experts wgrad 1");
  EXPECT_LE(first["L0 experts dgrad 1"].second, first["L0 experts wgrad 0"].first);
}

// Context parallelism: each rank routes its tokens of the sequences; the load-balancing losses'
// token counts (per micro-batch and per sequence) and the expert load are summed over the CP
// ranks (with TP + SP: over TP x CP) so every rank's term is its tokens' part of the whole
// sequences' loss; expert parallelism spans dp x cp as in Megatron.
TEST(MoeTraining, ContextParallelEqualsSingleProcess) {
  const std::string d = lf::testing::make_temp_dir("moe_cp");
  auto mb = [](std::vector<std::string> a) {
    a.insert(a.begin(), {"--micro-batch-size", "2"});
    return a;
  };
  const std::vector<std::string> cp2{"--context-parallel-size", "2"};
  auto with = [&](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return mb(a);
  };
  const MoeRun one = train(1, d + "/one", mb({}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const MoeRun ring = train(2, d + "/cp2", with(cp2, {}));
  EXPECT_NE(ring.output.find(", cp 2 (p2p)"), std::string::npos) << ring.output;
  expect_equivalent(one, ring, "CP=2 (ring attention)");
  expect_equivalent(one, train(2, d + "/cp2_ep2", with(cp2, {"--expert-model-parallel-size", "2",
                                                             "--moe-token-dispatcher-type", "alltoall"})),
                    "CP=2 x EP=2 (EP over the CP ranks), all-to-all");
  expect_equivalent(one,
                    train(4, d + "/cp2_tp2_ep2",
                          with(cp2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                     "--expert-tensor-parallel-size", "1", "--expert-model-parallel-size", "2",
                                     "--moe-token-dispatcher-type", "alltoall", "--cp-comm-type", "a2a"})),
                    "CP=2 (Ulysses) x TP=2 + SP x EP=2 (expert TP 1)");
  const std::vector<std::string> seq{"model.foundation.moe_router_load_balancing_type=seq_aux_loss"};
  const MoeRun one_seq = train(1, d + "/one_seq", mb(seq));
  ASSERT_EQ(one_seq.exit_code, 0) << one_seq.output;
  expect_equivalent(one_seq, train(2, d + "/cp2_seq", with(cp2, seq)), "CP=2, per-sequence load-balancing loss");
  // A capacity limit would count a rank's part of each sequence: refused.
  auto capped = train(2, d + "/capped", with(cp2, {"--moe-expert-capacity-factor", "1.5", "--dry-run"}), 4);
  EXPECT_NE(capped.exit_code, 0);
  EXPECT_NE(capped.output.find("model.foundation.moe_expert_capacity_factor"), std::string::npos) << capped.output;
}

// --save-hf under expert parallelism gathers every rank's experts: the HF directory written at
// EP = 2, and at EP = 2 x TP = 2 with the experts also split over TP, holds the same tensors as the
// one written by one process (the expert bias off: Qwen3-MoE's HF form has none).
TEST(MoeTraining, SaveHfGathersTheExpertsOverEp) {
  const std::string d = lf::testing::make_temp_dir("moe_ep_hf");
  const std::vector<std::string> base{"--micro-batch-size", "2", "model.foundation.moe_router_enable_expert_bias=false",
                                      "model.foundation.moe_router_bias_update_rate=1e-3"};
  auto args = [&](const std::string& out, std::vector<std::string> a) {
    a.insert(a.begin(), base.begin(), base.end());
    a.insert(a.end(), {"--save-hf", out});
    return a;
  };
  const MoeRun one = train(1, d + "/one", args(d + "/hf1", {}), 3);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  {  // with the expert bias on, no HF family expresses the model: refused before the first step
    const MoeRun bias = train(1, d + "/bias", {"--save-hf", d + "/hf_bias"}, 3);
    EXPECT_NE(bias.exit_code, 0);
    EXPECT_NE(bias.output.find("--save-hf " + d + "/hf_bias"), std::string::npos) << bias.output;
    EXPECT_NE(bias.output.find("moe_router_enable_expert_bias"), std::string::npos) << bias.output;
    EXPECT_EQ(bias.output.find("iteration 1/"), std::string::npos) << bias.output;
  }
  const MoeRun ep = train(2, d + "/ep2", args(d + "/hf2", {"--expert-model-parallel-size", "2",
                                                           "--moe-token-dispatcher-type", "alltoall"}), 3);
  ASSERT_EQ(ep.exit_code, 0) << ep.output;
  const auto a = read_params(d + "/hf1/model.safetensors"), b = read_params(d + "/hf2/model.safetensors");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(a.count("model.layers.1.mlp.experts.7.down_proj.weight"));
  EXPECT_LE(lf::testing::max_abs_diff(a, b), 1e-5);
  // Experts split over tp x ep (expert TP = TP 2, EP 2): gathered in both levels.
  const MoeRun etp = train(4, d + "/etp", args(d + "/hf4", {"--expert-model-parallel-size", "2",
                                                            "--tensor-model-parallel-size", "2", "--sequence-parallel",
                                                            "--moe-token-dispatcher-type", "alltoall"}), 3);
  ASSERT_EQ(etp.exit_code, 0) << etp.output;
  const auto c = read_params(d + "/hf4/model.safetensors");
  ASSERT_EQ(a.size(), c.size());
  EXPECT_LE(lf::testing::max_abs_diff(a, c), 1e-5) << "EP=2 x TP=2, expert TP 2";
}

// A checkpoint saved at EP = 2 holds the experts by expert-parallel rank
// (model_experts_tp<r>_pp0) and loads at EP = 1 and EP = 4, and `loongforge-convert reshard`
// rewrites it for TP = 2: training on from it equals training on at EP = 2 (optimizer state
// included: ZeRO-1 shards of both groups re-cut).
TEST(MoeTraining, ExpertParallelCheckpointsLoadAtOtherEpSizes) {
  const std::string d = lf::testing::make_temp_dir("moe_ep_reshard");
  const std::vector<std::string> base{"--micro-batch-size", "2", "--use-distributed-optimizer"};
  auto args = [&](std::vector<std::string> a) {
    a.insert(a.begin(), base.begin(), base.end());
    return a;
  };
  const MoeRun straight = train(2, d + "/straight", args({"--expert-model-parallel-size", "2"}));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const MoeRun first = train(2, d + "/first", args({"--expert-model-parallel-size", "2", "--save", d + "/ck",
                                                    "--exit-interval", "5"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string iter = d + "/ck/iter_0000005";
  for (const char* f : {"model_experts_tp0_pp0.safetensors", "model_experts_tp1_pp0.safetensors",
                        "optim_experts_tp0_pp0_dp0.safetensors", "model_tp0_pp0.safetensors"})
    EXPECT_TRUE(fs::exists(iter + "/" + f)) << f;
  auto tail = [](const MoeRun& r) {
    MoeRun t = r;
    t.steps.erase(t.steps.begin(), t.steps.begin() + std::min<size_t>(5, t.steps.size()));
    return t;
  };
  const MoeRun ref = tail(straight);
  for (auto [procs, ep] : {std::pair{1, 1}, std::pair{4, 4}}) {
    std::vector<std::string> a = args({"--load", d + "/ck"});
    if (ep > 1) a.insert(a.end(), {"--expert-model-parallel-size", std::to_string(ep)});
    MoeRun r = train(procs, d + "/ep" + std::to_string(ep), a);
    expect_equivalent(ref, r, "EP=2 checkpoint trained on at EP=" + std::to_string(ep));
  }
  // Offline: resharded for TP = 2 (experts split over TP, the expert biases without optimizer
  // state), then trained on at TP = 2 + SP.
  auto rs = lf::testing::run_command({bin("loongforge-convert"), "reshard", "--load", d + "/ck", "--save", d + "/ck_tp2",
                                      "--tp", "2", "--pp", "1", "--dp", "1"});
  ASSERT_TRUE(rs.ok()) << rs.output;
  expect_equivalent(ref,
                    train(2, d + "/tp2", args({"--load", d + "/ck_tp2", "--tensor-model-parallel-size", "2",
                                               "--sequence-parallel"})),
                    "EP=2 checkpoint resharded offline to TP=2, trained on at TP=2 + SP");
}

// Multi-token prediction (2 MTP layers on the tiny MoE): the "mtp loss" term starts at the
// factor 0.1 times an untrained model's cross entropy (over the positions that have a target), training with the output layer's gradient
// written straight into the gradient buffer (gradient-accumulation fusion, as the MTP term) equals
// plain autograd, and DP = 2, TP = 2 + SP, EP = 2 and PP = 2 (tied and untied) equal one process
// (the MTP layers' MoE, their column-parallel eh_proj, their share of the auxiliary losses, the last
// stage's copy of the embedding included), and so do full and selective recomputation.
TEST(MoeTraining, MultiTokenPredictionEqualsAcrossLayouts) {
  const std::string d = lf::testing::make_temp_dir("moe_mtp");
  const std::vector<std::string> mtp{"--micro-batch-size", "2", "--mtp-num-layers", "2"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.begin(), mtp.begin(), mtp.end());
    return a;
  };
  const MoeRun one = train(1, d + "/one", with({}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_TRUE(one.steps.front().count("mtp loss")) << one.output;
  // Untrained, every head's cross entropy is about the main one's; MTP layer k has no target for
  // the last k + 1 of the 32 positions and its sum is divided by the main loss's tokens
  // (Megatron's per-token loss): 0.1 x lm loss x (31 + 30) / 64.
  EXPECT_NEAR(one.steps.front().at("mtp loss"), 0.1 * one.steps.front().at("lm loss") * 61.0 / 64.0, 0.01);
  EXPECT_LT(one.steps.back().at("mtp loss"), one.steps.front().at("mtp loss"));  // it learns
  auto p = read_params(one.params_path);
  for (const char* name : {"mtp.layers.1.eh_proj.weight", "mtp.layers.0.transformer_layer.mlp.router.weight",
                           "mtp.layers.1.final_layernorm.weight"})
    EXPECT_TRUE(p.count(name)) << name;
  expect_equivalent(one, train(1, d + "/unfused", with({"--no-gradient-accumulation-fusion"})),
                    "MTP without gradient-accumulation fusion");
  // Recomputation reruns the MTP layer in backward: it must be the model's layer, not a copy
  // gone by then (a copy crashed with SIGFPE, or read freed memory).
  expect_equivalent(one,
                    train(1, d + "/full", with({"--recompute-granularity", "full", "--recompute-method", "uniform",
                                                "--recompute-num-layers", "1"})),
                    "MTP, full recomputation");
  expect_equivalent(one, train(1, d + "/selective", with({"--recompute-granularity", "selective"})),
                    "MTP, selective recomputation");
  expect_equivalent(one, train(2, d + "/dp2", with({})), "MTP, DP=2");
  expect_equivalent(one, train(2, d + "/tp2", with({"--tensor-model-parallel-size", "2", "--sequence-parallel"})),
                    "MTP, TP=2 + SP");
  expect_equivalent(one, train(2, d + "/ep2", with({"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type",
                                                     "alltoall"})),
                    "MTP, EP=2");
  // PP = 2: the MTP layers on the last stage embed with the output layer's tied copy of the
  // embedding, or (untied) with a copy of their own; either copy's gradient joins the first stage's.
  expect_equivalent(one, train(2, d + "/pp2", with({"--pipeline-model-parallel-size", "2"})), "MTP, PP=2 (tied)");
  // The embedding's gradient is then a sum of three uses added in another order on each side; rows
  // of rare tokens get gradients near Adam's eps, where the update magnifies 1-ulp differences
  // (8.7e-6 with eps 1e-8): eps 1e-6 on both sides keeps the comparison about the sum (1.4e-6).
  const MoeRun untied = train(1, d + "/untied", with({"--untie-embeddings-and-output-weights", "--adam-eps", "1e-6"}));
  ASSERT_EQ(untied.exit_code, 0) << untied.output;
  expect_equivalent(untied,
                    train(2, d + "/pp2_untied", with({"--pipeline-model-parallel-size", "2",
                                                      "--untie-embeddings-and-output-weights", "--adam-eps", "1e-6"})),
                    "MTP, PP=2 (untied: the MTP layers' own copy of the embedding)");
}

// Aux-loss-free balancing (DeepSeek-V3's expert bias) on real text, the arithmetic demo corpus
// (byte tokens: a few digits and symbols dominate, so routing collapses when nothing balances
// it): 300 steps of the demo MoE, the expert load max / mean over the last 50 steps. Measured:
// 3.55 without any balancing, 1.12 with the bias at rate 1e-2 (docs/models.md).
TEST(MoeTraining, ExpertBiasBalancesTheLoad) {
  const std::string d = lf::testing::make_temp_dir("moe_balance");
  auto r = lf::testing::run_command({bin("loongforge-data"), "make-demo-corpus", "--out", d + "/data", "--seed", "1"});
  ASSERT_TRUE(r.ok()) << r.output;
  r = lf::testing::run_command({bin("loongforge-data"), "preprocess", "--input", d + "/data/train.jsonl", "--json-keys",
                                "text", "--tokenizer-type", "ByteTokenizer", "--append-eod", "--workers", "1",
                                "--output-prefix", d + "/data/train"});
  ASSERT_TRUE(r.ok()) << r.output;
  auto load = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> a = {bin("loongforge-train"), "--config-file",
                                  lf::testing::source_dir() + "/configs/demo_moe.yaml", "--train-iters", "300",
                                  "--lr", "3e-3", "--eval-iters", "0", "--vocab-size", "257", "--tokenizer-type",
                                  "ByteTokenizer", "--data-path", d + "/data/train_text_document",
                                  "++data.mock_data=false", "--moe-router-load-balancing-type", "none",
                                  "--moe-aux-loss-coeff", "0", "--data-cache-path", d + "/cache",
                                  "--metrics-file", d + "/" + name + ".jsonl"};
    a.insert(a.end(), extra.begin(), extra.end());
    auto run = lf::testing::run_command(a, {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
    EXPECT_EQ(run.exit_code, 0) << run.output;
    std::ifstream in(d + "/" + name + ".jsonl");
    std::vector<double> v;
    std::regex re("\"expert_load_max_over_mean\": ([-0-9.eE+]+)");
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (std::regex_search(line, m, re)) v.push_back(std::stod(m[1]));
    }
    EXPECT_EQ(v.size(), 300u) << name;
    double sum = 0;
    for (size_t i = v.size() >= 50 ? v.size() - 50 : 0; i < v.size(); ++i) sum += v[i];
    return sum / 50;
  };
  const double with_bias = load("bias", {"--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "1e-2"});
  const double without = load("none", {"model.foundation.moe_router_enable_expert_bias=false",
                                       "model.foundation.moe_router_bias_update_rate=1e-3"});
  std::printf("[moe balance] expert load max/mean, last 50 of 300 steps: %.3f with the expert bias, %.3f without\n",
              with_bias, without);
  EXPECT_LT(with_bias, 1.2);
  EXPECT_GT(without, 1.5 * with_bias);  // the corpus does unbalance routing: the bias is what fixes it
}

TEST(MoeTraining, LayoutsNotBuiltForMoeAreRefusedWithTheKey) {
  const std::string d = lf::testing::make_temp_dir("moe_refused");
  struct Case {
    int procs;
    std::vector<std::string> args;
    std::string key;
  };
  const Case cases[] = {
      {2, {"--tensor-model-parallel-size", "2", "--expert-tensor-parallel-size", "1"}, "parallel.sequence_parallel"},
      {8, {"--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2", "--sequence-parallel",
           "parallel.order=tp-cp-dp-ep-pp", "--global-batch-size", "16"},
       "parallel.order"},  // experts split over tp x ep need the tp and ep digits adjacent
      {2, {"--expert-model-parallel-size", "2", "--num-experts", "5"}, "parallel.expert_model_parallel_size"},
      {2, {"--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
           "--expert-tensor-parallel-size", "1", "--moe-expert-capacity-factor", "1.5"},
       "model.foundation.moe_expert_capacity_factor"},
      {1, {"--chunkpipe-chunk-size", "16"}, "parallel.chunkpipe_chunk_size"},
      {1, {"--mtp-num-layers", "1", "--chunkpipe-chunk-size", "16"}, "model.foundation.mtp_num_layers"},
      {1, {"--mtp-loss-scaling-factor", "0.3"}, "model.foundation.mtp_loss_scaling_factor"},
      {1, {"--moe-token-dispatcher-type", "alltoall"}, "parallel.moe_token_dispatcher_type"},
      {2, {"--expert-model-parallel-size", "2", "--overlap-moe-expert-parallel-comm"},
       "parallel.overlap_moe_expert_parallel_comm"},  // the all-gather dispatcher has nothing to overlap
      {1, {"--moe-overlap-num-chunks", "4"}, "parallel.moe_overlap_num_chunks"},
      {2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall", "--delay-wgrad-compute"},
       "parallel.delay_wgrad_compute"},  // without the overlap there is nothing to delay behind
      {2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
           "--overlap-moe-expert-parallel-comm", "--moe-overlap-num-chunks", "1", "--no-moe-overlap-micro-batches"},
       "parallel.moe_overlap_num_chunks"},  // one chunk and no pairs: nothing would overlap
      {2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall", "--global-batch-size", "4",
           "--overlap-moe-expert-parallel-comm", "--moe-overlap-num-chunks", "1"},
       "not more than pp"},
      {1, {"--moe-router-num-groups", "3", "--moe-router-group-topk", "1"}, "model.foundation.moe_router_num_groups"},
  };
  {  // the dry run of a valid MoE job states the parameters a token passes through
    auto r = train(1, d + "/ok", {"--dry-run"}, 4);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("372056 parameters (206168 active per token)"), std::string::npos) << r.output;
  }
  {  // under expert parallelism it states the experts' share per rank: 3 MoE layers x 8 experts x
     // 3 x 64 x 48 routed weights = 221184, / ep 8 = 27648; the dense rest (150872) whole
    auto r = train(8, d + "/ep8", {"--dry-run", "--expert-model-parallel-size", "8", "--global-batch-size", "16"}, 4);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("experts: ep 8 x expert-dp 1 (expert TP 1)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("parameters      178520 of 372056 (/ tp 1; routed experts 27648, / ep 8)"),
              std::string::npos)
        << r.output;
  }
  for (const auto& c : cases) {
    std::vector<std::string> a = c.args;
    a.push_back("--dry-run");
    auto r = train(c.procs, d + "/x", a, 4);
    EXPECT_NE(r.exit_code, 0) << c.key;
    EXPECT_NE(r.output.find(c.key), std::string::npos) << c.key << ":\n" << r.output;
  }
}

}  // namespace

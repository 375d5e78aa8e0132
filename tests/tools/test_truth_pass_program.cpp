// Every flag of loongforge-train either does what it says or is refused: each test below changes
// one flag and checks the behaviour changes as described (TensorBoard events read by the
// tensorboard package, the parameter norm, throughput, the document flags on a corpus full of
// end-of-document tokens, fp16 loss scaling with its skipped steps, the LR warmup as Megatron's,
// the loader workers, SGD), and a table maps every flag of --help to the test that covers it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "loongforge/core/config/flags.h"
#include "program_testing.h"

namespace {
namespace fs = std::filesystem;
using lf::testing::bin;
using lf::testing::demo_corpus;
using nlohmann::json;

std::string config(const std::string& name) { return lf::testing::source_dir() + "/configs/" + name; }

struct Run {
  int exit_code = -1;
  std::string output;
  std::vector<json> metrics;
  std::string dir;
  std::vector<double> values(const std::string& key) const {
    std::vector<double> v;
    for (const auto& m : metrics)
      if (m.contains(key)) v.push_back(m[key].get<double>());
    return v;
  }
};

// loongforge-train on `config_file` (demo by default) for `iters` iterations (procs > 1: under
// loongforge-run), its metrics file parsed.
Run train(std::vector<std::string> extra, int iters = 6, int procs = 1, std::string config_file = "",
          std::vector<std::pair<std::string, std::string>> env = {}, const std::string& binary = "loongforge-train") {
  Run out;
  out.dir = lf::testing::make_temp_dir("truth");
  std::vector<std::string> argv;
  if (procs > 1) argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
  std::vector<std::string> t = {bin(binary), "--config-file", config_file.empty() ? config("demo.yaml") : config_file,
                                "--train-iters", std::to_string(iters), "--metrics-file", out.dir + "/m.jsonl",
                                "--log-interval", "1", "--eval-iters", "0", "--data-cache-path", out.dir,
                                "--lr-warmup-iters", "0"};
  argv.insert(argv.end(), t.begin(), t.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  env.push_back({"OMP_NUM_THREADS", "1"});
  auto r = lf::testing::run_command(argv, env, std::chrono::seconds(300));
  out.exit_code = r.exit_code;
  out.output = r.output;
  std::ifstream in(out.dir + "/m.jsonl");
  for (std::string line; std::getline(in, line);) out.metrics.push_back(json::parse(line));
  return out;
}

#define EXPECT_OK(r) ASSERT_EQ((r).exit_code, 0) << (r).output
#define EXPECT_REFUSED(r, key)                                            \
  do {                                                                    \
    EXPECT_EQ((r).exit_code, 2) << (r).output;                            \
    EXPECT_NE((r).output.find(key), std::string::npos) << (r).output;     \
  } while (0)

TEST(TruthPass, TensorBoardEventsAreWhatTensorBoardReads) {
  const std::string tb = lf::testing::make_temp_dir("tb");
  auto r = train({"--tensorboard-dir", tb, "--log-params-norm", "--log-throughput", "--eval-interval", "3", "--eval-iters", "2"});
  EXPECT_OK(r);
  auto o = lf::testing::run_command({lf::testing::source_dir() + "/.venv/bin/python",
                                     lf::testing::source_dir() + "/tests/tools/tensorboard_oracle.py", tb});
  ASSERT_EQ(o.exit_code, 0) << o.output;
  const json scalars = json::parse(o.output.substr(o.output.find('{')));
  for (const char* tag : {"lm loss", "learning-rate", "grad-norm", "tokens-per-sec", "mem-max-allocated-bytes",
                          "params-norm", "throughput", "lm loss validation", "accuracy validation"})
    EXPECT_TRUE(scalars.contains(tag)) << tag << " in " << o.output;
  ASSERT_EQ(scalars["lm loss"].size(), 6u);
  const auto loss = r.values("loss"), lr = r.values("lr"), norm = r.values("params_norm");
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(scalars["lm loss"][i][0].get<int64_t>(), static_cast<int64_t>(i + 1));
    EXPECT_NEAR(scalars["lm loss"][i][1].get<double>(), loss[i], 1e-6 * loss[i]);  // stored as float
    EXPECT_NEAR(scalars["learning-rate"][i][1].get<double>(), lr[i], 1e-6 * std::max(lr[i], 1e-12));
    EXPECT_NEAR(scalars["params-norm"][i][1].get<double>(), norm[i], 1e-6 * norm[i]);
  }
  // Validation before training (step 0), at iteration 3, after training (6).
  ASSERT_EQ(scalars["lm loss validation"].size(), 3u);
  EXPECT_EQ(scalars["lm loss validation"][1][0].get<int64_t>(), 3);
}

TEST(TruthPass, ParamsNormIsTheNormOfTheFinalWeights) {
  const std::string dump = lf::testing::make_temp_dir("pnorm") + "/p.safetensors";
  auto r = train({"--log-params-norm", "--tensor-model-parallel-size", "2"}, 4, 2, "",
                 {{"LOONGFORGE_DUMP_PARAMS", dump}});
  EXPECT_OK(r);
  double sq = 0;
  for (const auto& [name, v] : lf::testing::read_params(dump))
    for (float x : v) sq += static_cast<double>(x) * x;
  const auto norm = r.values("params_norm");
  ASSERT_EQ(norm.size(), 4u);
  // Every element once over TP 2 (split and replicated tensors), in fp64: rounding only.
  EXPECT_NEAR(norm.back(), std::sqrt(sq), 1e-6 * std::sqrt(sq));
  EXPECT_NE(r.output.find("| params norm "), std::string::npos);
  auto without = train({}, 2);
  EXPECT_OK(without);
  EXPECT_EQ(without.output.find("params norm"), std::string::npos);
  EXPECT_FALSE(without.metrics.front().contains("params_norm"));
}

TEST(TruthPass, LogThroughputAddsTflopsPerRank) {
  auto with = train({"--log-throughput"}, 2), without = train({}, 2);
  EXPECT_OK(with);
  EXPECT_OK(without);
  EXPECT_NE(with.output.find("TFLOP/s per rank"), std::string::npos);
  EXPECT_EQ(without.output.find("TFLOP/s"), std::string::npos);
  ASSERT_TRUE(with.metrics.back().contains("tflops_per_rank"));
  EXPECT_GT(with.metrics.back()["tflops_per_rank"].get<double>(), 0);
  EXPECT_FALSE(without.metrics.back().contains("tflops_per_rank"));
}

std::vector<std::string> on_corpus(std::vector<std::string> extra) {
  std::vector<std::string> a = {"data.mock_data=false", "--data-path", demo_corpus(), "--tokenizer-type", "ByteTokenizer",
                                "model.foundation.vocab_size=257", "--seq-length", "64", "--split", "100,0,0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(TruthPass, DocumentFlagsChangeTheLossOnACorpusOfShortDocuments) {
  auto base = train(on_corpus({})), again = train(on_corpus({}));
  EXPECT_OK(base);
  EXPECT_OK(again);
  EXPECT_EQ(base.values("loss"), again.values("loss")) << "the baseline is reproducible";
  for (const char* flag : {"--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask"}) {
    auto r = train(on_corpus({flag}));
    EXPECT_OK(r);
    EXPECT_NE(r.values("loss").front(), base.values("loss").front()) << flag << " changed nothing";
  }
  // Position ids and the document mask together: each document is trained as if alone.
  auto both = train(on_corpus({"--reset-position-ids", "--reset-attention-mask"}));
  EXPECT_OK(both);
  // Without an end-of-document id the flags cannot work: refused, naming what is missing.
  auto no_eod = train({"data.mock_data=false", "--data-path", demo_corpus(), "model.foundation.vocab_size=257", "--eod-mask-loss",
                       "--seq-length", "64", "--split", "100,0,0"});
  EXPECT_REFUSED(no_eod, "end-of-document id");
  // A tokenizer file without a tokenizer type would not be read (nor its vocabulary checked).
  auto no_type = train({"data.mock_data=false", "--data-path", demo_corpus(), "model.foundation.vocab_size=257",
                        "--tokenizer-model", demo_corpus(), "--seq-length", "64", "--split", "100,0,0"});
  EXPECT_REFUSED(no_type, "data.tokenizer_type is not");
}

// The masked token counts differ per rank and micro-batch; the loss is normalised by the count
// over the whole global batch, so DP 2 equals one process exactly (up to summation order).
TEST(TruthPass, EodMaskedLossUnderDataParallelEqualsOneProcess) {
  const auto args = on_corpus({"--eod-mask-loss", "--global-batch-size", "8", "--micro-batch-size", "2",
                               "--deterministic-mode"});
  auto one = train(args, 6), two = train(args, 6, 2);
  EXPECT_OK(one);
  EXPECT_OK(two);
  const auto a = one.values("loss"), b = two.values("loss");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-6 * a[i]) << "iteration " << i + 1;
}

TEST(TruthPass, Fp16UsesADynamicLossScaleWithHysteresis) {
  auto fp32 = train({}, 8), fp16 = train({"--fp16", "--initial-loss-scale", "65536"}, 8);
  EXPECT_OK(fp32);
  EXPECT_OK(fp16);
  const auto a = fp32.values("loss"), b = fp16.values("loss");
  ASSERT_EQ(b.size(), 8u);
  EXPECT_NE(a, b) << "fp16 trains in half precision, not fp32";
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(b[i], a[i], 2e-2 * a[i]);
  EXPECT_EQ(fp16.values("loss_scale").front(), 65536.0);
  // Megatron's start at 2^32 overflows: the first overflow only spends the hysteresis (2), every
  // further one halves the scale; skipped steps do not advance the LR schedule.
  auto big = train({"--fp16", "--lr-warmup-iters", "3"}, 6);
  EXPECT_OK(big);
  const auto scale = big.values("loss_scale");
  ASSERT_EQ(scale.size(), 6u);
  EXPECT_EQ(scale[0], 4294967296.0);
  EXPECT_EQ(scale[1], 4294967296.0);
  EXPECT_EQ(scale[2], 2147483648.0);
  EXPECT_EQ(scale[3], 1073741824.0);
  EXPECT_TRUE(big.metrics[0].value("skipped", false));
  EXPECT_EQ(big.values("lr")[2], 0.0) << "the schedule waits for a successful step";
  EXPECT_NE(big.output.find("gradients overflowed at loss scale"), std::string::npos);
  EXPECT_NE(big.output.find("skipped iterations"), std::string::npos);
  // A constant --loss-scale is applied as given: 1e30 overflows fp16 at every step.
  auto constant = train({"--fp16", "--loss-scale", "1e30"}, 3);
  EXPECT_OK(constant);
  for (const auto& m : constant.metrics) {
    EXPECT_TRUE(m.value("skipped", false));
    EXPECT_EQ(m["loss_scale"].get<double>(), 1e30);
  }
}

TEST(TruthPass, NoValidationPrintsNoHeldOutNumbers) {
  auto r = train({}, 2);
  EXPECT_OK(r);
  EXPECT_NE(r.output.find("done: 2 iterations"), std::string::npos);
  EXPECT_EQ(r.output.find("held-out"), std::string::npos) << r.output;
  auto v = train({"--eval-iters", "1"}, 2);
  EXPECT_OK(v);
  EXPECT_NE(v.output.find("held-out loss"), std::string::npos) << v.output;
}

TEST(TruthPass, TheProgramUsersRunHasNoFaultInjection) {
  auto r = train({}, 4, 1, "", {{"LOONGFORGE_TEST_KILL_AT", "0:2"}, {"LOONGFORGE_TEST_SIGTERM_AT", "0:1"}});
  EXPECT_OK(r);
  EXPECT_EQ(r.metrics.size(), 4u);
  auto f = train({}, 4, 1, "", {{"LOONGFORGE_TEST_KILL_AT", "0:2"}}, "loongforge-train-faults");
  EXPECT_NE(f.exit_code, 0) << "the test build does inject it";
  EXPECT_EQ(f.metrics.size(), 2u);
}

TEST(TruthPass, WarmupStartsAtItsInitialValueAsMegatron) {
  auto r = train({"--lr-warmup-iters", "3", "--lr", "4e-3", "--min-lr", "0", "--lr-decay-style", "constant"}, 5);
  EXPECT_OK(r);
  const auto lr = r.values("lr");
  const std::vector<double> want = {0.0, 4e-3 / 3, 8e-3 / 3, 4e-3, 4e-3};
  ASSERT_EQ(lr.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(lr[i], want[i], 1e-12) << i;
  auto init = train({"--lr-warmup-iters", "2", "--lr", "1e-3", "--lr-warmup-init", "1e-4", "--min-lr", "0"}, 3);
  EXPECT_OK(init);
  EXPECT_NEAR(init.values("lr")[0], 1e-4, 1e-12);
}

TEST(TruthPass, LoaderWorkersChangeThreadsNotData) {
  auto base = train({"--deterministic-mode"}, 3);
  for (const char* n : {"0", "3"}) {
    auto r = train({"--deterministic-mode", "--num-workers", n}, 3);
    EXPECT_OK(r);
    EXPECT_EQ(r.values("loss"), base.values("loss")) << "--num-workers " << n;
  }
}

TEST(TruthPass, SgdTrainsDifferentlyFromAdam) {
  auto adam = train({}, 6), sgd = train({"--optimizer", "sgd", "--lr", "0.5", "--sgd-momentum", "0.9"}, 6);
  EXPECT_OK(sgd);
  const auto s = sgd.values("loss");
  EXPECT_LT(s.back(), s.front());
  EXPECT_NE(s, adam.values("loss"));
  // A checkpoint of one optimizer does not load into the other silently.
  const std::string ck = lf::testing::make_temp_dir("sgd-ck");
  EXPECT_OK(train({"--optimizer", "sgd", "--lr", "0.5", "--save", ck}, 2));
  auto wrong = train({"--load", ck}, 3);
  EXPECT_EQ(wrong.exit_code, 1) << wrong.output;
  EXPECT_NE(wrong.output.find("optimizer 'sgd'"), std::string::npos) << wrong.output;
}

TEST(TruthPass, BackendAndTokenizerMismatchesAreRefused) {
  EXPECT_REFUSED(train({"--distributed-backend", "nccl"}, 1), "parallel.distributed_backend");
  EXPECT_OK(train({"--distributed-backend", "gloo"}, 1));
  // The byte tokenizer has 257 ids; the demo model 256.
  EXPECT_REFUSED(train({"--tokenizer-type", "ByteTokenizer"}, 1), "data.tokenizer_type");
}

TEST(TruthPass, SeedExitDurationAndCheckpointContentFlags) {
  auto a = train({"--seed", "7"}, 2), b = train({"--seed", "7"}, 2), c = train({"--seed", "8"}, 2);
  EXPECT_OK(a);
  EXPECT_EQ(a.values("loss"), b.values("loss"));
  EXPECT_NE(a.values("loss").front(), c.values("loss").front()) << "another seed, another model";
  auto quick = train({"--exit-duration-in-mins", "1e-6"}, 50);
  EXPECT_OK(quick);
  EXPECT_NE(quick.output.find("exiting at iteration 1 (exit_duration_in_mins)"), std::string::npos) << quick.output;
  const std::string ck = lf::testing::make_temp_dir("content-ck");
  EXPECT_OK(train({"--save", ck, "--no-save-optim", "--no-save-rng"}, 2));
  for (const auto& e : fs::directory_iterator(ck + "/iter_0000002")) {
    EXPECT_FALSE(e.path().filename().string().starts_with("optim_")) << e.path();
    EXPECT_FALSE(e.path().filename().string().starts_with("rng_")) << e.path();
  }
  auto need = train({"--load", ck}, 3);
  EXPECT_NE(need.exit_code, 0);
  EXPECT_NE(need.output.find("has no optimizer state"), std::string::npos) << need.output;
  EXPECT_OK(train({"--load", ck, "--no-load-optim"}, 3));
  // --valid-data-path: validation reads that dataset, not a split of the training data.
  auto v = train(on_corpus({"--valid-data-path", demo_corpus(), "--eval-iters", "2"}), 2);
  EXPECT_OK(v);
  EXPECT_NE(v.output.find("valid data:"), std::string::npos) << v.output;
}

// --profile: the log gets the step's time by category (summing to the profiled wall time) and the
// top ops; --profile-trace a Chrome trace; a window outside the run is an error naming the flags,
// and the window or trace flags without --profile are an error too.
TEST(TruthPass, ProfileReportsWhereTheStepTimeGoes) {
  auto dir = lf::testing::make_temp_dir("profile");
  const std::string trace = dir + "/trace.json";
  auto r = train({"--profile", "--profile-step-start", "2", "--profile-step-end", "4", "--profile-trace", trace}, 4);
  EXPECT_OK(r);
  EXPECT_NE(r.output.find("profile | 2 step(s)"), std::string::npos) << r.output;
  for (const char* cat : {"GEMM: layers", "GEMM: output layer", "attention", "norms, activations, RoPE",
                          "optimizer", "gradient buffer", "outside any op"})
    EXPECT_NE(r.output.find(cat), std::string::npos) << cat << " missing:\n" << r.output;
  // The categories' shares add up to the whole profiled time (within rounding).
  std::regex share("profile \\| [^|]*?\\s([0-9.]+)%");
  double total = 0;
  for (std::sregex_iterator i(r.output.begin(), r.output.end(), share), end; i != end; ++i)
    total += std::stod((*i)[1]);
  EXPECT_NEAR(total, 100.0, 2.0) << r.output;
  std::ifstream in(trace);
  ASSERT_TRUE(in.good()) << trace;
  json events = json::parse(in);
  EXPECT_TRUE(events.contains("traceEvents"));
  EXPECT_GT(events["traceEvents"].size(), 100u);
  auto bad = train({"--profile", "--profile-step-start", "5", "--profile-step-end", "6"}, 4);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--profile-step-start"), std::string::npos) << bad.output;
  // The window or the trace without --profile would profile nothing: refused, not ignored.
  for (std::vector<std::string> a : {std::vector<std::string>{"--profile-trace", trace},
                                     std::vector<std::string>{"--profile-step-start", "2", "--profile-step-end", "3"}}) {
    auto r = train(a, 4);
    EXPECT_NE(r.exit_code, 0) << a[0];
    EXPECT_NE(r.output.find("add --profile"), std::string::npos) << r.output;
  }
}

// Every flag of --help, with what covers it: a test of its behaviour, or its refusal (run here).
TEST(TruthPass, EveryFlagActsOrIsRefused) {
  const std::map<std::string, std::string> covered = {
      {"--tensor-model-parallel-size", "TpProgram.*"}, {"--pipeline-model-parallel-size", "PpProgram.*"},
      {"--sequence-parallel", "TpProgram.*"}, {"--context-parallel-size", "CpProgram.*"},
      {"--cp-comm-type", "CpProgram.*"},
      {"--expert-model-parallel-size", "MoeTraining.ExpertParallel*"},
      {"--expert-tensor-parallel-size",
       "MoeTraining.ExpertParallelEqualsSingleProcess (1), MoeTraining.ExpertsSplitOverTpAndEp* (= tp)"},
      {"--num-layers-per-virtual-pipeline-stage", "PpProgram.*"},
      {"--pipeline-trace", "PipelineParallelTrace.*"}, {"--chunkpipe-chunk-size", "ChunkPipeProgram.*"},
      {"--decoder-first-pipeline-num-layers", "PpProgram.*"}, {"--decoder-last-pipeline-num-layers", "PpProgram.*"},
      {"--pipeline-model-parallel-layout", "PpProgram.*"}, {"--distributed-timeout-minutes", "DistFailures.*"},
      {"--distributed-backend", "BackendAndTokenizerMismatchesAreRefused"},
      {"--overlap-grad-reduce", "OptimizerProgram.*"}, {"--overlap-param-gather", "refused"},
      {"--ddp-bucket-size", "OptimizerProgram.*"}, {"--micro-batch-size", "OptimizerProgram.*"},
      {"--global-batch-size", "OptimizerProgram.*"}, {"--train-iters", "every program test"},
      {"--seq-length", "every program test"}, {"--seed", "SeedExitDurationAndCheckpointContentFlags"}, {"--bf16", "OptimizerProgram.*"},
      {"--fp16", "Fp16UsesADynamicLossScaleWithHysteresis"}, {"--loss-scale", "Fp16UsesADynamicLossScaleWithHysteresis"},
      {"--initial-loss-scale", "Fp16UsesADynamicLossScaleWithHysteresis"}, {"--min-loss-scale", "LossScaler.*"},
      {"--loss-scale-window", "LossScaler.*"}, {"--hysteresis", "LossScaler.* and Fp16..."},
      {"--fp8-format", "Fp8Training.*"}, {"--fp8-recipe", "Fp8Training.RecipesLearnNearTheTrainingDtype"},
      {"--fp8-margin", "Fp8Training.RecipesLearnNearTheTrainingDtype"},
      {"--fp8-amax-history-len", "Fp8DelayedTraining.*"}, {"--fp8-amax-compute-algo", "Fp8DelayedTraining.*"},
      {"--fp8-policy", "Fp8Training.PolicyFileChoosesPerGemmAndTokenCount"},
      {"--first-last-layers-bf16", "Fp8Training.FirstAndLastLayersStayInTheTrainingDtype"},
      {"--num-layers-at-start-in-bf16", "Fp8Training.FirstAndLastLayersStayInTheTrainingDtype"},
      {"--num-layers-at-end-in-bf16", "Fp8Training.FirstAndLastLayersStayInTheTrainingDtype"},
      {"--recompute-granularity", "Decoder.Recompute*, TpProgram.*"}, {"--recompute-method", "Decoder.Recompute*"},
      {"--recompute-num-layers", "Decoder.Recompute*"}, {"--deterministic-mode", "OptimizerProgram.Deterministic*"},
      {"--eval-interval", "TensorBoardEventsAreWhatTensorBoardReads"}, {"--eval-iters", "NoValidationPrintsNoHeldOutNumbers"},
      {"--exit-interval", "CheckpointProgram.*"}, {"--ema-decay", "WanTraining.EmaWeightsAreKeptInTheCheckpoint"}, {"--min-timestep-boundary", "WanTraining.LayoutsAndKeysItCannotTakeAreConfigErrors"}, {"--max-timestep-boundary", "WanTraining.LayoutsAndKeysItCannotTakeAreConfigErrors"}, {"--exit-duration-in-mins", "SeedExitDurationAndCheckpointContentFlags"},
      {"--optimizer", "SgdTrainsDifferentlyFromAdam"}, {"--lr", "WarmupStartsAtItsInitialValueAsMegatron"},
      {"--min-lr", "LrSchedule.*"}, {"--lr-decay-style", "LrSchedule.*"}, {"--lr-decay-iters", "LrSchedule.*"},
      {"--lr-warmup-iters", "WarmupStartsAtItsInitialValueAsMegatron"}, {"--lr-warmup-fraction", "LrSchedule.*"},
      {"--lr-warmup-init", "WarmupStartsAtItsInitialValueAsMegatron"}, {"--lr-wsd-decay-iters", "LrSchedule.*"},
      {"--lr-wsd-decay-style", "LrSchedule.*"}, {"--weight-decay", "AdamW.NoWeightDecayOnNormsAndBiases"},
      {"--adam-beta1", "ReferenceAdamW.*"}, {"--adam-beta2", "ReferenceAdamW.*"}, {"--adam-eps", "ReferenceAdamW.*"},
      {"--sgd-momentum", "Sgd.*"}, {"--clip-grad", "GradClip.*"},
      {"--use-distributed-optimizer", "OptimizerProgram.*"}, {"--data-path", "TrainProgram.*"},
      {"--valid-data-path", "SeedExitDuration..."}, {"--split", "GptDataset.*"}, {"--mock-data", "every program test"},
      {"--tokenizer-type", "DocumentFlagsChangeTheLoss..., BackendAndTokenizerMismatchesAreRefused"},
      {"--tokenizer-model", "Tokenizer.*"}, {"--vocab-file", "refused"}, {"--merge-file", "refused"},
      {"--data-cache-path", "IndexCache.*"}, {"--num-workers", "LoaderWorkersChangeThreadsNotData"},
      {"--reset-position-ids", "DocumentFlagsChangeTheLoss..."}, {"--reset-attention-mask", "DocumentFlagsChangeTheLoss..."},
      {"--eod-mask-loss", "DocumentFlagsChangeTheLoss..., EodMaskedLoss..."}, {"--save", "CheckpointProgram.*"},
      {"--load", "CheckpointProgram.*"}, {"--save-interval", "CheckpointProgram.*"},
      {"--no-save-optim", "SeedExitDuration..."}, {"--no-save-rng", "SeedExitDuration..."},
      {"--no-load-optim", "LoadSemantics.*"}, {"--no-load-rng", "CheckpointProgram.*"}, {"--finetune", "LoadSemantics.*"},
      {"--exit-on-missing-checkpoint", "LoadSemantics.*"}, {"--ckpt-keep-last", "CheckpointProgram.*"},
      {"--async-save", "CheckpointProgram.*"}, {"--save-hf", "ConvertProgram.*"}, {"--log-interval", "every program test"},
      {"--metrics-file", "every program test"}, {"--tensorboard-dir", "TensorBoardEventsAreWhatTensorBoardReads"},
      {"--log-params-norm", "ParamsNormIsTheNormOfTheFinalWeights"}, {"--log-throughput", "LogThroughputAddsTflopsPerRank"},
      {"--num-layers", "model flags"}, {"--hidden-size", "model flags"}, {"--ffn-hidden-size", "model flags"},
      {"--num-attention-heads", "model flags"}, {"--group-query-attention", "ModelRegistry.MistakesNameTheKeyAndSuggest"},
      {"--num-query-groups", "model flags"}, {"--kv-channels", "DecoderVariant.*"},
      {"--max-position-embeddings", "model flags"}, {"--position-embedding-type", "schema: rope only"},
      {"--rotary-base", "DecoderVariant.*"}, {"--vocab-size", "model flags"},
      {"--make-vocab-size-divisible-by", "Decoder.VocabularyPadding*"}, {"--normalization", "DecoderVariant.*"},
      {"--swiglu", "DecoderVariant.*"}, {"--untie-embeddings-and-output-weights", "PpProgram.*"},
      {"--disable-bias-linear", "DecoderVariant.*"}, {"--add-qkv-bias", "DecoderVariant.*"},
      {"--qk-layernorm", "DecoderVariant.*"}, {"--init-method-std", "Decoder.*"}, {"--hidden-dropout", "Decoder.HiddenDropout*"},
      {"--attention-dropout", "refused unless 0 (Decoder.AttentionDropoutIsRefusedNamingTheValue)"},
      {"--num-experts", "MoeVariants.*, MoeTraining.*"}, {"--moe-router-topk", "MoeVariants.*"},
      {"--moe-ffn-hidden-size", "MoeDecoderConfig.*, HfParity.* (qwen3_moe)"},
      {"--moe-router-score-function", "MoeVariants.*"}, {"--moe-router-pre-softmax", "MoeVariants.*"},
      {"--moe-router-num-groups", "MoeVariants.deepseek_v3*"}, {"--moe-router-group-topk", "MoeVariants.deepseek_v3*"},
      {"--moe-router-topk-scaling-factor", "MoeVariants.*"},
      {"--moe-router-load-balancing-type", "MoeAuxLosses.*, MoeTraining.*"},
      {"--moe-aux-loss-coeff", "MoeAuxLosses.*, MoeTraining.*"}, {"--moe-z-loss-coeff", "MoeAuxLosses.*, MoeTraining.*"},
      {"--moe-router-enable-expert-bias", "MoeExpertBias.*, MoeVariants.deepseek_v3*, MoeTraining.*"},
      {"--moe-router-bias-update-rate", "MoeExpertBias.UpdateRule"},
      {"--moe-shared-expert-intermediate-size", "MoeVariants.*"}, {"--moe-shared-expert-gate", "MoeVariants.qwen2*"},
      {"--moe-layer-freq", "MoeDecoderConfig.*"}, {"--moe-expert-capacity-factor", "MoeRouting.CapacityDrops*"},
      {"--moe-token-drop-policy", "MoeRouting.CapacityDrops*"},
      {"--moe-token-dispatcher-type", "MoeTraining.ExpertParallelEqualsSingleProcess"},
      {"--overlap-moe-expert-parallel-comm", "MoeTraining.ExpertParallelEqualsSingleProcess"},
      {"--moe-overlap-num-chunks", "MoeTraining.ExpertParallelEqualsSingleProcess"},
      {"--delay-wgrad-compute", "MoeTraining.ExpertParallelEqualsSingleProcess"},
      {"--no-moe-overlap-micro-batches", "MoeTraining.OverlapAcrossMicroBatches*"}, {"--mtp-num-layers", "MoeTraining.MultiTokenPrediction*, HfParity.DeepseekV3Mtp*"},
      {"--mtp-loss-scaling-factor", "MoeTraining.MultiTokenPrediction* (0.1 x cross entropy), refused without MTP"},
      {"--multi-latent-attention", "HfParity.DeepseekV3MlaBlock*, MlaDecoder.*, TpDecoder.*"},
      {"--q-lora-rank", "HfParity.DeepseekV3MlaBlock*, MlaDecoder.*"}, {"--kv-lora-rank", "HfParity.DeepseekV3MlaBlock*"},
      {"--qk-head-dim", "HfParity.DeepseekV3MlaBlock*"}, {"--qk-pos-emb-head-dim", "HfParity.DeepseekV3MlaBlock*"},
      {"--v-head-dim", "HfParity.DeepseekV3MlaBlock*"}, {"--rope-type", "HfParity.DeepseekV3MlaBlock* (yarn)"},
      {"--rotary-scaling-factor", "HfParity.DeepseekV3MlaBlock*"}, {"--mscale", "HfParity.DeepseekV3MlaBlock*"},
      {"--mscale-all-dim", "HfParity.DeepseekV3MlaBlock*"}, {"--beta-fast", "HfParity.DeepseekV3MlaBlock* (default 32)"},
      {"--beta-slow", "HfParity.DeepseekV3MlaBlock* (default 1)"},
      {"--rotary-interleaved", "HfParity.DeepseekV3MlaBlock*, TpDecoder.*"},
      {"--experimental-attention-variant", "DsaLayer.*, DsaDecoder.*, HfParity.* (deepseek_v32)"},
      {"--dsa-indexer-n-heads", "DsaDecoder.ConfigMistakesNameTheKey, HfParity.* (deepseek_v32)"},
      {"--dsa-indexer-head-dim", "DsaDecoder.ConfigMistakesNameTheKey, HfParity.* (deepseek_v32)"},
      {"--dsa-indexer-topk", "DsaLayer.TopkOverEveryKeyEqualsDenseMlaAndFewerKeysDoNot, HfParity.* (deepseek_v32)"},
      {"--dsa-indexer-loss-coeff", "DsaLayer.IndexerLoss*, DsaDecoder.TrainerSeesTheIndexerLossAndTheIndexerLearns"},
      {"--dsa-indexer-warmup", "DsaLayer.WarmupAttendsToEveryKey, DsaDecoder.WarmupFreezesEverythingButTheIndexers"},
      {"--profile", "TruthPass.ProfileReportsWhereTheStepTimeGoes"},
      {"--profile-step-start", "TruthPass.ProfileReportsWhereTheStepTimeGoes"},
      {"--profile-step-end", "TruthPass.ProfileReportsWhereTheStepTimeGoes"},
      {"--profile-trace", "TruthPass.ProfileReportsWhereTheStepTimeGoes"},
      {"--cross-entropy-loss-fusion", "CrossEntropyFusion.*"}, {"--no-cross-entropy-loss-fusion", "CrossEntropyFusion.*"},
      {"--gradient-accumulation-fusion", "GradientAccumulationFusion.*"},
      {"--no-gradient-accumulation-fusion", "GradientAccumulationFusion.*"},
      {"--training-phase", "SftTraining.*, SftSource.*, FinetuneConfig.*"},
      {"--packing-sft-data", "SftSource.PackedRowsEqualEachConversationInItsOwnRow, SftTraining.*"},
      {"--use-vlm-dp-balance", "VlmDpBalance.* (balanced DP 2 equals Megatron's split; refusals)"},
      {"--enable-encoder-hetero-dp",
       "Qwen25Vl.MultimodalStoreTrainsAndLayoutsEqualOneProcess (TP 2 with the tower data-parallel over it equals one "
       "process; --dry-run line; refusals)"},
      {"--enable-full-hetero-dp",
       "Qwen25Vl.FullHeteroDpEqualsOneProcess (PP 2, TP 2 x PP 2, CP 2 x PP 2 and DP 2 x PP 2 with the tower over "
       "every rank equal one process; log line; --dry-run layout and memory; refusals)"},
      {"--use-vit-dp-balance",
       "Qwen25Vl.MultimodalStoreTrainsAndLayoutsEqualOneProcess (DP 2, TP 2 x DP 2 and CP 2 x DP 2 with the media "
       "balanced before the tower equal one process; log line; --dry-run line; refusals)"},
      {"--vlm-dp-balance-warmup-iters", "VlmDpBalance.BalancedTrainingEqualsMegatronsSplit (fitted), VlmDpBalance.Flags*"},
      {"--vlm-dp-balance-cost", "VlmDpBalance.BalancedTrainingEqualsMegatronsSplit (given), VlmDpBalance.Flags*"},
      {"--pretrained-checkpoint", "LoraTraining.*, LoraPeft.*"},
      {"--lora-rank", "LoraTraining.*, LoraPeft.*"}, {"--lora-alpha", "LoraTraining.*, LoraPeft.* (scale alpha / r)"},
      {"--lora-dropout", "LoraAdapter.DropoutActsInTrainingOnly"},
      {"--lora-target-modules", "LoraTraining.* (all-linear), LoraPeft.* (subset), FinetuneConfig.*"},
      {"--use-rslora", "LoraPeft.* (rsLoRA adapters and export)"},
  };
  std::set<std::string> flags;
  for (const auto& f : lf::config::flag_table()) flags.emplace(f.flag);
  for (const auto& f : lf::config::refused_flag_names()) flags.insert(f);
  for (const auto& f : flags) EXPECT_TRUE(covered.count(f)) << "flag " << f << " has no test or refusal listed";
  // The refusals, run: each is an error (exit 2) naming the flag or its key, never ignored.
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--expert-tensor-parallel-size", "2"}, "expert_tensor_parallel_size"},
      {{"--overlap-param-gather"}, "overlap_param_gather"},
      {{"--vocab-file", "v.json"}, "data.vocab_file"},
      {{"--merge-file", "m.txt"}, "data.merge_file"},
      {{"--moe-token-dispatcher-type", "alltoall"}, "moe_token_dispatcher_type"},  // dense: nothing to dispatch
      {{"--expert-tensor-parallel-size", "1"}, "expert_tensor_parallel_size"},     // dense: no experts
      {{"--overlap-moe-expert-parallel-comm"}, "overlap_moe_expert_parallel_comm"},  // dense: nothing to overlap
      {{"--delay-wgrad-compute"}, "parallel.delay_wgrad_compute"},  // without the overlap: nothing to delay
      {{"--no-moe-overlap-micro-batches"}, "parallel.moe_overlap_micro_batches"},  // the overlap is off
      {{"--multi-latent-attention"}, "kv_lora_rank"},
      {{"--experimental-attention-variant", "dsa"}, "experimental_attention_variant"},  // DSA without MLA
      {{"--num-experts", "3", "--moe-router-topk", "4"}, "moe_router_topk"},
      {{"--hysteresis", "4"}, "training.hysteresis"},
      {{"--position-embedding-type", "learned_absolute"}, "position_embedding_type"},
      {{"--attention-dropout", "0.1"}, "attention_dropout"},
      {{"--cp-comm-type", "a2a"}, "parallel.cp_comm_type"},  // context parallelism off
  };
  for (const auto& [args, key] : refused) {
    auto a = args;
    a.push_back("--dry-run");
    EXPECT_REFUSED(train(a, 1), key);
  }
  {  // a dense model has no experts to parallelise
    auto r = train({"--expert-model-parallel-size", "2"}, 1, 2);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("parallel.expert_model_parallel_size"), std::string::npos) << r.output;
  }
}

}  // namespace

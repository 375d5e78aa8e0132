// loongforge-train with --chunkpipe-chunk-size: 8 chunks of the demo's 128-token sequences train
// the same model as unchunked sequences (10 steps, one process and PP = 2); the peak memory of a
// step (the CPU backend's counting allocator) at 16K tokens with 2K chunks stays within 1.3x of
// that at 4K tokens while the unchunked step grows with the length (the numbers of
// docs/performance.md, made there by tools/bench --chunkpipe-memory); layout clashes are
// configuration errors naming the values.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <regex>

#include "pp_training.h"

namespace {
using lf::testing::bin;
using lf::testing::expect_same_training;
using lf::testing::run_command;
using lf::testing::train;

TEST(ChunkPipeProgram, EightChunksTrainLikeWholeSequences) {
  expect_same_training(train(1, 1, 2, {}, "cp-whole"), train(1, 1, 2, {"--chunkpipe-chunk-size", "16"}, "cp-chunks"),
                       "ChunkPipe, 8 chunks of 16 tokens, one process");
}

// Data parallel with the overlapped, ZeRO-1 gradient path: each chunk's backward adds to the
// gradients, and only the last chunk's (chunk 0 of the last sequence) may start the reduction.
TEST(ChunkPipeProgram, Dp2WithOverlappedReductionEqualsWholeSequences) {
  expect_same_training(train(1, 1, 2, {}, "cp-whole-dp"),
                       train(2, 1, 2, {"--chunkpipe-chunk-size", "16", "--overlap-grad-reduce",
                                       "--use-distributed-optimizer", "--ddp-bucket-size", "20000"},
                             "cp-dp2"),
                       "ChunkPipe at DP 2, overlapped reduction, ZeRO-1");
}

// bf16: the chunks' attention merges two bf16 partial outputs by their fp32 log-sum-exp and the
// key/value gradients accumulate in fp32, so the runs differ by bf16 rounding only: the
// tolerances of the bf16 TP test (test_tp_program.cpp).
TEST(ChunkPipeProgram, Bf16ChunksTrainLikeWholeSequences) {
  expect_same_training(train(1, 1, 2, {"--bf16"}, "cp-whole-bf16"),
                       train(1, 1, 2, {"--bf16", "--chunkpipe-chunk-size", "16"}, "cp-chunks-bf16"),
                       "ChunkPipe bf16, 8 chunks of 16 tokens",
                       lf::testing::Tolerances{.loss_rel = 1e-3, .param_abs = 8e-3, .norm_rel = 1e-2});
}

TEST(ChunkPipeProgram, Pp2EqualsWholeSequencesInOneProcess) {
  expect_same_training(train(1, 1, 2, {}, "cp-whole-pp"), train(2, 2, 2, {"--chunkpipe-chunk-size", "16"}, "cp-pp2"),
                       "ChunkPipe at PP 2, 8 chunks of 16 tokens");
}

// Validation runs in chunks too (a long sequence's logits never exist at once): the held-out loss
// and accuracy before and after 3 steps equal the unchunked ones, in one process and at PP 2.
TEST(ChunkPipeProgram, ValidationInChunksEqualsWholeSequences) {
  auto run = [](int procs, std::vector<std::string> extra) {
    std::vector<std::string> argv;
    if (procs > 1) argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
    std::vector<std::string> t = {bin("loongforge-train"), "--config-file",
                                  lf::testing::source_dir() + "/configs/demo.yaml", "--train-iters", "3",
                                  "--eval-iters", "2", "--deterministic-mode",
                                  "--data-cache-path", lf::testing::make_temp_dir("cp-eval")};
    argv.insert(argv.end(), t.begin(), t.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto r = run_command(argv, {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::smatch m;
    std::vector<double> v;
    if (std::regex_search(r.output, m, std::regex("held-out loss ([0-9.]+) -> ([0-9.]+) \\| held-out accuracy "
                                                  "([0-9.]+) -> ([0-9.]+)")))
      for (int i = 1; i <= 4; ++i) v.push_back(std::stod(m[i]));
    EXPECT_EQ(v.size(), 4u) << r.output;
    return v;
  };
  const auto whole = run(1, {});
  for (const auto& [procs, extra] : std::vector<std::pair<int, std::vector<std::string>>>{
           {1, {"--chunkpipe-chunk-size", "32"}},
           {2, {"--chunkpipe-chunk-size", "32", "--pipeline-model-parallel-size", "2"}}}) {
    const auto chunked = run(procs, extra);
    ASSERT_EQ(chunked.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i)
      EXPECT_NEAR(chunked[i], whole[i], 1e-4 * std::abs(whole[i]) + 1e-6) << procs << " process(es), value " << i;
  }
}

// One step of configs/bench/chunkpipe_memory.yaml; returns the peak memory in MiB.
double peak_mib(int64_t seq, std::optional<int64_t> chunk) {
  auto dir = lf::testing::make_temp_dir("cp-mem");
  std::vector<std::string> argv = {bin("loongforge-train"), "--config-file",
                                   lf::testing::source_dir() + "/configs/bench/chunkpipe_memory.yaml",
                                   "--seq-length", std::to_string(seq), "--metrics-file", dir + "/m.jsonl"};
  if (chunk) argv.insert(argv.end(), {"--chunkpipe-chunk-size", std::to_string(*chunk)});
  auto r = run_command(argv, {{"OMP_NUM_THREADS", "2"}}, std::chrono::seconds(300));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  const std::string metrics = lf::testing::read_file(dir + "/m.jsonl");
  if (!std::regex_search(metrics, m, std::regex("\"peak_memory_mib\": ([0-9.eE+]+)"))) {
    ADD_FAILURE() << "no peak_memory_mib in " << metrics << "\n" << r.output;
    return 0;
  }
  return std::stod(m[1]);
}

TEST(ChunkPipeProgram, PeakMemoryIsBoundedByTheChunkNotTheSequence) {
  const double c4 = peak_mib(4096, 2048), c16 = peak_mib(16384, 2048);
  const double u4 = peak_mib(4096, {}), u16 = peak_mib(16384, {});
  std::cout << "peak MiB: ChunkPipe 2K chunks 4K " << c4 << ", 16K " << c16 << " (x" << c16 / c4
            << "); unchunked 4K " << u4 << ", 16K " << u16 << " (x" << u16 / u4 << ")\n";
  // The bound. What grows is the kept keys/values and their gradient slots (16 + 14 MiB
  // at 16K tokens here, 4 + 2 at 4K): a few percent of a token's activations per layer.
  EXPECT_LE(c16, 1.3 * c4);
  // Unchunked, the activations grow with the length (x4 tokens: well over x2 in total).
  EXPECT_GT(u16, 2.5 * u4);
  EXPECT_LT(c16, u4);  // 16K tokens in chunks take less than 4K tokens whole
}

TEST(ChunkPipeProgram, LayoutClashesAreConfigurationErrors) {
  auto dry = [](std::vector<std::string> extra) {
    std::vector<std::string> argv = {bin("loongforge-train"), "--config-file",
                                     lf::testing::source_dir() + "/configs/demo.yaml", "--dry-run"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_command(argv);
  };
  struct Case {
    std::vector<std::string> flags;
    const char* message;
  };
  for (const auto& c : std::vector<Case>{
           {{"--chunkpipe-chunk-size", "48"},
            "the sequence does not split into whole chunks: training.seq_length = 128"},
           {{"--chunkpipe-chunk-size", "17", "--seq-length", "68", "--tensor-model-parallel-size", "2",
             "--sequence-parallel"},
            "the chunk size must be a multiple of the TP size: parallel.chunkpipe_chunk_size = 17"},
           {{"--chunkpipe-chunk-size", "16", "--context-parallel-size", "2", "--cp-comm-type", "a2a"},
            "under ChunkPipe context-parallel ranks all-gather each chunk's keys and values"},
           {{"--chunkpipe-chunk-size", "16", "--pipeline-model-parallel-size", "2",
             "--num-layers-per-virtual-pipeline-stage", "1"},
            "ChunkPipe runs its own schedule, not the interleaved one"}}) {
    auto r = dry(c.flags);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.message << "\n" << r.output;
  }
  // The dry run's memory estimate counts one chunk, not the sequence.
  auto r = dry({"--chunkpipe-chunk-size", "16"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(one chunk of 16 tokens + the sequence's keys/values)"), std::string::npos) << r.output;
}

}  // namespace

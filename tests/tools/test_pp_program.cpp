// loongforge-train under pipeline parallelism, launched by loongforge-run: PP = 2 and PP = 4 with
// 1F1B and interleaved (v = 2), and TP = 2 x PP = 2 on 4 processes, train the same model as one
// process (same seed, same global batch, 10 steps), step by step and in the final parameters
// (every stage's dump merged); an uneven split; the layer split errors and the stage assignment
// of --dry-run.
#include <gtest/gtest.h>

#include <fstream>

#include "pp_training.h"

namespace {
using lf::testing::bin;
using lf::testing::expect_same_training;
using lf::testing::run_command;
using lf::testing::train;

TEST(PipelineParallelEquivalence, Pp2OneFOneBEqualsSingleProcess) {
  expect_same_training(train(1, 1, 2, {}, "single2"), train(2, 2, 2, {}, "pp2"), "PP 2 (1F1B)");
}

TEST(PipelineParallelEquivalence, Pp4OneFOneBEqualsSingleProcess) {
  expect_same_training(train(1, 1, 4, {}, "single4"), train(4, 4, 4, {}, "pp4"), "PP 4 (1F1B)");
}

// Interleaved 1F1B, v = 2 model chunks per stage (one layer per virtual stage): PP 2 holds layers
// 0 + 2 and 1 + 3; PP 4 on 8 layers holds 0 + 4, 1 + 5, 2 + 6, 3 + 7 (the activations go round the
// ring twice). 4 micro-batches per step, a multiple of pp as the schedule needs.
TEST(PipelineParallelEquivalence, Pp2InterleavedEqualsSingleProcess) {
  expect_same_training(train(1, 1, 4, {}, "single-v4"),
                       train(2, 2, 4, {"--num-layers-per-virtual-pipeline-stage", "1"}, "pp2-v2"),
                       "PP 2 interleaved (v 2)");
}

TEST(PipelineParallelEquivalence, Pp4InterleavedEqualsSingleProcess) {
  expect_same_training(train(1, 1, 8, {}, "single-v8"),
                       train(4, 4, 8, {"--num-layers-per-virtual-pipeline-stage", "1"}, "pp4-v2"),
                       "PP 4 interleaved (v 2)");
}

// Megatron's layout string: 4 layers as "Et|tt|t|L" over PP 2 (v = 2: rank 0 holds the embedding +
// layer 0 and layer 3, rank 1 layers 1-2 and the loss with no layer of its own).
TEST(PipelineParallelEquivalence, Pp2LayoutStringEqualsSingleProcess) {
  expect_same_training(train(1, 1, 4, {}, "single-layout"),
                       train(2, 2, 4, {"--pipeline-model-parallel-layout", "Et|tt|t|L"}, "pp2-layout"),
                       "PP 2, layout Et|tt|t|L");
}

// Interleaved under data parallelism with the overlapped reduction: a model chunk's parameters
// get their last gradient at different times; only the final backward may start buckets, the
// others are reduced after the step's backwards.
TEST(PipelineParallelEquivalence, Pp2InterleavedTimesDp2OverlappedEqualsSingleProcess) {
  // Untied embeddings: tied ones turn the overlap off on the end stages (here: both).
  const std::string untie = "++model.foundation.untie_embeddings_and_output_weights=true";
  expect_same_training(train(1, 1, 4, {untie}, "single-v4dp"),
                       train(4, 2, 4, {"--num-layers-per-virtual-pipeline-stage", "1", "--overlap-grad-reduce",
                                       "--ddp-bucket-size", "20000", untie},
                             "pp2-v2-dp2"),
                       "PP 2 interleaved x DP 2, overlapped reduction");
}

TEST(PipelineParallelEquivalence, Tp2TimesPp2EqualsSingleProcess) {
  expect_same_training(train(1, 1, 2, {}, "single-tp"),
                       train(4, 2, 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, "tp2pp2"),
                       "TP 2 x PP 2 + SP");
}

TEST(PipelineParallelEquivalence, UnevenSplitEqualsSingleProcess) {
  // 4 layers as 1 + 3 over PP 2, clipping on (the norm must sum every stage, the tied embedding
  // once, or the clipped updates differ).
  expect_same_training(train(1, 1, 4, {"--clip-grad", "0.05"}, "single-uneven"),
                       train(2, 2, 4, {"--clip-grad", "0.05", "--decoder-first-pipeline-num-layers", "1"},
                             "pp2-uneven"),
                       "PP 2, layers 1 + 3, clipped");
}

TEST(PipelineParallelDryRun, ShowsTheStageAssignment) {
  auto r = train(4, 4, 8, {"--dry-run", "--decoder-last-pipeline-num-layers", "2"}, "dry");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 8 layers over 4 stages with 2 on the last: 2 + 2 + 2 + 2.
  for (const char* s : {"stage 0: layers 0..1 (2) + embedding", "stage 1: layers 2..3 (2)",
                        "stage 3: layers 6..7 (2) + final norm + tied output copy",
                        // Memory per stage: 1F1B keeps pp - k micro-batches in flight on stage k.
                        "per-rank estimates by pipeline stage", "(4 micro-batches in flight)",
                        "(1 micro-batch in flight)"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
}

TEST(PipelineParallelDryRun, ShowsTheModelChunksOfTheInterleavedSchedule) {
  auto r = train(4, 4, 8, {"--dry-run", "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "16"},
                 "dry-v2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Virtual stage c * 4 + k on stage k. Activations in flight with m = 8: Megatron's warm-up
  // forwards 2 (pp - k - 1) + (v - 1) pp, plus one: 11 on stage 0, 5 on stage 3.
  for (const char* s : {"stage 0: layers 0..0 + 4..4 (2 in 2 model chunks) + embedding",
                        "stage 3: layers 3..3 + 7..7 (2 in 2 model chunks) + final norm",
                        "(11 model-chunk micro-batches in flight)", "(5 model-chunk micro-batches in flight)"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
}

TEST(PipelineParallelDryRun, ShowsTheLayoutStringsStages) {
  auto r = train(2, 2, 4, {"--dry-run", "--pipeline-model-parallel-layout", "E|t*3|t|L"}, "dry-layout");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"stage 0: layers none + 3..3 (1 in 2 model chunks) + embedding",
                        "stage 1: layers 0..2 + none (3 in 2 model chunks) + final norm"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  r = train(2, 2, 4, {"--dry-run", "--pipeline-model-parallel-layout", "Et|ttt|t|L"}, "dry-layout-bad");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("places 5 decoder layers ('t'), model.foundation.num_layers is 4"), std::string::npos)
      << r.output;
}

// --pipeline-trace: every stage writes its Chrome trace and rank 0 prints the measured bubble.
TEST(PipelineParallelTrace, WritesEveryStageAndPrintsTheBubble) {
  auto dir = lf::testing::make_temp_dir("pp-trace");
  auto r = train(2, 2, 2, {"--pipeline-trace", dir + "/trace"}, "trace");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pipeline bubble: "), std::string::npos) << r.output;
  for (const char* stage : {"0", "1"}) {
    std::ifstream in(dir + "/trace.stage" + stage + ".json");
    const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(json.find("\"traceEvents\""), std::string::npos) << stage;
    EXPECT_NE(json.find("\"name\": \"F3\""), std::string::npos) << stage;  // 4 micro-batches per step
    EXPECT_NE(json.find("\"name\": \"step 9\""), std::string::npos) << stage;  // 10 steps
  }
  EXPECT_NE(r.output.find("1F1B ideal (p - 1) / (m + p - 1) = 0.2 for p 2, m 4"), std::string::npos) << r.output;
}

// The other schedules print their own ideal next to the measured bubble; interleaved chunks are
// named F<m>.<chunk> in the trace.
TEST(PipelineParallelTrace, InterleavedAndChunkPipeNameTheirIdeal) {
  auto dir = lf::testing::make_temp_dir("pp-trace-v");
  auto r = train(2, 2, 4, {"--pipeline-trace", dir + "/v", "--num-layers-per-virtual-pipeline-stage", "1"}, "trace-v");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("interleaved ideal (p - 1) / (v m + p - 1) = 0.111111 for p 2, v 2, m 4"),
            std::string::npos)
      << r.output;
  std::ifstream in(dir + "/v.stage1.json");
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(json.find("\"name\": \"B3.1\""), std::string::npos);
  r = train(2, 2, 2, {"--pipeline-trace", dir + "/c", "--chunkpipe-chunk-size", "16"}, "trace-c");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ChunkPipe ideal (p - 1) / (n + p - 1) = 0.111111 for p 2, n 8 chunks"), std::string::npos)
      << r.output;
}

TEST(PipelineParallelTrace, WithoutPipelineIsAConfigurationError) {
  auto r = run_command({bin("loongforge-train"), "--config-file", lf::testing::source_dir() + "/configs/demo.yaml",
                        "--pipeline-trace", "/tmp/never", "--dry-run"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.pipeline_trace is set but parallel.pipeline_model_parallel_size is 1"),
            std::string::npos)
      << r.output;
}

// Layout clashes are configuration errors found before any process group exists, so --dry-run
// reports them too, naming both values.
TEST(PipelineParallelErrors, LayersNotDivisibleNameTheValues) {
  for (bool dry : {true, false}) {
    std::vector<std::string> a;
    if (dry) a.push_back("--dry-run");
    auto r = train(2, 2, 3, a, dry ? "odd-dry" : "odd");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("model.foundation.num_layers 3 is not divisible by "
                            "parallel.pipeline_model_parallel_size 2"),
              std::string::npos)
        << r.output;
  }
  auto r = train(2, 2, 4, {"--dry-run", "--decoder-first-pipeline-num-layers", "5"}, "first5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("decoder_first_pipeline_num_layers 5"), std::string::npos) << r.output;
  // Virtual stages: 6 layers cannot make chunks of 2 on each of 2 stages evenly (needs 4 | 6).
  r = train(2, 2, 6, {"--dry-run", "--num-layers-per-virtual-pipeline-stage", "2"}, "virt6");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model.foundation.num_layers 6 is not divisible by parallel.pipeline_model_parallel_size "
                          "2 x parallel.num_layers_per_virtual_pipeline_stage 2 = 4"),
            std::string::npos)
      << r.output;
  // The interleaved schedule needs the micro-batch count (global 2 / micro 2 = 1) a multiple of pp.
  r = train(2, 2, 4, {"--dry-run", "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "2"},
            "virt-mb");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("needs the number of micro-batches (1) to be a multiple of "
                          "parallel.pipeline_model_parallel_size 2"),
            std::string::npos)
      << r.output;
}

}  // namespace

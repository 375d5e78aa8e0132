// loongforge-train with --context-parallel-size: 10 steps of the demo model (fp32, deterministic)
// at CP 2 and 4 with ring (p2p) and Ulysses (a2a) attention, CP 2 x TP 2 with sequence
// parallelism, CP 2 x PP 2, CP 2 x DP 2 with ZeRO-1 and overlapped reduction, and packed documents
// (--reset-position-ids --reset-attention-mask on a corpus of short documents), and MLA under CP 2 x
// TP 2 + SP (ring, Ulysses, ChunkPipe) each train the same
// model as one process; a CP 2 checkpoint resumes at CP 1; layouts CP cannot run are configuration
// errors naming the key; --dry-run's activations per CP rank. (MoE under CP: test_moe_program.cpp;
// the VLMs: test_model_layer_program.cpp.) Tolerances: pp_training.h's (1e-5 loss and parameters, fp32: the same
// products summed in another order).
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>

#include "pp_training.h"

namespace {
using lf::testing::bin;
using lf::testing::expect_same_training;
using lf::testing::run_command;
using lf::testing::train;

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<std::string> kCp2 = {"--context-parallel-size", "2"};
const std::vector<std::string> kCp4 = {"--context-parallel-size", "4"};
const std::vector<std::string> kA2a = {"--cp-comm-type", "a2a"};

// A CP run that says it ran context-parallel (the equivalence alone would not show a flag ignored).
lf::testing::TrainRun cp_run(int procs, int pp, std::vector<std::string> extra, const std::string& tag) {
  auto r = train(procs, pp, 2, extra, tag);
  const auto size = std::find(extra.begin(), extra.end(), "--context-parallel-size");
  const auto type = std::find(extra.begin(), extra.end(), "--cp-comm-type");
  if (size != extra.end() && r.exit_code == 0) {
    const std::string want = ", cp " + *(size + 1) + " (" + (type == extra.end() ? "p2p" : *(type + 1)) + ")";
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  }
  return r;
}

const lf::testing::TrainRun& one_process() {
  static const auto r = train(1, 1, 2, {}, "cp1");
  return r;
}

TEST(CpProgram, RingCp2EqualsOneProcess) {
  expect_same_training(one_process(), cp_run(2, 1, kCp2, "cp2-p2p"), "CP 2, ring attention");
}

TEST(CpProgram, UlyssesCp2EqualsOneProcess) {
  expect_same_training(one_process(), cp_run(2, 1, with(kCp2, kA2a), "cp2-a2a"), "CP 2, Ulysses");
}

// CP 4: 8 chunks of 16 tokens; Ulysses repeats the model's 2 key/value heads to its 4 query heads.
TEST(CpProgram, RingAndUlyssesCp4EqualOneProcess) {
  expect_same_training(one_process(), cp_run(4, 1, kCp4, "cp4-p2p"), "CP 4, ring attention");
  expect_same_training(one_process(), cp_run(4, 1, with(kCp4, kA2a), "cp4-a2a"), "CP 4, Ulysses");
}

TEST(CpProgram, Cp2WithTp2AndSequenceParallelEqualsOneProcess) {
  const std::vector<std::string> tp = {"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  expect_same_training(one_process(), cp_run(4, 1, with(kCp2, tp), "cp2-tp2"), "CP 2 x TP 2 + SP, ring");
  expect_same_training(one_process(), cp_run(4, 1, with(with(kCp2, tp), kA2a), "cp2-tp2-a2a"),
                       "CP 2 x TP 2 + SP, Ulysses (1 key/value head per TP rank, repeated)");
}

TEST(CpProgram, Cp2WithPp2EqualsOneProcess) {
  expect_same_training(one_process(), cp_run(4, 2, kCp2, "cp2-pp2"), "CP 2 x PP 2, ring");
}

// The gradients are reduced over dp x cp, ZeRO-1 shards the optimizer over the 4 ranks.
TEST(CpProgram, Cp2WithDp2Zero1AndOverlappedReductionEqualsOneProcess) {
  expect_same_training(one_process(),
                       cp_run(4, 1,
                             with(kCp2, {"--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size",
                                         "20000"}),
                             "cp2-dp2"),
                       "CP 2 x DP 2, ZeRO-1, overlapped reduction");
}

// Packed documents: each document attends within itself and restarts its positions; under CP the
// document boundaries fall anywhere in the chunks.
TEST(CpProgram, PackedDocumentsUnderCpEqualOneProcess) {
  const std::vector<std::string> corpus = {"data.mock_data=false", "--data-path", lf::testing::demo_corpus(),
                                           "--tokenizer-type", "ByteTokenizer", "model.foundation.vocab_size=257",
                                           "--seq-length", "64", "--split", "100,0,0", "--reset-position-ids",
                                           "--reset-attention-mask", "--eod-mask-loss"};
  const auto one = cp_run(1, 1, corpus, "cp1-docs");
  expect_same_training(one, cp_run(2, 1, with(corpus, kCp2), "cp2-docs"), "packed documents, CP 2, ring");
  expect_same_training(one, cp_run(4, 1, with(with(corpus, kCp4), kA2a), "cp4-docs-a2a"),
                       "packed documents, CP 4, Ulysses");
}

// ChunkPipe under CP: each 16-token chunk split over the CP ranks (4-token pieces), its keys and
// values all-gathered, the prefix kept on every rank; with PP 2 the chunks flow through the stages.
TEST(CpProgram, ChunkPipeWithCpEqualsOneProcess) {
  const std::vector<std::string> chunks = {"--chunkpipe-chunk-size", "16"};
  expect_same_training(one_process(), cp_run(2, 1, with(kCp2, chunks), "cp2-chunkpipe"), "ChunkPipe (8 chunks) x CP 2");
  expect_same_training(one_process(), cp_run(4, 2, with(kCp2, chunks), "cp2-pp2-chunkpipe"),
                       "ChunkPipe (8 chunks) x CP 2 x PP 2");
}

// Multi-latent attention (DeepSeek) under CP 2 x TP 2 + SP: the latents are whole on every TP rank
// (their output gradients summed over TP where they enter this rank's heads), the value heads
// narrower than the keys; ring, Ulysses, and ChunkPipe over CP; with and without a query latent.
std::vector<std::string> mla(bool q_latent) {
  return {"--multi-latent-attention", "--q-lora-rank", q_latent ? "32" : "0", "--kv-lora-rank", "16", "--qk-head-dim",
          "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "8"};
}
TEST(CpProgram, MlaUnderCp2WithTp2AndSequenceParallelEqualsOneProcess) {
  const auto cp_tp = with(kCp2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"});
  const auto one = train(1, 1, 2, mla(true), "mla-cp1");
  expect_same_training(one, cp_run(4, 1, with(cp_tp, mla(true)), "mla-cp2-tp2"), "MLA, CP 2 x TP 2 + SP, ring");
  expect_same_training(one, cp_run(4, 1, with(with(cp_tp, kA2a), mla(true)), "mla-cp2-tp2-a2a"),
                       "MLA, CP 2 x TP 2 + SP, Ulysses");
  expect_same_training(one, cp_run(4, 1, with(with(cp_tp, {"--chunkpipe-chunk-size", "16"}), mla(true)), "mla-chunkpipe"),
                       "MLA, ChunkPipe (8 chunks) x CP 2 x TP 2 + SP");
  expect_same_training(train(1, 1, 2, mla(false), "mla-noq-cp1"), cp_run(4, 1, with(cp_tp, mla(false)), "mla-noq-cp2-tp2"),
                       "MLA without a query latent, CP 2 x TP 2 + SP, ring");
}

// A CP 2 run with ZeRO-1 saved after 5 steps continues at CP 1 as the uninterrupted run.
TEST(CpProgram, Cp2CheckpointResumesAtCp1) {
  const std::string ckpt = lf::testing::make_temp_dir("cp-ckpt");
  auto first = cp_run(2, 1,
                     with(kCp2, {"--use-distributed-optimizer", "--save", ckpt, "--save-interval", "5",
                                 "--exit-interval", "5"}),
                     "cp2-save");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = train(1, 1, 2, {"--load", ckpt}, "cp1-resume");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const auto& want = one_process();
  ASSERT_EQ(second.losses.size(), 5u) << second.output;
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(second.losses[i], want.losses[i + 5], 1e-5 * want.losses[i + 5]) << "step " << i + 6;
  EXPECT_LE(lf::testing::max_abs_diff(want.params, second.params), 1e-5);
}

TEST(CpProgram, LayoutsCpCannotRunAreConfigurationErrors) {
  // procs > 1: launched (the checks that need the layout run on every rank).
  auto dry = [](std::vector<std::string> extra, const std::string& config = "demo.yaml", int procs = 1) {
    std::vector<std::string> argv;
    if (procs > 1) argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
    argv.insert(argv.end(), {bin("loongforge-train"), "--config-file", lf::testing::source_dir() + "/configs/" + config,
                             "--dry-run"});
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_command(argv, {{"OMP_NUM_THREADS", "1"}});
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--cp-comm-type", "a2a"}, "parallel.cp_comm_type"},  // no context parallelism to configure
      {{"--context-parallel-size", "2", "--seq-length", "102"}, "training.seq_length"},  // not 4 equal chunks
      // 12 tokens make 4 chunks, but a CP rank's 6 do not split over TP 4.
      {{"--context-parallel-size", "2", "--tensor-model-parallel-size", "4", "--sequence-parallel", "--seq-length",
        "12"},
       "training.seq_length"},
      {{"--context-parallel-size", "2", "--cp-comm-type", "ring"}, "parallel.cp_comm_type"},
      // ChunkPipe under CP: chunks of 2 x cp pieces; the chunks' keys/values are gathered, no comm type to choose.
      {{"--context-parallel-size", "2", "--chunkpipe-chunk-size", "6", "--seq-length", "96"},
       "parallel.chunkpipe_chunk_size"},
      {{"--context-parallel-size", "2", "--chunkpipe-chunk-size", "16", "--cp-comm-type", "a2a"},
       "parallel.cp_comm_type"},
  };
  for (const auto& [extra, key] : cases) {
    auto r = dry(extra);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(key), std::string::npos) << key << "\n" << r.output;
  }
  // Ulysses with one attention head: nothing to split over 2 ranks.
  auto heads = dry({"--context-parallel-size", "2", "--cp-comm-type", "a2a", "model.foundation.num_attention_heads=1",
                    "model.foundation.num_query_groups=1"},
                   "demo.yaml", 2);
  EXPECT_NE(heads.exit_code, 0) << heads.output;
  EXPECT_NE(heads.output.find("parallel.cp_comm_type"), std::string::npos) << heads.output;
  auto mtp = dry({"--context-parallel-size", "2", "--mtp-num-layers", "1"}, "demo.yaml", 2);
  EXPECT_NE(mtp.exit_code, 0) << mtp.output;
  EXPECT_NE(mtp.output.find("parallel.context_parallel_size"), std::string::npos) << mtp.output;
  // A valid layout is shown, with the communication type.
  auto ok = dry({"--context-parallel-size", "2", "--cp-comm-type", "a2a"}, "demo.yaml", 2);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("cp_comm_type: a2a"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("cp 2"), std::string::npos) << ok.output;
  // Activations per rank: a CP rank holds half the tokens (64 of 128), so half the activations;
  // full recomputation keeps the layer inputs and one recomputed layer.
  auto bytes = [](const std::string& out) {
    std::smatch m;
    if (!std::regex_search(out, m, std::regex("activations +([0-9.]+) (B|KiB|MiB|GiB)"))) return -1.0;
    const double unit = m[2] == "B" ? 1 : m[2] == "KiB" ? 1024 : m[2] == "MiB" ? 1048576 : 1073741824.0;
    return std::stod(m[1]) * unit;
  };
  auto one = dry({});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NEAR(bytes(ok.output) / bytes(one.output), 0.5, 0.01) << one.output << ok.output;
  EXPECT_NE(ok.output.find("64 tokens per CP rank"), std::string::npos) << ok.output;
  auto recompute = dry({"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"});
  ASSERT_EQ(recompute.exit_code, 0) << recompute.output;
  EXPECT_NE(recompute.output.find("full recomputation"), std::string::npos) << recompute.output;
  // 2 layer inputs (128 x 2 x 64 fp32) + one layer's activations, against two layers' activations.
  EXPECT_NEAR(bytes(recompute.output) / bytes(one.output), (2 * 65536.0 + 1114112) / (2 * 1114112), 0.01)
      << recompute.output;
}

}  // namespace

// Fine-tuning end to end with loongforge-train / loongforge-run on the tiny demo model:
//  - LoRA (all seven PEFT modules): the base stays bit-identical, the adapters train, and TP = 2
//    (with and without SP), DP = 2 with ZeRO-1 and PP = 2 equal the single process;
//  - LoRA checkpoints hold the adapters only, name their base, resume exactly, and refuse a base
//    whose weights changed, a run without the adapters, a save without a base;
//  - SFT (--training-phase sft) over a conversations store with uneven answer lengths: DP = 2
//    equals one process; configuration mistakes are refused with the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include "loongforge/data/indexed_dataset.h"
#include "multiprocess.h"
#include "program_testing.h"

namespace {
namespace fs = std::filesystem;
using lf::testing::bin;
using lf::testing::read_params;

using TrainRun = lf::testing::MetricsRun;

TrainRun train(int procs, const std::string& dir, std::vector<std::string> extra, int iters) {
  std::vector<std::string> t = {"--config-file", lf::testing::source_dir() + "/configs/demo.yaml", "--train-iters",
                                std::to_string(iters), "--micro-batch-size", "2", "--global-batch-size", "8",
                                "--seq-length", "32", "--eval-iters", "0", "--lr", "1e-2", "--lr-warmup-iters", "1",
                                "--data-cache-path", fs::path(dir).parent_path().string() + "/cache",
                                "--deterministic-mode"};
  t.insert(t.end(), extra.begin(), extra.end());
  return lf::testing::run_training(procs, dir, t, "loss|grad_norm|iteration");
}

const auto& dumped = lf::testing::read_dumped_params;

bool is_adapter(const std::string& name) { return name.find(".lora_") != std::string::npos; }

// fp32 sums in another order (TP reductions, DP all-reduce, pipeline stages) differ by ~1e-7
// relative per step; 1e-5 over 6 Adam steps catches a missing TP reduction of an adapter's
// gradient (a factor of 2 on A or B) or an adapter applied to the wrong heads.
void expect_equivalent(const TrainRun& ref, const TrainRun& run, const std::string& what) {
  ASSERT_EQ(run.exit_code, 0) << what << "\n" << run.output;
  ASSERT_EQ(run.steps.size(), ref.steps.size()) << what;
  for (size_t i = 0; i < ref.steps.size(); ++i) {
    const double want = ref.steps[i].at("loss");
    EXPECT_NEAR(run.steps[i].at("loss"), want, 1e-5 * std::abs(want)) << what << " step " << i + 1;
  }
  const double diff = lf::testing::max_abs_diff(dumped(ref.params_path), dumped(run.params_path));
  EXPECT_LE(diff, 1e-5) << what << ": final parameters";
  std::printf("[lora equivalence] %s: final parameters max |diff| %.3g\n", what.c_str(), diff);
}

const std::vector<std::string> kLora = {"--lora-rank", "4", "--lora-alpha", "8", "--lora-target-modules", "all-linear"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(LoraTraining, BaseStaysFrozenAndLayoutsEqualOneProcess) {
  const std::string d = lf::testing::make_temp_dir("lora_layouts");
  const TrainRun base = train(1, d + "/base", {"--save", d + "/base_ckpt"}, 3);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  const auto lora = with(kLora, {"--pretrained-checkpoint", d + "/base_ckpt"});
  const TrainRun one = train(1, d + "/one", lora, 6);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("LoRA base weights from"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("gradients: 1 group(s)"), std::string::npos) << one.output;  // adapters only
  // The base is bit-identical to the checkpoint it came from; every adapter B moved from zero.
  const auto b = dumped(base.params_path), p = dumped(one.params_path);
  size_t adapters = 0;
  for (const auto& [name, v] : p) {
    if (is_adapter(name)) {
      ++adapters;
      if (name.find("lora_B") == std::string::npos) continue;
      double moved = 0;
      for (float x : v) moved += std::abs(x);
      EXPECT_GT(moved, 0) << name;
      continue;
    }
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(b.at(name) == v) << name << " changed under LoRA";
  }
  EXPECT_EQ(adapters, 2u * 7u * 2u);  // 2 layers x 7 modules x (A, B)
  expect_equivalent(one, train(2, d + "/tp2sp", with(lora, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}), 6),
                    "TP=2 + SP");
  expect_equivalent(one, train(2, d + "/tp2", with(lora, {"--tensor-model-parallel-size", "2"}), 6), "TP=2");
  expect_equivalent(one, train(2, d + "/dp2", with(lora, {"--use-distributed-optimizer"}), 6), "DP=2 + ZeRO-1");
  expect_equivalent(one, train(2, d + "/pp2", with(lora, {"--pipeline-model-parallel-size", "2"}), 6), "PP=2");
}

TEST(LoraTraining, CheckpointsHoldTheAdaptersNameTheirBaseAndResumeExactly) {
  const std::string d = lf::testing::make_temp_dir("lora_resume");
  ASSERT_EQ(train(1, d + "/base", {"--save", d + "/base_ckpt"}, 3).exit_code, 0);
  const auto lora = with(kLora, {"--pretrained-checkpoint", d + "/base_ckpt"});
  const TrainRun straight = train(1, d + "/straight", with(lora, {"--save", d + "/s"}), 6);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const TrainRun first =
      train(1, d + "/first", with(lora, {"--save", d + "/r", "--load", d + "/r", "--exit-interval", "3"}), 6);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string it3 = d + "/r/iter_0000003";
  EXPECT_TRUE(fs::exists(it3 + "/model_lora_tp0_pp0.safetensors"));
  EXPECT_FALSE(fs::exists(it3 + "/model_tp0_pp0.safetensors")) << "a LoRA checkpoint stored its base";
  const std::string state = lf::testing::read_file(it3 + "/state.json");
  EXPECT_NE(state.find("\"base\""), std::string::npos) << state;
  EXPECT_NE(state.find("base_ckpt/iter_0000003"), std::string::npos) << state;
  const TrainRun second = train(1, d + "/second", with(lora, {"--save", d + "/r", "--load", d + "/r"}), 6);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_EQ(second.lines.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(second.lines[i], straight.lines[i + 3]) << "iteration " << i + 4;
  EXPECT_TRUE(lf::testing::read_file(straight.params_path) == lf::testing::read_file(second.params_path))
      << "final parameters differ";

  // Resuming without the adapters, or on a base whose weights changed, or saving adapters with no
  // base: refused with what to do.
  TrainRun plain = train(1, d + "/plain", {"--load", d + "/r"}, 6);
  EXPECT_NE(plain.exit_code, 0);
  EXPECT_NE(plain.output.find("holds LoRA adapters"), std::string::npos) << plain.output;
  TrainRun full = train(1, d + "/full", with(kLora, {"--load", d + "/base_ckpt"}), 4);
  EXPECT_NE(full.exit_code, 0);
  EXPECT_NE(full.output.find("full checkpoint without LoRA adapters"), std::string::npos) << full.output;
  TrainRun nobase = train(1, d + "/nobase", with(kLora, {"--save", d + "/nb"}), 2);
  EXPECT_NE(nobase.exit_code, 0);
  EXPECT_NE(nobase.output.find("no base checkpoint"), std::string::npos) << nobase.output;
  {
    std::ofstream m(d + "/base_ckpt/iter_0000003/manifest.json", std::ios::app);
    m << " ";
  }
  TrainRun changed = train(1, d + "/changed", with(lora, {"--load", d + "/r"}), 6);
  EXPECT_NE(changed.exit_code, 0);
  EXPECT_NE(changed.output.find("now holds different weights"), std::string::npos) << changed.output;
}

// A conversations store with uneven prompt and answer lengths (1 or 2 turns), as preprocess
// --conversations writes it.
std::string write_sft_store(const std::string& dir) {
  const std::string prefix = dir + "/conv";
  lf::data::IndexedDatasetBuilder tb(prefix + "_input_ids_document", lf::data::TokenDType::u16, 256),
      mb(prefix + "_assistant_masks_document", lf::data::TokenDType::u8, 2);
  std::mt19937 rng(5);
  for (int c = 0; c < 40; ++c) {
    std::vector<int32_t> t, m;
    for (int k = 0; k < 1 + c % 2; ++k) {
      const int prompt = 2 + static_cast<int>(rng() % 10), answer = 1 + static_cast<int>(rng() % 12);
      for (int i = 0; i < prompt; ++i) t.push_back(static_cast<int32_t>(rng() % 256)), m.push_back(0);
      for (int i = 0; i < answer; ++i) t.push_back(static_cast<int32_t>(rng() % 16)), m.push_back(1);
    }
    tb.add_document(t, std::vector<int32_t>{static_cast<int32_t>(t.size())});
    mb.add_document(m, std::vector<int32_t>{static_cast<int32_t>(m.size())});
  }
  tb.finalize();
  mb.finalize();
  return prefix;
}

TEST(SftTraining, DataParallelEqualsOneProcessOnUnevenAnswers) {
  const std::string d = lf::testing::make_temp_dir("sft_dp");
  const std::string prefix = write_sft_store(d);
  const std::vector<std::string> sft = {"--training-phase", "sft", "--data-path", prefix, "--split", "100,0,0",
                                        "data.mock_data=false"};
  const TrainRun one = train(1, d + "/one", sft, 6);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("SFT data"), std::string::npos) << one.output;
  EXPECT_LT(one.steps.back().at("loss"), one.steps.front().at("loss"));  // the answers are learnable
  expect_equivalent(one, train(2, d + "/dp2", sft, 6), "SFT DP=2");
  expect_equivalent(one, train(2, d + "/dp2z", with(sft, {"--use-distributed-optimizer"}), 6), "SFT DP=2 + ZeRO-1");
  expect_equivalent(one, train(2, d + "/pp2", with(sft, {"--pipeline-model-parallel-size", "2"}), 6), "SFT PP=2");
  // Packed conversations (several per row, attention per conversation): DP = 2 equals one process.
  const TrainRun packed = train(1, d + "/packed", with(sft, {"--packing-sft-data", "--seq-length", "64"}), 6);
  ASSERT_EQ(packed.exit_code, 0) << packed.output;
  EXPECT_NE(packed.output.find("packed into rows of 64"), std::string::npos) << packed.output;
  EXPECT_LT(packed.steps.back().at("loss"), packed.steps.front().at("loss"));
  expect_equivalent(packed, train(2, d + "/packed_dp2", with(sft, {"--packing-sft-data", "--seq-length", "64"}), 6),
                    "SFT packed DP=2");
  // SFT with LoRA on top.
  const TrainRun lora = train(1, d + "/lora", with(sft, kLora), 4);
  ASSERT_EQ(lora.exit_code, 0) << lora.output;
}

TEST(FinetuneConfig, MistakesAreRefusedWithTheKey) {
  const std::string d = lf::testing::make_temp_dir("ft_config");
  auto refused = [&](std::vector<std::string> extra, const std::string& want) {
    extra.push_back("--dry-run");
    TrainRun r = train(1, d + "/x", extra, 2);
    EXPECT_NE(r.exit_code, 0) << want;
    EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
  };
  refused({"--lora-rank", "4", "--lora-target-modules", "qkv"}, "unknown LoRA target module 'qkv'");
  refused({"--lora-alpha", "16"}, "lora.alpha is set but lora.rank is 0");
  refused({"--lora-rank", "4", "--save-hf", d + "/hf"}, "checkpoint.save_hf");
  refused({"--packing-sft-data"}, "not an SFT run");
  refused({"--training-phase", "sft"}, "mock data has none");
  // --dry-run shows the adapters and that only they carry gradients and optimizer state.
  TrainRun dry = train(1, d + "/dry", with(kLora, {"--dry-run"}), 2);
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("LoRA adapters"), std::string::npos) << dry.output;
  EXPECT_NE(dry.output.find("adapters only"), std::string::npos) << dry.output;
  // The example job of docs/finetuning.md composes, and its adapters are PEFT's count for
  // Qwen3-0.6B at r 16 on all seven projections (print_trainable_parameters: 10,092,544).
  auto example = lf::testing::run_command({bin("loongforge-train"), "--config-file",
                                           lf::testing::source_dir() + "/configs/examples/sft_lora_qwen3.yaml",
                                           "--dry-run", "~data.tokenizer_type", "~data.tokenizer_model"},
                                          {}, std::chrono::seconds(120));
  EXPECT_EQ(example.exit_code, 0) << example.output;
  EXPECT_NE(example.output.find("LoRA adapters   10092544 parameters"), std::string::npos) << example.output;
}

}  // namespace

namespace {

std::string python() { return lf::testing::source_dir() + "/.venv/bin/python"; }
std::string oracle() { return lf::testing::source_dir() + "/tests/tools/lora_oracle.py"; }
const char* kIds = "5,17,200,3,99,42,7,130,64,1";

std::vector<float> read_logits(const std::string& path) {
  auto p = read_params(path);
  EXPECT_TRUE(p.count("logits")) << path;
  return p["logits"];
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

lf::testing::RankResult run(const std::vector<std::string>& argv) {
  return lf::testing::run_command(argv, {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
}

// A base model trained for a few steps, exported to HF (fp32): the base of the PEFT tests.
struct Base {
  std::string dir, ckpt, hf;
};
const Base& base_model() {
  static const Base b = [] {
    Base b;
    b.dir = lf::testing::make_temp_dir("lora_peft");
    b.ckpt = b.dir + "/base_ckpt";
    b.hf = b.dir + "/base_hf";
    TrainRun r = train(1, b.dir + "/base", {"--save", b.ckpt}, 3);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    auto c = run({bin("loongforge-convert"), "lf2hf", "--load", b.ckpt, "--out", b.hf, "--dtype", "fp32"});
    EXPECT_EQ(c.exit_code, 0) << c.output;
    return b;
  }();
  return b;
}

// loongforge-generate --lora-adapter applies PEFT adapters as PeftModel does: all seven modules,
// rsLoRA, and a subset (fp32 logits max |diff| <= 1e-4: the same math in another summation order,
// ~1e-6 here).
TEST(LoraPeft, AdapterLogitsEqualPeftModel) {
  const Base& b = base_model();
  struct Case {
    const char* name;
    const char* targets;
    const char* r;
    const char* alpha;
    const char* rslora;
  };
  for (const Case& c : {Case{"plain", "all-linear", "4", "8", "0"}, Case{"rslora", "all-linear", "8", "16", "1"},
                        Case{"subset", "q_proj,v_proj", "2", "4", "0"}}) {
    const std::string adapter = b.dir + "/peft_" + c.name;
    auto made = run({python(), oracle(), "make", b.hf, adapter, c.targets, c.r, c.alpha, c.rslora, "3"});
    ASSERT_EQ(made.exit_code, 0) << made.output;
    auto want = run({python(), oracle(), "logits", b.hf, adapter, kIds, adapter + "/want.safetensors"});
    ASSERT_EQ(want.exit_code, 0) << want.output;
    auto got = run({bin("loongforge-generate"), "--load", b.hf, "--lora-adapter", adapter, "--input-ids", kIds,
                    "--dump-logits", adapter + "/got.safetensors"});
    ASSERT_EQ(got.exit_code, 0) << got.output;
    const double d = max_diff(read_logits(adapter + "/want.safetensors"), read_logits(adapter + "/got.safetensors"));
    EXPECT_LE(d, 1e-4) << c.name;
    std::printf("[peft parity] %s: logits max |diff| %.3g\n", c.name, d);
    // The same adapter on the native checkpoint of the base.
    auto native = run({bin("loongforge-generate"), "--load", b.ckpt, "--lora-adapter", adapter, "--input-ids", kIds,
                       "--dump-logits", adapter + "/native.safetensors"});
    ASSERT_EQ(native.exit_code, 0) << native.output;
    EXPECT_LE(max_diff(read_logits(adapter + "/want.safetensors"), read_logits(adapter + "/native.safetensors")), 1e-4);
  }
  // Adapters are not a no-op: the base alone differs.
  auto plain = run({python(), oracle(), "logits", b.hf, "-", kIds, b.dir + "/base.safetensors"});
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_GT(max_diff(read_logits(b.dir + "/base.safetensors"), read_logits(b.dir + "/peft_plain/want.safetensors")), 1e-3);
}

// The same parity on the other families' layers: Qwen3 (per-head QK norms after q/k_proj: the
// adapters act before them) and Qwen2 (QKV biases: the adapters add to the biased projection).
TEST(LoraPeft, AdapterLogitsEqualPeftModelOnQwen3AndQwen2Layers) {
  const std::string d = lf::testing::make_temp_dir("lora_peft_families");
  for (const auto& [family, flag] : std::vector<std::pair<std::string, std::string>>{
           {"qwen3", "++model.foundation.qk_layernorm=true"}, {"qwen2", "++model.foundation.add_qkv_bias=true"}}) {
    const std::string dir = d + "/" + family;
    TrainRun base = train(1, dir + "/base", {flag, "--save", dir + "/ckpt"}, 3);
    ASSERT_EQ(base.exit_code, 0) << base.output;
    auto conv = run({bin("loongforge-convert"), "lf2hf", "--load", dir + "/ckpt", "--out", dir + "/hf", "--dtype", "fp32"});
    ASSERT_EQ(conv.exit_code, 0) << conv.output;
    ASSERT_NE(lf::testing::read_file(dir + "/hf/config.json").find("\"model_type\": \"" + family + "\""), std::string::npos)
        << lf::testing::read_file(dir + "/hf/config.json");
    auto made = run({python(), oracle(), "make", dir + "/hf", dir + "/adapter", "all-linear", "4", "8", "0", "5"});
    ASSERT_EQ(made.exit_code, 0) << made.output;
    auto want = run({python(), oracle(), "logits", dir + "/hf", dir + "/adapter", kIds, dir + "/want.safetensors"});
    ASSERT_EQ(want.exit_code, 0) << want.output;
    auto got = run({bin("loongforge-generate"), "--load", dir + "/hf", "--lora-adapter", dir + "/adapter", "--input-ids",
                    kIds, "--dump-logits", dir + "/got.safetensors"});
    ASSERT_EQ(got.exit_code, 0) << got.output;
    const double diff = max_diff(read_logits(dir + "/want.safetensors"), read_logits(dir + "/got.safetensors"));
    EXPECT_LE(diff, 1e-4) << family;
    std::printf("[peft parity] %s layers: logits max |diff| %.3g\n", family.c_str(), diff);
  }
}

// --pretrained-checkpoint takes an HF directory too (full fine-tuning: the same start as --load of
// it); LoRA refuses one, naming the conversion (its checkpoints name a native base).
TEST(LoraPeft, PretrainedHfDirectoryFineTunesOrIsRefusedForLora) {
  const Base& b = base_model();
  const std::string d = b.dir + "/pretrained_hf";
  const TrainRun via_pretrained = train(1, d + "/a", {"--pretrained-checkpoint", b.hf}, 2);
  ASSERT_EQ(via_pretrained.exit_code, 0) << via_pretrained.output;
  EXPECT_NE(via_pretrained.output.find("fine-tuning from the HF weights"), std::string::npos) << via_pretrained.output;
  const TrainRun via_load = train(1, d + "/b", {"--load", b.hf}, 2);
  ASSERT_EQ(via_load.exit_code, 0) << via_load.output;
  EXPECT_EQ(via_pretrained.lines, via_load.lines);
  const TrainRun lora = train(1, d + "/c", with(kLora, {"--pretrained-checkpoint", b.hf}), 2);
  EXPECT_NE(lora.exit_code, 0);
  EXPECT_NE(lora.output.find("loongforge-convert hf2lf"), std::string::npos) << lora.output;
}

// A LoRA run exported by lf2hf: the base HF directory plus OUT/adapter/ in PEFT's format, which
// transformers + peft load with the logits loongforge-generate gives for the run's checkpoint;
// --merge-lora writes merged weights with the same logits.
TEST(LoraPeft, TrainedAdapterExportsToPeftAndMerges) {
  const Base& b = base_model();
  const std::string d = b.dir + "/export";
  TrainRun r = train(1, d + "/run", with(kLora, {"--pretrained-checkpoint", b.ckpt, "--save", d + "/lora_ckpt",
                                            "--use-rslora"}), 4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto conv = run({bin("loongforge-convert"), "lf2hf", "--load", d + "/lora_ckpt", "--out", d + "/hf", "--dtype", "fp32"});
  ASSERT_EQ(conv.exit_code, 0) << conv.output;
  ASSERT_TRUE(fs::exists(d + "/hf/adapter/adapter_config.json"));
  auto native = run({bin("loongforge-generate"), "--load", d + "/lora_ckpt", "--input-ids", kIds, "--dump-logits",
                     d + "/native.safetensors"});
  ASSERT_EQ(native.exit_code, 0) << native.output;
  auto peft = run({python(), oracle(), "logits", d + "/hf", d + "/hf/adapter", kIds, d + "/peft.safetensors"});
  ASSERT_EQ(peft.exit_code, 0) << peft.output;
  const auto want = read_logits(d + "/peft.safetensors");
  EXPECT_LE(max_diff(want, read_logits(d + "/native.safetensors")), 1e-4);
  auto merged = run({bin("loongforge-convert"), "lf2hf", "--load", d + "/lora_ckpt", "--out", d + "/merged",
                     "--dtype", "fp32", "--merge-lora"});
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  EXPECT_FALSE(fs::exists(d + "/merged/adapter"));
  auto m = run({python(), oracle(), "logits", d + "/merged", "-", kIds, d + "/merged.safetensors"});
  ASSERT_EQ(m.exit_code, 0) << m.output;
  EXPECT_LE(max_diff(want, read_logits(d + "/merged.safetensors")), 1e-4);
  // The adapters moved the model away from its base.
  auto base_logits = run({python(), oracle(), "logits", d + "/hf", "-", kIds, d + "/base.safetensors"});
  ASSERT_EQ(base_logits.exit_code, 0) << base_logits.output;
  EXPECT_GT(max_diff(want, read_logits(d + "/base.safetensors")), 1e-3);
}

}  // namespace

namespace {

// docs/finetuning.md's flow end to end on tiny pieces: a conversations file rendered with a real
// chat template (Qwen3's, tests/data/chat_template_oracle.py's tokenizer) into an SFT store by
// `preprocess --conversations`, LoRA SFT on a base checkpoint, lf2hf to base + PEFT adapter, which
// transformers + peft load with the logits loongforge-generate gives.
TEST(FinetuneFlow, ConversationsToAPeftAdapter) {
  const std::string d = lf::testing::make_temp_dir("ft_flow");
  auto tok = run({python(), lf::testing::source_dir() + "/tests/data/chat_template_oracle.py", d + "/tok"});
  ASSERT_EQ(tok.exit_code, 0) << tok.output;
  auto pre = run({bin("loongforge-data"), "preprocess", "--conversations", "--tokenizer-model", d + "/tok/qwen3",
                  "--input", d + "/tok/conversations_qwen.jsonl", "--output-prefix", d + "/chats"});
  ASSERT_EQ(pre.exit_code, 0) << pre.output;
  const std::vector<std::string> model = {"model.foundation.vocab_size=1280", "--seq-length", "96"};
  ASSERT_EQ(train(1, d + "/base", with(model, {"--save", d + "/base_ckpt"}), 2).exit_code, 0);
  const TrainRun sft = train(1, d + "/sft",
                             with(with(model, kLora), {"--training-phase", "sft", "--data-path", d + "/chats", "--split",
                                                       "100,0,0", "data.mock_data=false", "--tokenizer-type",
                                                       "HuggingFaceTokenizer", "--tokenizer-model", d + "/tok/qwen3",
                                                       "--pretrained-checkpoint", d + "/base_ckpt", "--save",
                                                       d + "/lora_ckpt"}),
                             4);
  ASSERT_EQ(sft.exit_code, 0) << sft.output;
  EXPECT_NE(sft.output.find("SFT data"), std::string::npos) << sft.output;
  auto conv = run({bin("loongforge-convert"), "lf2hf", "--load", d + "/lora_ckpt", "--out", d + "/hf", "--dtype", "fp32"});
  ASSERT_EQ(conv.exit_code, 0) << conv.output;
  auto native = run({bin("loongforge-generate"), "--load", d + "/lora_ckpt", "--input-ids", kIds, "--dump-logits",
                     d + "/native.safetensors"});
  ASSERT_EQ(native.exit_code, 0) << native.output;
  auto peft = run({python(), oracle(), "logits", d + "/hf", d + "/hf/adapter", kIds, d + "/peft.safetensors"});
  ASSERT_EQ(peft.exit_code, 0) << peft.output;
  EXPECT_LE(max_diff(read_logits(d + "/peft.safetensors"), read_logits(d + "/native.safetensors")), 1e-4);
}

}  // namespace

// loongforge-generate as a user runs it, on a checkpoint loongforge-train just wrote: its logits
// and greedy tokens equal transformers' on the same weights (exported with loongforge-convert
// lf2hf), native and HF loading agree, the KV cache changes nothing, exact-match scoring counts
// right, and mistakes are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include "loongforge/core/safetensors.h"
#include "multiprocess.h"
#include "program_testing.h"

namespace {
using lf::testing::bin;
using lf::testing::run_command;

std::string python() { return lf::testing::source_dir() + "/.venv/bin/python"; }

// A tiny model trained for a few steps and saved, shared by the tests of this file.
const std::string& checkpoint() {
  static const std::string dir = [] {
    auto d = lf::testing::make_temp_dir("gen");
    auto r = run_command({bin("loongforge-train"), "--config-file",
                          lf::testing::source_dir() + "/configs/demo.yaml", "--train-iters", "6",
                          "--eval-iters", "0", "--save", d + "/ckpt", "++model.foundation.qk_layernorm=true", "model.foundation.vocab_size=257"});  // byte tokenizer
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return d;
  }();
  return dir;
}

std::vector<float> read_logits(const std::string& path, std::vector<int64_t>* shape = nullptr) {
  auto r = lf::safetensors::Reader::open(path);
  const auto& t = r.at("logits");
  EXPECT_EQ(t.dtype, lf::safetensors::DType::F32);
  if (shape) *shape = t.shape;
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), r.data(t), v.size() * 4);
  return v;
}

std::string last_line(const std::string& out, const std::string& prefix) {
  std::string found;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) found = line.substr(prefix.size());
  return found;
}

const char* kIds = "72,101,108,108,111,44,32,49,43,50,61";

TEST(GenerateProgram, LogitsAndGreedyTokensEqualTransformers) {
  const auto& d = checkpoint();
  auto conv = run_command({bin("loongforge-convert"), "lf2hf", "--load", d + "/ckpt", "--out", d + "/hf",
                           "--dtype", "fp32"});
  ASSERT_EQ(conv.exit_code, 0) << conv.output;
  auto native = run_command({bin("loongforge-generate"), "--load", d + "/ckpt", "--input-ids", kIds,
                             "--dump-logits", d + "/native.safetensors"});
  ASSERT_EQ(native.exit_code, 0) << native.output;
  auto hf = run_command({bin("loongforge-generate"), "--load", d + "/hf", "--input-ids", kIds,
                         "--dump-logits", d + "/hf.safetensors"});
  ASSERT_EQ(hf.exit_code, 0) << hf.output;
  auto oracle = run_command({python(), lf::testing::source_dir() + "/tests/tools/generate_oracle.py",
                             d + "/hf", kIds, "8", d + "/oracle.safetensors"});
  ASSERT_EQ(oracle.exit_code, 0) << oracle.output;

  std::vector<int64_t> shape;
  const auto a = read_logits(d + "/native.safetensors", &shape);
  EXPECT_EQ(shape, (std::vector<int64_t>{11, 257}));  // [tokens, vocab] (ARCHITECTURE.md)
  const auto b = read_logits(d + "/hf.safetensors");
  const auto c = read_logits(d + "/oracle.safetensors");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), c.size());
  double native_vs_hf = 0, ours_vs_transformers = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    native_vs_hf = std::max(native_vs_hf, static_cast<double>(std::abs(a[i] - b[i])));
    ours_vs_transformers = std::max(ours_vs_transformers, static_cast<double>(std::abs(a[i] - c[i])));
  }
  // fp32 weights copied exactly both ways: the two loaders give the same model.
  EXPECT_EQ(native_vs_hf, 0.0);
  // Two fp32 implementations of the same math (fused ops vs transformers' modules): rounding of
  // O(1) logits through two layers, ~1e-6; 1e-4 is the parity bound of the HF tests.
  EXPECT_LE(ours_vs_transformers, 1e-4);

  auto greedy = run_command({bin("loongforge-generate"), "--load", d + "/ckpt", "--input-ids", kIds,
                             "--max-new-tokens", "8"});
  ASSERT_EQ(greedy.exit_code, 0) << greedy.output;
  const std::string want = last_line(oracle.output, "greedy: ");
  ASSERT_FALSE(want.empty()) << oracle.output;
  EXPECT_NE(greedy.output.find(want + "\n"), std::string::npos) << greedy.output << "\nwant " << want;
}

TEST(GenerateProgram, KvCacheSamplingEqualsRecomputation) {
  const auto& d = checkpoint();
  std::vector<std::string> args = {bin("loongforge-generate"), "--load", d + "/ckpt", "--prompt", "12+7=",
                                   "--tokenizer-type", "ByteTokenizer", "--max-new-tokens", "12",
                                   "--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--seed", "3"};
  auto cached = run_command(args);
  args.push_back("--no-kv-cache");
  auto full = run_command(args);
  ASSERT_EQ(cached.exit_code, 0) << cached.output;
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const auto text = last_line(cached.output, "12+7=");
  EXPECT_EQ(text, last_line(full.output, "12+7="));
  EXPECT_FALSE(text.empty()) << cached.output;
}

TEST(GenerateProgram, EvalFileCountsExactMatches) {
  const auto& d = checkpoint();
  // The model's own greedy completion of "3+4=" (stopping at a newline) is right by construction;
  // a different answer is wrong: 1 of 2.
  auto g = run_command({bin("loongforge-generate"), "--load", d + "/ckpt", "--prompt", "3+4=",
                        "--tokenizer-type", "ByteTokenizer", "--max-new-tokens", "4", "--stop", "\n"});
  ASSERT_EQ(g.exit_code, 0) << g.output;
  const std::string completion = last_line(g.output, "3+4=");
  std::ofstream(d + "/eval.jsonl") << "{\"prompt\": \"3+4=\", \"answer\": \"" << completion << "\"}\n"
                                   << "{\"prompt\": \"3+4=\", \"answer\": \"" << completion << "x\"}\n";
  auto e = run_command({bin("loongforge-generate"), "--load", d + "/ckpt", "--eval-file", d + "/eval.jsonl",
                        "--tokenizer-type", "ByteTokenizer", "--max-new-tokens", "4", "--stop", "\n"});
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("exact match: 1/2 = 0.500"), std::string::npos) << e.output;
}

// loongforge-train --save-hf exports the final weights; --load of that HF directory starts
// from exactly them (lr 0: the parameters after one step are the loaded ones, bit for bit), at
// TP=2 too (the HF weights are sharded on the fly).
TEST(GenerateProgram, TrainSaveHfThenLoadHfKeepsTheWeights) {
  auto d = lf::testing::make_temp_dir("savehf");
  const std::string cfg = lf::testing::source_dir() + "/configs/demo.yaml";
  auto a = run_command({bin("loongforge-train"), "--config-file", cfg, "--train-iters", "3", "--eval-iters", "0",
                        "--save-hf", d + "/hf"},
                       {{"LOONGFORGE_DUMP_PARAMS", d + "/trained.safetensors"}});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const auto trained = lf::testing::read_params(d + "/trained.safetensors");
  for (int tp : {1, 2}) {
    const std::string tps = std::to_string(tp), out = d + "/loaded" + tps + ".safetensors";
    auto b = run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", tps, bin("loongforge-train"),
                          "--config-file", cfg, "--train-iters", "1", "--eval-iters", "0", "--load", d + "/hf",
                          "--lr", "0", "--min-lr", "0", "--lr-warmup-iters", "0", "--tensor-model-parallel-size", tps},
                         {{"LOONGFORGE_DUMP_PARAMS", out}});
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("loaded HF weights from"), std::string::npos) << b.output;
    EXPECT_EQ(lf::testing::max_abs_diff(trained, lf::testing::read_params(out)), 0.0) << "tp " << tp;
  }
}

// --save-hf under pipeline parallelism (interleaved: each stage holds non-contiguous layers, the
// last stage a tied copy of the embedding): the first stage gathers every stage's weights and
// writes them; loaded back in one process, or into PP 2 stages, they equal the stages' own dumps.
TEST(GenerateProgram, SaveHfUnderPipelineParallelismHasEveryStagesWeights) {
  auto d = lf::testing::make_temp_dir("savehf-pp");
  const std::string cfg = lf::testing::source_dir() + "/configs/demo.yaml";
  auto a = run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", "2", bin("loongforge-train"),
                        "--config-file", cfg, "--train-iters", "3", "--eval-iters", "0", "--save-hf", d + "/hf",
                        "--pipeline-model-parallel-size", "2", "model.foundation.num_layers=4",
                        "--num-layers-per-virtual-pipeline-stage", "1"},
                       {{"LOONGFORGE_DUMP_PARAMS", d + "/trained.safetensors"}});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto trained = lf::testing::read_params(d + "/trained.safetensors.pp0");
  for (auto& [name, v] : lf::testing::read_params(d + "/trained.safetensors.pp1")) trained[name] = std::move(v);
  const std::string out = d + "/loaded.safetensors";
  auto b = run_command({bin("loongforge-train"), "--config-file", cfg, "--train-iters", "1", "--eval-iters", "0",
                        "--load", d + "/hf", "model.foundation.num_layers=4", "--lr", "0", "--min-lr", "0",
                        "--lr-warmup-iters", "0"},
                       {{"LOONGFORGE_DUMP_PARAMS", out}});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(lf::testing::max_abs_diff(trained, lf::testing::read_params(out)), 0.0);
  // And --load of the HF directory into PP 2 stages (1F1B): each stage takes its layers.
  const std::string out2 = d + "/loaded-pp.safetensors";
  auto c = run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", "2", bin("loongforge-train"),
                        "--config-file", cfg, "--train-iters", "1", "--eval-iters", "0", "--load", d + "/hf",
                        "model.foundation.num_layers=4", "--lr", "0", "--min-lr", "0", "--lr-warmup-iters", "0",
                        "--pipeline-model-parallel-size", "2"},
                       {{"LOONGFORGE_DUMP_PARAMS", out2}});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  auto loaded = lf::testing::read_params(out2 + ".pp0");
  for (auto& [name, v] : lf::testing::read_params(out2 + ".pp1")) loaded[name] = std::move(v);
  EXPECT_EQ(lf::testing::max_abs_diff(trained, loaded), 0.0);
}

// A byte-level HF tokenizer over the checkpoint's 257 ids (byte b is id b) whose post-processor
// puts <|begin_of_text|> (id 256) first, as LLaMA-3's does; written by the tokenizers package.
std::string bos_tokenizer(const std::string& dir) {
  const std::string script = R"(
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
byte_char = dict(zip(bs, cs))
vocab = {chr(byte_char[b]): b for b in range(256)}
tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens(["<|begin_of_text|>"])
tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), processors.TemplateProcessing(
    single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 256)])])
assert tok.encode("3+4=").ids == [256, 51, 43, 52, 61], tok.encode("3+4=").ids
tok.save(sys.argv[1])
)";
  auto r = run_command({python(), "-c", script, dir + "/tokenizer.json"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir + "/tokenizer.json";
}

// --add-special-tokens encodes --prompt as HF's tokenizer(text) does (the template's
// <|begin_of_text|> first): the same completion as --input-ids with that id prepended; without
// the flag, the text's ids alone. Refused with a tokenizer that has no template and with --input-ids.
TEST(GenerateProgram, AddSpecialTokensEncodesThePromptAsHf) {
  const auto& d = checkpoint();
  const std::string tok = bos_tokenizer(d);
  const std::vector<std::string> base = {bin("loongforge-generate"), "--load", d + "/ckpt", "--max-new-tokens", "6"};
  auto run = [&](std::vector<std::string> extra) {
    auto a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return run_command(a);
  };
  auto with = run({"--prompt", "3+4=", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tok,
                   "--add-special-tokens"});
  auto without = run({"--prompt", "3+4=", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tok});
  auto ids_with = run({"--input-ids", "256,51,43,52,61", "--tokenizer-type", "HuggingFaceTokenizer",
                       "--tokenizer-model", tok});
  auto ids_without = run({"--input-ids", "51,43,52,61", "--tokenizer-type", "HuggingFaceTokenizer",
                          "--tokenizer-model", tok});
  for (const auto* r : {&with, &without, &ids_with, &ids_without}) ASSERT_EQ(r->exit_code, 0) << r->output;
  EXPECT_NE(with.output.find("prompt: 5 tokens (with the tokenizer's special tokens)"), std::string::npos)
      << with.output;
  EXPECT_NE(without.output.find("prompt: 4 tokens (without"), std::string::npos) << without.output;
  // --input-ids prints the ids, then their text: the completion is the text's last line.
  const auto completion = [](const std::string& out) {
    std::string last;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (line.find(" I ") == std::string::npos && !line.empty()) last = line;
    return last;
  };
  EXPECT_FALSE(completion(ids_with.output).empty()) << ids_with.output;
  EXPECT_EQ(last_line(with.output, "3+4="), completion(ids_with.output)) << with.output << ids_with.output;
  EXPECT_EQ(last_line(without.output, "3+4="), completion(ids_without.output)) << without.output << ids_without.output;

  auto byte = run({"--prompt", "3+4=", "--tokenizer-type", "ByteTokenizer", "--add-special-tokens"});
  EXPECT_EQ(byte.exit_code, 1) << byte.output;
  EXPECT_NE(byte.output.find("--add-special-tokens needs --tokenizer-type HuggingFaceTokenizer"), std::string::npos)
      << byte.output;
  auto ids = run({"--input-ids", "1,2", "--add-special-tokens"});
  EXPECT_EQ(ids.exit_code, 1) << ids.output;
  EXPECT_NE(ids.output.find("--add-special-tokens applies to --prompt and --eval-file"), std::string::npos)
      << ids.output;
}

TEST(GenerateProgram, MistakesAreClearErrors) {
  const auto& d = checkpoint();
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"--load", d + "/nope", "--input-ids", "1"}, d + "/nope"},
      {{"--load", d + "/ckpt", "--input-ids", "1,x"}, "'x' is not an integer"},
      {{"--load", d + "/ckpt", "--prompt", "hi"}, "need --tokenizer-type"},
      {{"--load", d + "/ckpt", "--input-ids", "1", "--prompt", "hi"}, "exactly one of"},
      {{"--load", d + "/ckpt", "--input-ids", "1,300"}, "prompt token 300 is outside the vocabulary [0, 257)"},
      {{"--load", d + "/ckpt", "--input-ids", "1", "--temperature", "-1"}, "temperature must be >= 0"},
      // Flags that would do nothing in the mode in use.
      {{"--load", d + "/ckpt", "--input-ids", "1", "--top-k", "5"}, "--top-k shapes sampling, and --temperature 0"},
      {{"--load", d + "/ckpt", "--input-ids", "1", "--top-p", "0.9"}, "--top-p shapes sampling"},
      {{"--load", d + "/ckpt", "--input-ids", "1", "--seed", "3"}, "--seed shapes sampling"},
      {{"--load", d + "/ckpt", "--input-ids", "1", "--verbose"}, "--verbose applies to --eval-file"},
      {{"--load", d + "/ckpt", "--input-ids", "1", "--eval-limit", "2"}, "--eval-limit applies to --eval-file"},
      {{"--load", d + "/ckpt", "--input-ids", "1", "--stop", "a"}, "--stop strings are read with the tokenizer"},
      {{"--load", d + "/ckpt", "--input-ids", "1", "--dump-logits", d + "/l.safetensors", "--temperature", "1"},
       "--temperature is a generation flag, and --dump-logits"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> a = {bin("loongforge-generate")};
    a.insert(a.end(), c.args.begin(), c.args.end());
    auto r = run_command(a);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << "want '" << c.expect << "' in: " << r.output;
  }
}
}  // namespace

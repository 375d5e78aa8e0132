// Megatron flags: parsing each kind, unknown flags, help and the docs table (in sync with the one
// table in flags.cpp).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "config_test_util.h"
#include "loongforge/core/config/flags.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/core/config/yaml.h"

namespace lf::config {
namespace {
using testing::expect_config_error;

TrainCommandLine parse(std::vector<std::string> args) { return parse_train_command_line(args); }

std::string show(const Override& o) {
  std::string v = to_yaml(*o.value);
  v.pop_back();
  return o.key + "=" + v + " <" + o.origin.str() + ">";
}

TEST(ConfigFlags, EachKindBecomesAForceOverrideWithTheFlagAsOrigin) {
  TrainCommandLine cl = parse({"--config-file", "x.yaml", "--bf16", "--lr", "3e-4", "--seed=7",
                               "--disable-bias-linear", "--data-path", "0.3", "A", "0.7", "B", "--split",
                               "98,2,0", "training.eval_iters=5", "--dry-run", "--show-origin"});
  EXPECT_EQ(cl.config_file, "x.yaml");
  EXPECT_TRUE(cl.dry_run);
  EXPECT_TRUE(cl.show_origin);
  EXPECT_FALSE(cl.help);
  ASSERT_EQ(cl.overrides.size(), 7u);
  EXPECT_EQ(show(cl.overrides[0]), "training.bf16=true <flag --bf16>");
  EXPECT_EQ(show(cl.overrides[1]), "optimizer.lr=3e-4 <flag --lr 3e-4>");
  EXPECT_EQ(show(cl.overrides[2]), "training.seed=7 <flag --seed 7>");
  EXPECT_EQ(show(cl.overrides[3]), "model.foundation.add_bias_linear=false <flag --disable-bias-linear>");
  EXPECT_EQ(show(cl.overrides[4]), "data.data_path=[0.3, A, 0.7, B] <flag --data-path 0.3 A 0.7 B>");
  EXPECT_EQ(show(cl.overrides[5]), "data.split=[98, 2, 0] <flag --split 98,2,0>");
  EXPECT_EQ(show(cl.overrides[6]), "training.eval_iters=5 <override training.eval_iters=5>");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(cl.overrides[i].kind, Override::Kind::force);
  EXPECT_EQ(cl.overrides[6].kind, Override::Kind::set);
}

TEST(ConfigFlags, ListFlagStopsAtAnOverride) {
  TrainCommandLine cl = parse({"--data-path", "A", "B", "training.seed=1"});
  ASSERT_EQ(cl.overrides.size(), 2u);
  EXPECT_EQ(to_yaml(*cl.overrides[0].value), "[A, B]\n");
  EXPECT_EQ(cl.overrides[1].key, "training.seed");
}

TEST(ConfigFlags, UnknownFlagSuggestsTheNearestAndErrorsAreCollected) {
  ConfigError e = expect_config_error(
      [] { parse({"--tensor-model-paralel-size", "2", "--lr", "--bf16=1", "--frobnicate"}); });
  ASSERT_EQ(e.issues().size(), 4u);
  EXPECT_EQ(e.issues()[0].message, "unknown flag --tensor-model-paralel-size");
  EXPECT_EQ(e.issues()[0].hint.substr(0, 44), "did you mean --tensor-model-parallel-size? s");
  EXPECT_EQ(e.issues()[1].message, "flag --lr needs a value");
  EXPECT_EQ(e.issues()[2].message, "flag --bf16 is a switch and takes no value");
  EXPECT_EQ(e.issues()[3].message, "unknown flag --frobnicate");
  EXPECT_EQ(e.issues()[3].hint, "see loongforge-train --help; any config key can be set with ++KEY=VALUE");
}

TEST(ConfigFlags, TableCoversTheMegatronFlagsAndKeysExist) {
  for (const char* f :
       {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--sequence-parallel",
        "--context-parallel-size", "--expert-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
        "--micro-batch-size", "--global-batch-size", "--train-iters", "--seq-length", "--lr", "--min-lr",
        "--lr-decay-style", "--lr-decay-iters", "--lr-warmup-iters", "--lr-warmup-fraction", "--weight-decay",
        "--adam-beta1", "--adam-beta2", "--adam-eps", "--clip-grad", "--seed", "--save", "--load",
        "--save-interval", "--no-load-optim", "--no-load-rng", "--finetune", "--use-distributed-optimizer",
        "--bf16", "--fp16", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
        "--data-path", "--split", "--mock-data", "--tokenizer-type", "--tokenizer-model", "--num-workers",
        "--log-interval", "--eval-interval", "--eval-iters", "--exit-interval", "--exit-duration-in-mins",
        "--deterministic-mode", "--distributed-timeout-minutes", "--distributed-backend", "--metrics-file",
        "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
        "--group-query-attention", "--kv-channels", "--max-position-embeddings", "--vocab-size",
        "--make-vocab-size-divisible-by", "--swiglu", "--normalization", "--rotary-base",
        "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm",
        "--init-method-std", "--hidden-dropout", "--attention-dropout", "--position-embedding-type"})
    EXPECT_NE(find_flag(f), nullptr) << f;
  // Every non-model flag sets a schema field (so its help comes from the schema).
  std::vector<FieldDoc> docs = describe<JobConfig>();
  for (const FlagSpec& f : flag_table()) {
    if (std::string(f.key).starts_with("model.")) continue;
    bool found = std::any_of(docs.begin(), docs.end(), [&](const FieldDoc& d) { return d.key == f.key; });
    EXPECT_TRUE(found) << f.flag << " -> " << f.key;
  }
}

TEST(ConfigFlags, HelpListsEveryFlag) {
  std::string help = help_text();
  for (const FlagSpec& f : flag_table()) EXPECT_NE(help.find("  " + std::string(f.flag) + " "), std::string::npos) << f.flag;
  EXPECT_NE(help.find("--lr LR"), std::string::npos);
  EXPECT_NE(help.find("Peak learning rate [optimizer.lr]"), std::string::npos);
  EXPECT_NE(help.find("Precedence: config files < flags and overrides"), std::string::npos);
}

std::string block(const std::string& text, const std::string& name) {
  const std::string begin = "<!-- " + name + ":begin -->\n", end = "<!-- " + name + ":end -->";
  size_t b = text.find(begin), e = text.find(end);
  if (b == std::string::npos || e == std::string::npos || e < b) return "<markers missing>";
  return text.substr(b + begin.size(), e - b - begin.size());
}

TEST(ConfigFlags, DocsTablesAreInSyncWithTheCode) {
  std::ifstream in(lf::testing::source_dir() + "/docs/configuration.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const char* how = "docs/configuration.md is stale: run build/bin/loongforge-config-docs to regenerate it";
  EXPECT_EQ(block(ss.str(), "flags"), flags_markdown()) << how;
  EXPECT_EQ(block(ss.str(), "schema"), job_fields_markdown()) << how;
}

}  // namespace
}  // namespace lf::config

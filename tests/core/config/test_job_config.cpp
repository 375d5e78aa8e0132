// The job pipeline on the real configs/ tree and on small files: defaults in the resolved tree,
// precedence, the "misspelled key" contract, cross-field checks, --show-origin output.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "loongforge/core/config/flags.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/core/config/yaml.h"

namespace lf::config {
namespace {
using testing::expect_config_error;
using testing::write_file;

std::string configs() { return lf::testing::source_dir() + "/configs"; }

ComposeOptions demo(std::vector<std::string> args = {}) {
  TrainCommandLine cl = parse_train_command_line(args);
  ComposeOptions o;
  o.config_root = configs();
  o.config_file = configs() + "/demo.yaml";
  o.overrides = cl.overrides;
  return o;
}

// A job file in a temp dir that composes the real train/base and model configs.
ComposeOptions job_file(const std::string& body, std::string* path_out = nullptr) {
  std::string dir = lf::testing::make_temp_dir("cfg_job");
  ComposeOptions o;
  o.config_root = configs();
  o.config_file = write_file(dir, "job.yaml",
                             "defaults:\n  - /train/base@_global_\n  - /models@model: causal_lm\n  - _self_\n" + body);
  if (path_out) *path_out = display_path(o.config_file);
  return o;
}

TEST(ConfigJob, DemoLoads) {
  LoadedJob j = load_job(demo());
  EXPECT_EQ(j.job.training.train_iters, 20);
  EXPECT_EQ(j.job.training.seq_length, 128);  // ${model.foundation.max_position_embeddings}
  EXPECT_EQ(j.job.training.global_batch_size, std::optional<int64_t>(8));
  EXPECT_DOUBLE_EQ(j.job.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(j.job.optimizer.adam_beta2, 0.95);
  EXPECT_EQ(j.job.optimizer.lr_decay_style, "cosine");
  EXPECT_TRUE(j.job.data.mock_data);
  EXPECT_EQ(j.job.parallel.order, "tp-cp-ep-dp-pp");
  EXPECT_EQ(j.job.model.find("type")->text(), "causal_lm");
  EXPECT_EQ(get<int64_t>(j.job.model, "foundation.ffn_hidden_size"), 172);
  // Schema defaults appear in the resolved tree, marked as defaults.
  const Node* hysteresis = j.resolved.find_path("training.hysteresis");
  ASSERT_NE(hysteresis, nullptr);
  EXPECT_EQ(hysteresis->text(), "2");
  EXPECT_EQ(hysteresis->origin().str(), "default");
}

TEST(ConfigJob, FlagsAndOverridesWinOverFilesLeftToRight) {
  LoadedJob j = load_job(demo({"--lr", "5e-4", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                               "training.train_iters=7", "--train-iters", "9", "optimizer.min_lr=1e-5",
                               "models/llama@model.foundation=tiny", "++model.foundation.num_layers=3"}));
  EXPECT_DOUBLE_EQ(j.job.optimizer.lr, 5e-4);
  EXPECT_EQ(j.job.parallel.tensor_model_parallel_size, 2);
  EXPECT_TRUE(j.job.parallel.sequence_parallel);
  EXPECT_EQ(j.job.training.train_iters, 9);  // the later of the two
  EXPECT_DOUBLE_EQ(j.job.optimizer.min_lr, 1e-5);
  EXPECT_EQ(j.resolved.find_path("optimizer.lr")->origin().str(), "flag --lr 5e-4");
  EXPECT_EQ(j.resolved.find_path("training.train_iters")->origin().str(), "flag --train-iters 9");
  EXPECT_EQ(j.resolved.find_path("model.foundation.num_layers")->text(), "3");
}

TEST(ConfigJob, MisspelledKeyNamesFileLineAndNearestValidKey) {
  std::string path;
  ComposeOptions o = job_file("training:\n  train_iters: 5\n  seq_length: 64\nparallel:\n  tensor_model_paralel_size: 2\n"
                              "data:\n  mock_data: true\n",
                              &path);
  ConfigError e = expect_config_error([&] { load_job(o); });
  ASSERT_EQ(e.issues().size(), 1u) << e.what();
  EXPECT_EQ(e.issues()[0].origin.str(), path + ":9");
  EXPECT_EQ(e.issues()[0].message, "unknown key 'parallel.tensor_model_paralel_size'");
  EXPECT_EQ(e.issues()[0].hint, "did you mean 'parallel.tensor_model_parallel_size'?");
}

TEST(ConfigJob, ManyProblemsOneError) {
  std::string path;
  ComposeOptions o = job_file(
      "trainng:\n  seed: 1\ntraining:\n  seq_length: 64\n  train_iters: many\noptimizer:\n  lr: 1e-4\n  min_lr: 1e-3\n"
      "  lr_decay_style: cosine_annealing\ndata:\n  mock_data: true\n",
      &path);
  o.overrides.push_back(Override::parse("data.data_pth=[x]"));
  ConfigError e = expect_config_error([&] { load_job(o); });
  std::vector<std::string> got;
  for (const ConfigIssue& i : e.issues()) got.push_back(i.str());
  ASSERT_EQ(got.size(), 5u) << e.what();
  EXPECT_EQ(got[0],
            "override data.data_pth=[x]: cannot override 'data.data_pth': no such key in the config (did you "
            "mean 'data.data_path'? to add a new key write +data.data_pth=VALUE (or ++data.data_pth=VALUE: add or "
            "replace))");
  EXPECT_EQ(got[1], path + ":9: 'training.train_iters' expects int, got 'many'");
  EXPECT_EQ(got[2], path + ":13: optimizer.lr_decay_style: value 'cosine_annealing' is not allowed; one of: "
                           "constant, linear, cosine, inverse-square-root, WSD");
  EXPECT_EQ(got[3], path + ":5: unknown key 'trainng' (did you mean 'training'?)");
  EXPECT_EQ(got[4], path + ":12: min_lr exceeds lr: optimizer.min_lr = 1e-3 (" + path +
                        ":12) > optimizer.lr = 1e-4 (" + path +
                        ":11) (min_lr is the floor the learning rate decays to; lower it or raise lr)");
}

TEST(ConfigJob, CrossFieldChecks) {
  ComposeOptions o = job_file("training:\n  train_iters: 5\n  seq_length: 64\n");
  o.overrides = parse_train_command_line(std::vector<std::string>{
                    "--bf16", "--fp16", "--recompute-method", "uniform", "--global-batch-size", "3",
                    "--micro-batch-size", "2", "parallel.order=tp-dp-pp", "--lr-warmup-fraction", "0.1",
                    "--lr-warmup-iters", "2", "--num-layers-per-virtual-pipeline-stage", "1"})
                    .overrides;
  ConfigError e = expect_config_error([&] { load_job(o); });
  std::vector<std::string> keys;
  for (const ConfigIssue& i : e.issues()) keys.push_back(i.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"optimizer.lr_warmup_fraction", "training.fp16",
                                            "training.global_batch_size", "training.recompute_method",
                                            "parallel.num_layers_per_virtual_pipeline_stage", "parallel.order",
                                            "data.data_path"}))
      << e.what();
}

// The profiler's settings without --profile would do nothing: each is named.
TEST(ConfigJob, ProfileSettingsWithoutProfileAreRefused) {
  ComposeOptions o = demo();
  o.overrides = parse_train_command_line(std::vector<std::string>{"--profile-step-end", "4", "--profile-trace", "t.json"})
                    .overrides;
  ConfigError e = expect_config_error([&] { load_job(o); });
  std::vector<std::string> keys;
  for (const ConfigIssue& i : e.issues()) keys.push_back(i.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"logging.profile_step_end", "logging.profile_trace"})) << e.what();
  EXPECT_NE(std::string(e.what()).find("is set but logging.profile is off"), std::string::npos) << e.what();
  o.overrides = parse_train_command_line(std::vector<std::string>{"--profile", "--profile-step-end", "4"}).overrides;
  EXPECT_NO_THROW(load_job(o));
}

// Keys that act only with another one are refused without it, each by name; with it they load.
TEST(ConfigJob, KeysThatWouldDoNothingAloneAreRefused) {
  auto keys_of = [](const std::vector<std::string>& args) {
    ComposeOptions o = demo();
    o.overrides = parse_train_command_line(args).overrides;
    ConfigError e = expect_config_error([&] { load_job(o); });
    std::vector<std::string> keys;
    for (const ConfigIssue& i : e.issues()) keys.push_back(i.key);
    return std::pair{keys, std::string(e.what())};
  };
  auto [save, save_text] = keys_of({"--save-interval", "5", "--no-save-optim", "--no-save-rng", "--ckpt-keep-last", "2",
                                    "--async-save", "--no-load-optim", "--no-load-rng", "--exit-on-missing-checkpoint",
                                    "--finetune"});
  EXPECT_EQ(save, (std::vector<std::string>{"checkpoint.save_interval", "checkpoint.no_save_optim",
                                            "checkpoint.no_save_rng", "checkpoint.ckpt_keep_last",
                                            "checkpoint.async_save", "checkpoint.no_load_optim", "checkpoint.no_load_rng",
                                            "checkpoint.exit_on_missing_checkpoint", "checkpoint.finetune"}))
      << save_text;
  EXPECT_NE(save_text.find("checkpoint.save is not set"), std::string::npos) << save_text;
  // --pretrained-checkpoint loads weights only: the load options still do nothing; --finetune is its default.
  auto [pre, pre_text] = keys_of({"--pretrained-checkpoint", "base", "--finetune", "--no-load-optim"});
  EXPECT_EQ(pre, (std::vector<std::string>{"checkpoint.no_load_optim"})) << pre_text;
  EXPECT_NE(pre_text.find("loads weights only"), std::string::npos) << pre_text;
  auto [other, other_text] =
      keys_of({"--sgd-momentum", "0.5", "--lr-wsd-decay-iters", "3", "--fp16", "--loss-scale", "128",
               "--loss-scale-window", "50", "--tokenizer-type", "ByteTokenizer", "--tokenizer-model", "tok"});
  EXPECT_EQ(other, (std::vector<std::string>{"optimizer.sgd_momentum", "optimizer.lr_wsd_decay_iters",
                                             "training.loss_scale_window", "data.tokenizer_model"}))
      << other_text;
  auto [chunk, chunk_text] = keys_of({"--chunkpipe-chunk-size", "16", "--recompute-granularity", "full",
                                      "--recompute-method", "uniform", "--recompute-num-layers", "1"});
  EXPECT_EQ(chunk, (std::vector<std::string>{"training.recompute_granularity"})) << chunk_text;
  // --finetune loads the weights only: the optimizer and RNG load options do nothing beside it.
  auto [ft, ft_text] = keys_of({"--load", "ck", "--finetune", "--no-load-optim", "--no-load-rng"});
  EXPECT_EQ(ft, (std::vector<std::string>{"checkpoint.no_load_optim", "checkpoint.no_load_rng"})) << ft_text;
  // With their partners, the same keys load.
  ComposeOptions o = demo();
  o.overrides = parse_train_command_line(std::vector<std::string>{
                    "--save", "ck", "--save-interval", "5", "--no-save-optim", "--ckpt-keep-last", "2", "--async-save",
                    "--load", "ck", "--no-load-optim", "--no-load-rng", "--exit-on-missing-checkpoint",
                    "--optimizer", "sgd", "--sgd-momentum", "0.9", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters",
                    "3", "--fp16", "--loss-scale-window", "50", "--chunkpipe-chunk-size", "16",
                    "--recompute-granularity", "selective"})
                    .overrides;
  EXPECT_NO_THROW(load_job(o));
}

TEST(ConfigJob, OneIssuePerKeyNoCascade) {
  // The failed interpolation would otherwise also be reported as "expects int, got null", and
  // the missing lr as "min_lr exceeds lr".
  ComposeOptions o = job_file("training:\n  train_iters: 5\n  seq_length: ${nope}\ndata:\n  mock_data: true\n");
  o.overrides.push_back(Override::parse("~optimizer.lr"));
  ConfigError e = expect_config_error([&] { load_job(o); });
  std::vector<std::string> msgs;
  for (const ConfigIssue& i : e.issues()) msgs.push_back(i.message);
  EXPECT_EQ(msgs, (std::vector<std::string>{"interpolation '${nope}' names a missing key 'nope'",
                                            "required key 'optimizer.lr' is missing"}));
}

TEST(ConfigJob, MissingRequiredAndMissingModel) {
  std::string dir = lf::testing::make_temp_dir("cfg_job");
  ComposeOptions o;
  o.config_root = configs();
  o.config_file = write_file(dir, "job.yaml", "data:\n  mock_data: true\n");
  ConfigError e = expect_config_error([&] { load_job(o); });
  std::vector<std::string> msgs;
  for (const ConfigIssue& i : e.issues()) msgs.push_back(i.message);
  EXPECT_EQ(msgs, (std::vector<std::string>{"required key 'training.train_iters' is missing",
                                            "required key 'training.seq_length' is missing",
                                            "required key 'optimizer.lr' is missing",
                                            "required key 'model' is missing"}));
}

TEST(ConfigJob, ShowOriginOfTheDemo) {
  LoadedJob j = load_job(demo({"--seed", "42", "training.eval_iters=3"}));
  std::string text = to_yaml(j.resolved, true);
  const std::string d = display_path(configs() + "/demo.yaml");
  const std::string b = display_path(configs() + "/train/base.yaml");
  const std::string t = display_path(configs() + "/models/llama/tiny.yaml");
  for (const std::string& line : std::vector<std::string>{
           "  train_iters: 20  # " + d + ":9\n", "  seq_length: 128  # " + d + ":12\n",
        "  seed: 42  # flag --seed 42\n", "  eval_iters: 3  # override training.eval_iters=3\n",
        "  adam_beta2: 0.95  # " + b + ":30\n", "  hysteresis: 2  # default\n",
        "    num_layers: 2  # " + t + ":2\n", "  type: causal_lm  # " + display_path(configs() + "/models/causal_lm.yaml") + ":9\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\nnot in:\n" << text;
  // Without origins the output is plain YAML that loads back to the same tree.
  EXPECT_TRUE(parse_yaml_string(to_yaml(j.resolved), {}).same_value(j.resolved));
}

}  // namespace
}  // namespace lf::config

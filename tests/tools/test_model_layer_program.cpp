// The model layer through loongforge-train as users run it: composites assembled only from YAML
// train with per-component layouts equal to the single process (the VLM skeleton with encoder
// TP 1 and foundation TP 2, its encoder frozen; the DiT skeleton under DP 2), --dry-run prints
// every component's layout, a TP 1 checkpoint resharded offline to TP 2 loads and trains on;
// Qwen2.5-VL (vision tower + M-RoPE decoder) under foundation TP 2 and PP 2.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "loongforge/core/safetensors.h"
#include "loongforge/media/video.h"
#include "oracle_cache.h"
#include "pp_training.h"

namespace {
namespace fs = std::filesystem;
using lf::testing::bin;
using lf::testing::Params;
using lf::testing::TrainRun;

std::string config(const std::string& name) { return lf::testing::source_dir() + "/configs/" + name; }

// 10 steps of `config_file` (procs > 1: under loongforge-run) with its metrics and final
// parameters; `dir`: where they go (a fresh one when empty).
TrainRun run(int procs, const std::string& config_file, std::vector<std::string> extra, const std::string& tag,
             std::string dir = "") {
  if (dir.empty()) dir = lf::testing::make_temp_dir("ml-" + tag);
  std::vector<std::string> argv;
  if (procs > 1) argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
  std::vector<std::string> t = {bin("loongforge-train"), "--config-file", config_file, "--train-iters", "10",
                                "--metrics-file", dir + "/m.jsonl", "--data-cache-path", dir, "--deterministic-mode",
                                "--log-interval", "1"};
  argv.insert(argv.end(), t.begin(), t.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  TrainRun out = lf::testing::run_training(argv, dir);
  if (out.exit_code != 0) return out;
  if (fs::exists(dir + "/p.safetensors")) out.params = lf::testing::read_params(dir + "/p.safetensors");
  return out;
}

Params only(const Params& p, const std::string& prefix, bool keep) {
  Params out;
  for (const auto& [name, v] : p)
    if (name.starts_with(prefix) == keep) out[name] = v;
  return out;
}

const std::string kSpliced = config("examples/spliced_lm_tiny.yaml");

// The VLM skeleton: foundation TP 2 on 2 processes while the encoder runs at TP 1 (two encoder
// replicas, each encoding half of every micro-batch's features, gathered for the splice) equals
// one process (fp32, 10 steps). Tolerances as the other equivalence tests (pp_training.h):
// the same ops in another summation order.
TEST(SplicedLm, EncoderTp1WithFoundationTp2EqualsOneProcess) {
  auto one = run(1, kSpliced, {}, "spliced1");
  auto two = run(2, kSpliced, {"--tensor-model-parallel-size", "2"}, "spliced2");
  lf::testing::expect_same_training(one, two, "spliced_lm: encoder tp 1, foundation tp 2");
  EXPECT_NE(two.output.find("image_encoder"), std::string::npos);
  ASSERT_FALSE(only(one.params, "image_encoder.", true).empty());
  // The same layout with the encoder at the foundation's TP (2): its TP group is the
  // foundation's, fc1/fc2 split over it.
  auto same = run(2, kSpliced, {"--tensor-model-parallel-size", "2", "model.image_encoder.tensor_model_parallel_size=2"},
                  "spliced_tp2");
  lf::testing::expect_same_training(one, same, "spliced_lm: encoder and foundation tp 2");
}

// Qwen2.5-VL on mock images (configs/examples/qwen2_5_vl_tiny.yaml): the vision tower at TP 1
// beside a TP 2 foundation (each TP rank encodes the same images, 1 / 2 of the gradient each), and
// the tower on the first of 2 pipeline stages (the last computes the same M-RoPE positions from the
// batch), equal one process.
TEST(Qwen25Vl, FoundationTp2AndPp2EqualOneProcess) {
  const std::string cfg = config("examples/qwen2_5_vl_tiny.yaml");
  auto one = run(1, cfg, {}, "qwen25vl1");
  ASSERT_FALSE(only(one.params, "vision_encoder.", true).empty());
  auto tp2 = run(2, cfg, {"--tensor-model-parallel-size", "2"}, "qwen25vl_tp2");
  lf::testing::expect_same_training(one, tp2, "qwen2_5_vl: vision tp 1, foundation tp 2");
  const std::string dir = lf::testing::make_temp_dir("ml-qwen25vl_pp2");
  auto pp2 = run(2, cfg, {"--pipeline-model-parallel-size", "2"}, "qwen25vl_pp2", dir);
  for (int k = 0; k < 2; ++k)  // each stage dumps its own parameters
    for (auto& [name, v] : lf::testing::read_params(dir + "/p.safetensors.pp" + std::to_string(k))) pp2.params[name] = v;
  lf::testing::expect_same_training(one, pp2, "qwen2_5_vl: foundation pp 2");
}

// Context parallelism with the vision tower: every rank of a TP x CP group encodes the same media,
// the media are spliced into the whole sequence and each CP rank keeps its tokens (a 16-token image
// spanning two of the four 8-token chunks at CP 2); the tower's gradient is each CP rank's part,
// summed. CP 2 (ring) and CP 2 x TP 2 + SP (Ulysses) equal one process.
TEST(Qwen25Vl, ContextParallelEqualsOneProcess) {
  const std::string cfg = config("examples/qwen2_5_vl_tiny.yaml");
  const std::vector<std::string> image = {"++model.mock_image_patches=8"};
  auto one = run(1, cfg, image, "qwen25vl_cp1");
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), image.begin(), image.end());
    return extra;
  };
  auto cp2 = run(2, cfg, with({"--context-parallel-size", "2"}), "qwen25vl_cp2");
  EXPECT_NE(cp2.output.find(", cp 2 (p2p)"), std::string::npos) << cp2.output;
  lf::testing::expect_same_training(one, cp2, "qwen2_5_vl: foundation cp 2 (ring)");
  auto cp2tp2 = run(4, cfg,
                    with({"--context-parallel-size", "2", "--cp-comm-type", "a2a", "--tensor-model-parallel-size", "2",
                          "--sequence-parallel"}),
                    "qwen25vl_cp2tp2");
  EXPECT_NE(cp2tp2.output.find(", cp 2 (a2a)"), std::string::npos) << cp2tp2.output;
  lf::testing::expect_same_training(one, cp2tp2, "qwen2_5_vl: foundation cp 2 x tp 2 + SP (Ulysses)");
}

// Qwen3-VL's DeepStack features are injected after the first layers at the visual positions: under
// CP each rank injects the rows of its own positions.
TEST(Qwen3Vl, ContextParallelEqualsOneProcess) {
  const std::string cfg = config("examples/qwen3_vl_tiny.yaml");
  auto one = run(1, cfg, {}, "qwen3vl_cp1");
  auto cp2 = run(2, cfg, {"--context-parallel-size", "2"}, "qwen3vl_cp2");
  EXPECT_NE(cp2.output.find(", cp 2 (p2p)"), std::string::npos) << cp2.output;
  lf::testing::expect_same_training(one, cp2, "qwen3_vl: foundation cp 2 (ring)");
}

// Under sequence parallelism each TP rank injects the DeepStack rows of its sequence chunk; the
// rows' gradients are summed over TP on their way back to the vision tower (without that sum the
// tower's deepstack layer trained on half its gradient: parameters 4e-3 off in 6 steps).
TEST(Qwen3Vl, SequenceParallelEqualsOneProcess) {
  const std::string cfg = config("examples/qwen3_vl_tiny.yaml");
  auto one = run(1, cfg, {}, "qwen3vl_sp1");
  auto sp = run(2, cfg, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, "qwen3vl_tp2sp");
  lf::testing::expect_same_training(one, sp, "qwen3_vl: foundation tp 2 + SP");
}

// One-line backbone swap: configs/examples/qwen2_5_vl_tiny.yaml with only its defaults line changed
// to another backbone preset (head_dims 16 and 32, dense and MoE, and DeepSeek-V3's multi-latent
// attention with YaRN on interleaved rotary dims) trains unchanged (the M-RoPE sections follow the
// rotary head_dim: for MLA its decoupled RoPE dims).
TEST(Qwen25Vl, BackboneSwapIsOneYamlLine) {
  const std::string base = lf::testing::read_file(config("examples/qwen2_5_vl_tiny.yaml"));
  const std::string line = "/models/qwen2@model.foundation: tiny";
  ASSERT_NE(base.find(line), std::string::npos);
  const std::string d = lf::testing::make_temp_dir("ml-vlm-swap");
  for (const std::string preset : {"qwen3", "llama", "qwen3_moe", "deepseek_v3"}) {
    std::string text = base;
    text.replace(text.find(line), line.size(), "/models/" + preset + "@model.foundation: tiny");
    const std::string file = d + "/" + preset + ".yaml";
    std::ofstream(file) << text;
    auto r = lf::testing::run_command({bin("loongforge-train"), "--config-file", file, "--train-iters", "3",
                                       "--eval-iters", "0", "--lr-warmup-iters", "1"});
    EXPECT_EQ(r.exit_code, 0) << preset << "\n" << r.output;
    EXPECT_NE(r.output.find("done: 3 iterations"), std::string::npos) << preset << "\n" << r.output;
  }
}

// Qwen2.5-VL on real media: conversations with images in the formats users have
// (tests/data/vlm_data_oracle.py: messages with tags, LLaVA, typed entries, text only, two images)
// preprocessed by `loongforge-data preprocess --multimodal`, trained with --training-phase sft: the
// batches carry pixel_values / image_grid_thw cut per sample, and foundation TP 2 and PP 2 (vision
// tower at TP 1) equal one process.
// The oracle's conversations (images of several sizes) preprocessed into a multimodal store in a
// fresh directory, and the flags that train qwen2_5_vl_tiny on it; empty oracle: no .venv.
struct VlmStore {
  std::string oracle, dir;
  std::vector<std::string> data;
};
VlmStore make_vlm_store(const std::string& tag) {
  VlmStore v;
  v.oracle = lf::testing::cached_oracle(lf::testing::source_dir() + "/tests/data/vlm_data_oracle.py", "vlm_data", "done");
  if (v.oracle.empty()) return v;
  v.dir = lf::testing::make_temp_dir(tag);
  auto pre = lf::testing::run_command({bin("loongforge-data"), "preprocess", "--multimodal", "--tokenizer-model",
                                       v.oracle + "/tok", "--input", v.oracle + "/conversations.jsonl", "--output-prefix",
                                       v.dir + "/store"});
  EXPECT_EQ(pre.exit_code, 0) << pre.output;
  v.data = {"--training-phase", "sft", "--data-path", v.dir + "/store", "data.mock_data=false",
            "--split", "100,0,0", "--tokenizer-type", "HuggingFaceTokenizer",
            "--tokenizer-model", v.oracle + "/tok", "model.foundation.vocab_size=1280",
            "model.image_token_id=1208", "model.video_token_id=1209", "--seq-length", "96"};
  return v;
}

// A pipelined run's parameters: every stage's dump merged (a later stage's copy of a tensor, such as
// the vision tower's replica under --enable-full-hetero-dp, replaces the earlier one's).
TrainRun run_pipelined(int procs, int stages, const std::string& cfg, const std::vector<std::string>& extra,
                       const std::string& tag) {
  const std::string dir = lf::testing::make_temp_dir("ml-" + tag);
  TrainRun r = run(procs, cfg, extra, tag, dir);
  for (int k = 0; k < stages && r.exit_code == 0; ++k)
    for (auto& [name, v] : lf::testing::read_params(dir + "/p.safetensors.pp" + std::to_string(k))) r.params[name] = v;
  return r;
}

// A --dry-run of `flag` with `extra` on `config` (launch: loongforge-run's argv for several
// processes, or none) fails naming `key` and saying `why`.
struct Refusal {
  std::vector<std::string> launch;
  std::string config;
  std::vector<std::string> extra;
  std::string why;
};
void expect_refused(const std::string& flag, const std::string& key, const std::vector<Refusal>& cases) {
  for (const Refusal& r : cases) {
    std::vector<std::string> a = r.launch;
    a.insert(a.end(), {bin("loongforge-train"), "--config-file", r.config, "--dry-run", flag});
    a.insert(a.end(), r.extra.begin(), r.extra.end());
    auto refused = lf::testing::run_command(a);
    EXPECT_NE(refused.exit_code, 0) << refused.output;
    EXPECT_NE(refused.output.find(key), std::string::npos) << refused.output;
    EXPECT_NE(refused.output.find(r.why), std::string::npos) << refused.output;
  }
}

TEST(Qwen25Vl, MultimodalStoreTrainsAndLayoutsEqualOneProcess) {
  const VlmStore store = make_vlm_store("ml-vlm-store");
  if (store.oracle.empty()) GTEST_SKIP() << "Python oracle unavailable (.venv missing)";
  const std::string &o = store.oracle, &d = store.dir;
  const std::string cfg = config("examples/qwen2_5_vl_tiny.yaml");
  const std::vector<std::string>& data = store.data;
  std::vector<std::string> save = data;
  save.insert(save.end(), {"--save", d + "/ckpt"});
  auto one = run(1, cfg, save, "vlm_store1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("SFT multimodal data"), std::string::npos) << one.output;
  // loongforge-generate --eval-file on the checkpoint: conversations with images rendered by the
  // chat template (generation prompt), answers scored per attribute; a missing image names its line.
  {
    std::ofstream eval(d + "/eval.jsonl");
    eval << R"({"messages": [{"role": "user", "content": "<image>What colour is the square?"}], "images": [")" << o
         << R"(/img/a.png"], "answer": "It is red.", "attribute": "colour"})" << "\n";
    eval << R"({"messages": [{"role": "user", "content": "Compare <image> and <image>."}], "images": [")" << o
         << R"(/img/a.png", ")" << o << R"(/img/d.png"], "answer": "The second is square.", "attribute": "compare"})"
         << "\n";
  }
  const std::vector<std::string> gen = {bin("loongforge-generate"), "--load", d + "/ckpt", "--tokenizer-type",
                                        "HuggingFaceTokenizer", "--tokenizer-model", o + "/tok", "--max-new-tokens", "6"};
  auto scored = lf::testing::run_command(
      [&] { auto a = gen; a.insert(a.end(), {"--eval-file", d + "/eval.jsonl", "--verbose"}); return a; }());
  ASSERT_EQ(scored.exit_code, 0) << scored.output;
  EXPECT_NE(scored.output.find("attribute colour: "), std::string::npos) << scored.output;
  EXPECT_NE(scored.output.find("attribute compare: "), std::string::npos) << scored.output;
  EXPECT_NE(scored.output.find("exact match: "), std::string::npos) << scored.output;
  std::ofstream(d + "/bad.jsonl") << R"({"messages": [{"role": "user", "content": "<image>?"}], "images": ["nope.png"], "answer": "x"})"
                                  << "\n";
  auto bad_eval = lf::testing::run_command(
      [&] { auto a = gen; a.insert(a.end(), {"--eval-file", d + "/bad.jsonl"}); return a; }());
  EXPECT_NE(bad_eval.exit_code, 0);
  EXPECT_NE(bad_eval.output.find("bad.jsonl:1"), std::string::npos) << bad_eval.output;
  EXPECT_NE(bad_eval.output.find("nope.png"), std::string::npos) << bad_eval.output;
  std::vector<std::string> tp = data;
  tp.insert(tp.end(), {"--tensor-model-parallel-size", "2"});
  lf::testing::expect_same_training(one, run(2, cfg, tp, "vlm_store_tp2"), "qwen2_5_vl store: foundation tp 2");
  // --enable-encoder-hetero-dp: the two TP ranks encode alternate media (images of different sizes)
  // and all-gather the features; each medium's gradient reaches the tower once.
  std::vector<std::string> hetero = tp;
  hetero.push_back("--enable-encoder-hetero-dp");
  lf::testing::expect_same_training(one, run(2, cfg, hetero, "vlm_store_hetero"),
                                    "qwen2_5_vl store: foundation tp 2, encoder data-parallel over it");
  auto dry = lf::testing::run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", "2",
                                       bin("loongforge-train"), "--config-file", cfg, "--tensor-model-parallel-size", "2",
                                       "--enable-encoder-hetero-dp", "--dry-run"});
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("(data-parallel: each encodes its share of the media, features all-gathered)"),
            std::string::npos)
      << dry.output;
  auto tp1 = lf::testing::run_command({bin("loongforge-train"), "--config-file", cfg, "--enable-encoder-hetero-dp",
                                       "--dry-run"});
  EXPECT_EQ(tp1.exit_code, 2) << tp1.output;
  EXPECT_NE(tp1.output.find("parallel.enable_encoder_hetero_dp"), std::string::npos) << tp1.output;
  auto text_model = lf::testing::run_command({bin("loongforge-train"), "--config-file", config("examples/spliced_lm_tiny.yaml"),
                                              "--enable-encoder-hetero-dp", "--dry-run"});
  EXPECT_NE(text_model.exit_code, 0) << text_model.output;
  EXPECT_NE(text_model.output.find("has no vision tower"), std::string::npos) << text_model.output;
  // --use-vit-dp-balance: at DP 2 each micro-batch's media (images of different sizes) are spread
  // over the two ranks by cost before the tower and their features sent home after it; the first
  // exchange is logged, and training equals one process (the DP split alone is DP 2's test).
  std::vector<std::string> vit = data;
  vit.push_back("--use-vit-dp-balance");
  auto balanced = run(2, cfg, vit, "vlm_store_vit_balance");
  EXPECT_NE(balanced.output.find("--use-vit-dp-balance: first exchange: "), std::string::npos) << balanced.output;
  lf::testing::expect_same_training(one, balanced, "qwen2_5_vl store: dp 2, media balanced over it before the tower");
  // With foundation TP 2 both TP replicas of the tower balance over their DP group and each still
  // contributes 1 / tp of the tower's gradient.
  std::vector<std::string> vit_tp = vit;
  vit_tp.insert(vit_tp.end(), {"--tensor-model-parallel-size", "2"});
  lf::testing::expect_same_training(one, run(4, cfg, vit_tp, "vlm_store_vit_balance_tp2"),
                                    "qwen2_5_vl store: tp 2 x dp 2, media balanced over dp before the tower");
  std::vector<std::string> vit_cp = vit;
  vit_cp.insert(vit_cp.end(), {"--context-parallel-size", "2"});
  lf::testing::expect_same_training(one, run(4, cfg, vit_cp, "vlm_store_vit_balance_cp2"),
                                    "qwen2_5_vl store: cp 2 x dp 2, media balanced over dp before the tower");
  // Refusals, each naming the key: DP 1 (nothing to balance), with --enable-encoder-hetero-dp.
  const std::vector<std::string> two = {bin("loongforge-run"), "--standalone", "--nproc-per-node", "2"};
  expect_refused("--use-vit-dp-balance", "parallel.use_vit_dp_balance",
                 {{{}, cfg, {}, "the data-parallel size is 1"},
                  {two, cfg, {"--tensor-model-parallel-size", "2", "--enable-encoder-hetero-dp"}, "not combined"}});
  auto vit_dry = lf::testing::run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", "2",
                                           bin("loongforge-train"), "--config-file", cfg, "--use-vit-dp-balance",
                                           "--dry-run"});
  EXPECT_EQ(vit_dry.exit_code, 0) << vit_dry.output;
  EXPECT_NE(vit_dry.output.find("media balanced over the DP ranks before it"), std::string::npos) << vit_dry.output;
  auto vit_text = lf::testing::run_command({bin("loongforge-train"), "--config-file", config("examples/spliced_lm_tiny.yaml"),
                                            "--use-vit-dp-balance", "--dry-run"});
  EXPECT_NE(vit_text.exit_code, 0) << vit_text.output;
  EXPECT_NE(vit_text.output.find("has no vision tower"), std::string::npos) << vit_text.output;
  std::vector<std::string> pp = data;
  pp.insert(pp.end(), {"--pipeline-model-parallel-size", "2"});
  lf::testing::expect_same_training(one, run_pipelined(2, 2, cfg, pp, "vlm_store_pp2"), "qwen2_5_vl store: foundation pp 2");
  // --packing-sft-data: several conversations with their images per row (M-RoPE positions restart
  // per conversation; tests/models/test_qwen2_5_vl.cpp checks packed == each in its own row); the
  // packed rows under CP 2 (documents and images crossing the chunks) equal one process.
  std::vector<std::string> packed = data;
  packed.push_back("--packing-sft-data");
  auto packed1 = run(1, cfg, packed, "vlm_store_packed");
  ASSERT_EQ(packed1.exit_code, 0) << packed1.output;
  EXPECT_NE(packed1.losses, one.losses) << "packing changed nothing";
  std::vector<std::string> packed_cp = packed;
  packed_cp.insert(packed_cp.end(), {"--context-parallel-size", "2"});
  lf::testing::expect_same_training(packed1, run(2, cfg, packed_cp, "vlm_store_packed_cp2"),
                                    "qwen2_5_vl store, packed conversations: foundation cp 2");
  // The store's placeholder ids must be the model's; a text model refuses a multimodal store.
  std::vector<std::string> wrong = data;
  wrong.push_back("model.image_token_id=1207");
  auto bad = run(1, cfg, wrong, "vlm_store_bad");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("uses image token id 1208 but model.image_token_id is 1207"), std::string::npos)
      << bad.output;
  auto no_sft = run(1, cfg, {"--data-path", d + "/store", "data.mock_data=false"}, "vlm_store_nosft");
  EXPECT_NE(no_sft.exit_code, 0);
  EXPECT_NE(no_sft.output.find("--training-phase sft"), std::string::npos) << no_sft.output;
}

// --enable-full-hetero-dp: a tower replica on every rank; before the pipeline runs, the step's media
// (2 micro-batches of conversations with images of several sizes) are scattered over the
// foundation's TP x PP (x CP) ranks and their features sent to the first stage; the tower's backward
// runs after the step's last backward. PP 2, TP 2 x PP 2 (with ZeRO-1 and overlapped reduction),
// CP 2 x PP 2 and DP 2 x PP 2 equal one process (the
// tower's parameters compared from the last stage's replica); --dry-run shows the layout and the
// tower's memory on every stage; the refusals name the key.
TEST(Qwen25Vl, FullHeteroDpEqualsOneProcess) {
  const VlmStore store = make_vlm_store("ml-vlm-full-hetero");
  if (store.oracle.empty()) GTEST_SKIP() << "Python oracle unavailable (.venv missing)";
  const std::string cfg = config("examples/qwen2_5_vl_tiny.yaml");
  auto one = run(1, cfg, store.data, "vlm_full1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  struct Layout {
    int procs;
    std::vector<std::string> flags;
    std::string what;
  };
  int case_index = 0;
  for (const Layout& l : std::vector<Layout>{
           {2, {"--pipeline-model-parallel-size", "2"}, "pp 2"},
           {4,
            {"--use-distributed-optimizer", "--overlap-grad-reduce", "--tensor-model-parallel-size", "2",
             "--pipeline-model-parallel-size", "2"},
            "tp 2 x pp 2, ZeRO-1 (the tower's optimizer over all 4 ranks), overlapped reduction"},
           {4, {"--pipeline-model-parallel-size", "2", "--context-parallel-size", "2"}, "cp 2 x pp 2"},
           {4, {"--pipeline-model-parallel-size", "2"}, "dp 2 x pp 2 (a share group per DP rank)"}}) {
    std::vector<std::string> a = store.data;
    a.insert(a.end(), l.flags.begin(), l.flags.end());
    a.push_back("--enable-full-hetero-dp");
    auto r = run_pipelined(l.procs, 2, cfg, a, "vlm_full_" + std::to_string(case_index++));
    EXPECT_NE(r.output.find("--enable-full-hetero-dp: the first step's media: "), std::string::npos) << r.output;
    const std::string what = "qwen2_5_vl store: " + l.what + ", tower over every rank";
    lf::testing::expect_same_training(one, r, what.c_str());
  }
  const std::vector<std::string> four = {bin("loongforge-run"), "--standalone", "--nproc-per-node", "4"};
  std::vector<std::string> dry = four;
  dry.insert(dry.end(), {bin("loongforge-train"), "--config-file", cfg, "--tensor-model-parallel-size", "2",
                         "--pipeline-model-parallel-size", "2", "--enable-full-hetero-dp", "--dry-run"});
  auto shown = lf::testing::run_command(dry);
  EXPECT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_NE(shown.output.find("4 replica(s) per foundation DP rank, one on every rank of its TP x PP group"),
            std::string::npos)
      << shown.output;
  const size_t stage1 = shown.output.find("  stage 1:\n");  // the estimates' section
  ASSERT_NE(stage1, std::string::npos) << shown.output;
  EXPECT_NE(shown.output.find("    vision_encoder  ", stage1), std::string::npos) << shown.output;
  EXPECT_NE(shown.output.find("the step's 2 micro-batches' media / 4 ranks", stage1), std::string::npos) << shown.output;
  // Without it the tower's memory shows on the first stage only.
  dry.pop_back(), dry.pop_back();
  dry.push_back("--dry-run");
  auto plain = lf::testing::run_command(dry);
  EXPECT_EQ(plain.exit_code, 0) << plain.output;
  const size_t plain1 = plain.output.find("  stage 1:\n");
  ASSERT_NE(plain1, std::string::npos) << plain.output;
  EXPECT_NE(plain.output.rfind("    vision_encoder  ", plain1), std::string::npos) << plain.output;
  EXPECT_EQ(plain.output.find("    vision_encoder  ", plain1), std::string::npos) << plain.output;
  const std::vector<std::string> two = {bin("loongforge-run"), "--standalone", "--nproc-per-node", "2"};
  expect_refused("--enable-full-hetero-dp", "parallel.enable_full_hetero_dp",
                 {{{}, cfg, {}, "it would do nothing"},
                  {two, cfg, {"--tensor-model-parallel-size", "2", "--enable-encoder-hetero-dp"}, "not combined"},
                  {two, cfg, {"--tensor-model-parallel-size", "2", "--use-vit-dp-balance"}, "not combined"},
                  {{}, config("examples/spliced_lm_tiny.yaml"), {}, "has no vision tower"}});
}

// Qwen3-VL on the multimodal store (images cut with the tower's patch 14; the DeepStack rows ride
// beside the merged features in every exchange): foundation TP 2 with the tower data-parallel over
// it, DP 2 with the media balanced before the tower, and TP 2 x PP 2 with the tower over every rank
// equal one process. A store cut with another patch size and a store with a video are refused,
// naming the store and the key.
TEST(Qwen3Vl, MultimodalStoreAndVisionTowerModesEqualOneProcess) {
  VlmStore store = make_vlm_store("ml-qwen3vl-store");
  if (store.oracle.empty()) GTEST_SKIP() << "Python oracle unavailable (.venv missing)";
  const std::string cfg = config("examples/qwen3_vl_tiny.yaml");
  std::vector<std::string> data = store.data;
  data.push_back("++model.vision_encoder.patch_size=14");
  auto one = run(1, cfg, data, "qwen3vl_store1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("SFT multimodal data"), std::string::npos) << one.output;
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), data.begin(), data.end());
    return extra;
  };
  lf::testing::expect_same_training(
      one, run(2, cfg, with({"--tensor-model-parallel-size", "2", "--enable-encoder-hetero-dp"}), "qwen3vl_hetero"),
      "qwen3_vl store: tp 2, the tower data-parallel over it");
  auto balanced = run(2, cfg, with({"--use-vit-dp-balance"}), "qwen3vl_vit_balance");
  EXPECT_NE(balanced.output.find("--use-vit-dp-balance: first exchange: "), std::string::npos) << balanced.output;
  lf::testing::expect_same_training(one, balanced, "qwen3_vl store: dp 2, media balanced before the tower");
  auto full = run_pipelined(4, 2, cfg,
                            with({"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                  "--enable-full-hetero-dp"}),
                            "qwen3vl_full");
  EXPECT_NE(full.output.find("--enable-full-hetero-dp: the first step's media: "), std::string::npos) << full.output;
  lf::testing::expect_same_training(one, full, "qwen3_vl store: tp 2 x pp 2, the tower over every rank");
  // The tower's default patch 16 against the store's 14.
  auto patch = run(1, cfg, store.data, "qwen3vl_store_patch");
  EXPECT_NE(patch.exit_code, 0);
  EXPECT_NE(patch.output.find("cut its media with patch_size 14 but model.vision_encoder.patch_size is 16"),
            std::string::npos)
      << patch.output;
  // A video: Qwen3-VL's processor renders each frame after its timestamp, the store one run.
  std::vector<lf::media::Image> frames;
  for (int t = 0; t < 4; ++t) {
    lf::media::Image im{56, 56, std::vector<uint8_t>(56 * 56 * 3)};
    for (size_t i = 0; i < im.rgb.size(); ++i) im.rgb[i] = uint8_t((i * 7 + t * 40) % 256);
    frames.push_back(std::move(im));
  }
  lf::media::write_video(frames, 2.0, store.dir + "/clip.mkv");
  std::ofstream(store.dir + "/v.jsonl") << R"({"messages": [{"role": "user", "content": "<video>What moves?"}, )"
                                        << R"({"role": "assistant", "content": "Nothing."}], "videos": [")"
                                        << store.dir << R"(/clip.mkv"]})" << "\n";
  auto pre = lf::testing::run_command({bin("loongforge-data"), "preprocess", "--multimodal", "--tokenizer-model",
                                       store.oracle + "/tok", "--input", store.dir + "/v.jsonl", "--output-prefix",
                                       store.dir + "/videos", "--video-min-pixels", "3136", "--video-max-pixels",
                                       "6272"});
  ASSERT_EQ(pre.exit_code, 0) << pre.output;
  std::vector<std::string> videos = data;
  videos[3] = store.dir + "/videos";  // --data-path
  ASSERT_EQ(data[2], "--data-path");
  auto refused = run(1, cfg, videos, "qwen3vl_store_video");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("holds a video, but qwen3_vl reads a video as one run of placeholders per frame"),
            std::string::npos)
      << refused.output;
}

// The raw bytes of an oracle's tensors (F32 / I64), by name: what a --vision-inputs file is cut from.
struct RawTensor {
  lf::safetensors::DType dtype;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};
std::map<std::string, RawTensor> read_raw(const std::string& file) {
  const auto r = lf::safetensors::Reader::open(file);
  std::map<std::string, RawTensor> out;
  for (const auto& info : r.tensors()) {
    const char* p = reinterpret_cast<const char*>(r.data(info));
    out[info.name] = {info.dtype, info.shape, std::vector<char>(p, p + (info.end - info.begin))};
  }
  return out;
}

// loongforge-convert on the directories transformers' save_pretrained writes for the tiny random
// Qwen3-VL (tests/models/qwen3_vl_oracle.py) and InternVL (tests/models/internvl_oracle.py; its files
// keep the original checkpoint's names, language_model.model.* ...): hf2lf into a TP 2 checkpoint,
// lf2hf back in fp32 gives every tensor bit for bit under the same names, and config.json the
// family's fields (interleaved M-RoPE and DeepStack taps; the projector's downsample_ratio).
TEST(VlmConversion, HfToTp2CheckpointAndBackIsBitExact) {
  struct Family {
    std::string oracle, name, architecture, tower, field;
  };
  for (const Family& f : std::vector<Family>{
           {"qwen3_vl_oracle.py", "qwen3_vl_oracle", "Qwen3VLForConditionalGeneration (qwen3_vl", "type: qwen3_vl_vision",
            "\"mrope_interleaved\": true"},
           {"internvl_oracle.py", "internvl_oracle", "InternVLForConditionalGeneration (internvl", "type: intern_vit",
            "\"downsample_ratio\": 0.5"}}) {
    const std::string o =
        lf::testing::cached_oracle(lf::testing::source_dir() + "/tests/models/" + f.oracle, f.name, "io.safetensors");
    if (o.empty()) GTEST_SKIP() << "Python oracle unavailable (.venv missing)";
    const std::string d = lf::testing::make_temp_dir("ml-vlm-convert");
    auto in = lf::testing::run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", o + "/hf", "--out", d + "/lf",
                                        "--tp", "2"});
    ASSERT_EQ(in.exit_code, 0) << in.output;
    EXPECT_NE(in.output.find(f.architecture), std::string::npos) << in.output;
    EXPECT_NE(lf::testing::read_file(d + "/lf/iter_0000000/config.yaml").find(f.tower), std::string::npos) << f.name;
    auto out = lf::testing::run_command({bin("loongforge-convert"), "lf2hf", "--load", d + "/lf", "--out", d + "/hf",
                                         "--dtype", "fp32"});
    ASSERT_EQ(out.exit_code, 0) << out.output;
    const Params want = lf::testing::read_params(o + "/hf/model.safetensors"),
                 got = lf::testing::read_params(d + "/hf/model.safetensors");
    EXPECT_EQ(want.size(), got.size()) << f.name;
    for (const auto& [name, v] : want) {
      auto it = got.find(name);
      ASSERT_NE(it, got.end()) << f.name << ": " << name;
      EXPECT_EQ(v, it->second) << f.name << ": " << name;
    }
    const std::string config = lf::testing::read_file(d + "/hf/config.json");
    EXPECT_NE(config.find(f.field), std::string::npos) << config;
    // loongforge-generate on the TP 2 checkpoint: sample 0's ids and media as --vision-inputs (the
    // processor's tensors: Qwen3-VL's first image's 24 patch rows and grid, InternVL's first two
    // tiles), its logits equal transformers'.
    auto io = read_raw(o + "/io.safetensors");
    const RawTensor &ids = io.at("input_ids"), &pixels = io.at("pixel_values");
    const auto* id = reinterpret_cast<const int64_t*>(ids.bytes.data());
    std::string ids_text;
    for (int64_t i = 0; i < ids.shape[1]; ++i) ids_text += (i ? "," : "") + std::to_string(id[i]);
    lf::safetensors::Writer w;
    const bool qwen3 = f.name == "qwen3_vl_oracle";
    const int64_t rows = qwen3 ? 24 : 2;  // sample 0's media
    std::vector<int64_t> shape = pixels.shape;
    shape[0] = rows;
    w.add("pixel_values", pixels.dtype, shape, pixels.bytes.data());
    if (qwen3) w.add("image_grid_thw", io.at("image_grid_thw").dtype, {1, 3}, io.at("image_grid_thw").bytes.data());
    w.write(d + "/inputs.safetensors");
    auto gen = lf::testing::run_command({bin("loongforge-generate"), "--load", d + "/lf", "--input-ids", ids_text,
                                         "--vision-inputs", d + "/inputs.safetensors", "--dump-logits",
                                         d + "/logits.safetensors"});
    ASSERT_EQ(gen.exit_code, 0) << gen.output;
    const auto want_logits = read_raw(o + "/io.safetensors").at("logits"),
               got_logits = read_raw(d + "/logits.safetensors").at("logits");
    const auto* a = reinterpret_cast<const float*>(got_logits.bytes.data());
    const auto* b = reinterpret_cast<const float*>(want_logits.bytes.data());  // [2, s, v]: sample 0 first
    const size_t n = got_logits.bytes.size() / sizeof(float);
    ASSERT_EQ(got_logits.shape[0], ids.shape[1]) << f.name;
    double worst = 0;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
    std::printf("%s: loongforge-generate on the TP 2 checkpoint, max |logits - transformers| = %.3g\n", f.name.c_str(),
                worst);
    EXPECT_LE(worst, 1e-4) << f.name;
    // --image is qwen2_5_vl's preprocessing: refused for these, naming the flag.
    auto image = lf::testing::run_command({bin("loongforge-generate"), "--load", d + "/lf", "--input-ids", ids_text,
                                           "--image", o + "/io.safetensors"});
    EXPECT_NE(image.exit_code, 0);
    EXPECT_NE(image.output.find("--image is built for qwen2_5_vl models"), std::string::npos) << image.output;
  }
}

// Frozen encoder: no gradients, no optimizer state; its weights stay as initialised (a run at
// lr 0 shows them) while the foundation trains, and the heterogeneous layout still equals one
// process.
TEST(SplicedLm, FrozenEncoderStaysFixedAndHeterogeneousLayoutStillEqualsOneProcess) {
  const std::vector<std::string> freeze = {"model.image_encoder.freeze=true"};
  auto one = run(1, kSpliced, freeze, "frozen1");
  auto two = run(2, kSpliced, {"--tensor-model-parallel-size", "2", "model.image_encoder.freeze=true"}, "frozen2");
  lf::testing::expect_same_training(one, two, "spliced_lm, frozen encoder: encoder tp 1, foundation tp 2");
  auto initial = run(1, kSpliced, {"--lr", "0", "--min-lr", "0"}, "frozen_init");
  ASSERT_EQ(initial.exit_code, 0) << initial.output;
  const auto enc = only(one.params, "image_encoder.", true), enc0 = only(initial.params, "image_encoder.", true);
  ASSERT_FALSE(enc.empty());
  EXPECT_EQ(lf::testing::max_abs_diff(enc, enc0), 0.0) << "a frozen encoder does not move";
  EXPECT_GT(lf::testing::max_abs_diff(only(one.params, "image_encoder.", false), only(initial.params, "image_encoder.", false)),
            1e-4)
      << "the foundation trains";
  EXPECT_NE(one.output.find("1 group(s)"), std::string::npos) << "only the foundation has a gradient buffer";
}

TEST(SplicedLm, DryRunPrintsEveryComponentsLayout) {
  auto r = lf::testing::run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", "2", bin("loongforge-train"),
                                     "--config-file", kSpliced, "--tensor-model-parallel-size", "2", "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("foundation     decoder, 107328 parameters | tp 2, pp 1, dp 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("image_encoder  mlp_encoder, 5248 parameters | tp 1, 2 replica(s) per foundation TP group"),
            std::string::npos)
      << r.output;
  // A layout the encoder cannot take is a configuration error naming its key.
  auto bad = lf::testing::run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", "2",
                                       bin("loongforge-train"), "--config-file", kSpliced, "--tensor-model-parallel-size",
                                       "2", "model.image_encoder.tensor_model_parallel_size=4", "--dry-run"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("model.image_encoder.tensor_model_parallel_size"), std::string::npos) << bad.output;
  // Real data is not read yet (multimodal records come with the VLM work): refused, not ignored.
  auto data = lf::testing::run_command({bin("loongforge-train"), "--config-file", kSpliced, "--data-path", "/x/y",
                                        "++data.mock_data=false", "--dry-run"});
  EXPECT_EQ(data.exit_code, 2) << data.output;
  EXPECT_NE(data.output.find("--mock-data only"), std::string::npos) << data.output;
}

// The DiT skeleton: bidirectional attention and a per-sample MSE on float targets through the same
// trainer; DP 2 equals DP 1 (each rank averages nothing itself: the loss is normalised by the
// samples of the whole global batch).
TEST(FeatureRegression, DataParallelEqualsOneProcess) {
  const std::string cfg = config("examples/feature_regression_tiny.yaml");
  auto one = run(1, cfg, {}, "fr1");
  auto two = run(2, cfg, {}, "fr2");
  lf::testing::expect_same_training(one, two, "feature_regression: dp 2");
  ASSERT_FALSE(one.losses.empty());
  // Context parallelism is refused by name (it ran each sequence whole on both CP ranks, and the
  // loss and gradient came out doubled).
  auto cp = run(2, cfg, {"--context-parallel-size", "2"}, "fr_cp");
  EXPECT_NE(cp.exit_code, 0) << cp.output;
  EXPECT_NE(cp.output.find("parallel.context_parallel_size: feature_regression has no context parallelism"),
            std::string::npos)
      << cp.output;
  auto ep = run(2, cfg, {"--expert-model-parallel-size", "2"}, "fr_ep");
  EXPECT_NE(ep.exit_code, 0) << ep.output;
  EXPECT_NE(ep.output.find("parallel.expert_model_parallel_size: feature_regression has no MoE experts"),
            std::string::npos)
      << ep.output;
  // It learns the reversal (the loss falls below the targets' variance of 1).
  auto longer = run(1, cfg, {"--train-iters", "60"}, "fr_long");
  ASSERT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_LT(longer.losses.back(), 0.8 * longer.losses.front()) << longer.output;
}

// A checkpoint saved at TP 1 records every parameter's split (parallel/sharding.h), so the offline
// reshard to TP 2 writes real TP shards, and TP 2 continues the run as the TP 1 run does.
TEST(Resharding, Tp1CheckpointReshardedOfflineToTp2LoadsAndTrains) {
  const std::string demo = config("demo.yaml");
  const std::vector<std::string> common = {"--global-batch-size", "8", "--micro-batch-size", "2", "--eval-iters", "0",
                                           "--lr-warmup-iters", "2"};
  auto dir = lf::testing::make_temp_dir("reshard-tp1");
  auto straight = run(1, demo, common, "reshard_straight");
  auto first = common;
  first.insert(first.end(), {"--save", dir + "/ck", "--exit-interval", "5"});
  auto a = run(1, demo, first, "reshard_first");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto r = lf::testing::run_command({bin("loongforge-convert"), "reshard", "--load", dir + "/ck", "--save", dir + "/tp2",
                                     "--tp", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"model_tp0_pp0.safetensors", "model_tp1_pp0.safetensors"})
    EXPECT_TRUE(fs::exists(dir + "/tp2/iter_0000005/" + f)) << f;
  auto second = common;
  second.insert(second.end(), {"--load", dir + "/tp2", "--tensor-model-parallel-size", "2"});
  auto b = run(2, demo, second, "reshard_second");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("loaded checkpoint"), std::string::npos) << b.output;
  ASSERT_EQ(b.losses.size(), 5u) << b.output;  // iterations 6..10
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(b.losses[i], straight.losses[5 + i], 1e-5 * straight.losses[5 + i]) << "iteration " << 6 + i;
  EXPECT_LE(lf::testing::max_abs_diff(straight.params, b.params), 1e-5);
}

}  // namespace

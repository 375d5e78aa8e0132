// The `pi05` composite against LeRobot 0.6's PI05Policy (tests/models/pi05_oracle.py, run in the
// LeRobot venv; Python as an oracle only): tiny random policies as LeRobot's save_pretrained writes
// them convert by shape (models/pi05_lerobot.h) and give PI05Pytorch.forward's element-wise loss,
// sample_actions' Euler-sampled actions on a fixed batch with fixed noise and time, and the prefix
// LM's per-token cross entropy (PaliGemma's lm_head on the prefix pass) within 1e-4 fp32
// (max abs), at TP 1 and TP 2 (one key/value head: replicated keys/values). The conversion round
// trip writes what LeRobot loads (checked by the program tests); malformed directories are errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "../parallel/tp_testing.h"
#include "cached_oracle.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/composites/pi05.h"
#include "loongforge/models/pi05_lerobot.h"
#include "multiprocess.h"

namespace {
namespace fs = std::filesystem;
namespace lr = lf::models::lerobot;
using lf::models::Pi05;
using lf::models::Pi05Inputs;

// fp32, the same ops in another order (LeRobot's eager attention vs our backend's SDPA, conv vs
// conv, one more Euler accumulation per step).
constexpr double kTolerance = 1e-4;

std::string oracle_dir() {
  static const std::string dir = lf::testing::cached_oracle(lf::testing::source_dir() + "/tests/models/pi05_oracle.py",
                                                            "pi05_oracle", "done", lf::testing::lerobot_python());
  return dir;
}

#define REQUIRE_ORACLE()                                                                  \
  if (oracle_dir().empty()) GTEST_SKIP() << "no LeRobot environment (.venv-lerobot)"; \
  ASSERT_TRUE(fs::exists(oracle_dir() + "/done"))

// prefix_lm: with model.prefix_lm_loss_weight > 0 (the prefix LM's head read and trained).
std::unique_ptr<Pi05> load(const std::string& dir, const lf::dist::ParallelContext* ctx = nullptr,
                           bool prefix_lm = false) {
  auto s = lr::read_pi05_setup(dir);
  if (prefix_lm) s.policy.prefix_lm_loss_weight = 1;
  auto m = std::make_unique<Pi05>(s.vision, s.vlm, s.expert, s.policy, lf::backend::cpu_backend(), 7, at::kFloat, ctx);
  m->load_full(lr::read_pi05_weights(dir, at::kFloat), dir);
  return m;
}

Pi05Inputs inputs(const std::map<std::string, at::Tensor>& t) {
  return {t.at("images"), t.at("img_masks").to(at::kBool), t.at("tokens"), t.at("masks").to(at::kBool)};
}

// max |loss - LeRobot's|, max |actions - LeRobot's|
std::pair<double, double> differences(const Pi05& m, const std::string& dir) {
  auto in = lf::testing::read_safetensors(dir + "/inputs.safetensors");
  auto want = lf::testing::read_safetensors(dir + "/expected.safetensors");
  at::NoGradGuard no_grad;
  auto loss = m.losses(inputs(in), in.at("actions"), in.at("noise"), in.at("time"));
  auto actions = m.sample_actions(inputs(in), in.at("noise"));
  EXPECT_EQ(loss.sizes(), want.at("loss").sizes());
  EXPECT_EQ(actions.sizes(), want.at("actions").sizes());
  return {(loss - want.at("loss")).abs().max().item<double>(), (actions - want.at("actions")).abs().max().item<double>()};
}

// max |per-token prefix LM cross entropy - PaliGemma lm_head's on LeRobot's prefix pass|
double prefix_lm_difference(const Pi05& m, const std::string& dir) {
  auto in = lf::testing::read_safetensors(dir + "/inputs.safetensors");
  auto want = lf::testing::read_safetensors(dir + "/expected.safetensors");
  at::NoGradGuard no_grad;
  auto got = m.prefix_lm_losses(inputs(in), want.at("prompt_labels"));
  EXPECT_EQ(got.sizes(), want.at("prefix_lm_losses").sizes());
  EXPECT_EQ(got.eq(0).sum().item<int64_t>(), 2) << "the two -100 labels, and only they, cost nothing";
  return (got - want.at("prefix_lm_losses")).abs().max().item<double>();
}

TEST(Pi05, LossAndSampledActionsMatchLeRobot) {
  REQUIRE_ORACLE();
  for (const char* name : {"two_cameras", "wide"}) {
    const std::string dir = oracle_dir() + "/" + name;
    auto m = load(dir + "/policy");
    auto [loss, actions] = differences(*m, dir);
    std::printf("[pi05 parity] %s TP=1: max |loss - LeRobot| = %.3g, max |actions - LeRobot| = %.3g\n", name, loss,
                actions);
    EXPECT_LE(loss, kTolerance) << name;
    EXPECT_LE(actions, kTolerance) << name;
    EXPECT_THROW(m->prefix_lm_losses({}, {}), lf::Error);  // weight 0: no head
    const double lm = prefix_lm_difference(*load(dir + "/policy", nullptr, true), dir);
    std::printf("[pi05 parity] %s TP=1: max |prefix LM cross entropy - PaliGemma's| = %.3g\n", name, lm);
    EXPECT_LE(lm, kTolerance) << name;
  }
}

// The flow loss and sampling run the prefix on its valid tokens alone: a missing camera's image
// never reaches the tower (a NaN image changes no bit; run through the tower its NaN tokens would
// meet a zero probability and give NaN), and a batch whose padding is packed away equals each
// sample run alone with its padding cut off.
TEST(Pi05, PaddingAndMissingCamerasAreSkipped) {
  REQUIRE_ORACLE();
  const std::string dir = oracle_dir() + "/two_cameras";
  auto m = load(dir + "/policy");
  auto t = lf::testing::read_safetensors(dir + "/inputs.safetensors");
  auto in = inputs(t);
  const int64_t cams = in.images.size(0), b = in.images.size(1), L = in.tokens.size(1);
  ASSERT_FALSE(in.img_masks[cams - 1][b - 1].item<bool>()) << "the oracle's last sample misses a camera";
  ASSERT_LT(in.masks[b - 1].sum().item<int64_t>(), L) << "and pads its prompt";
  at::NoGradGuard no_grad;
  const auto loss = m->losses(in, t.at("actions"), t.at("noise"), t.at("time"));
  const auto actions = m->sample_actions(in, t.at("noise"));
  auto nan = in;
  nan.images = in.images.clone();
  nan.images[cams - 1][b - 1].fill_(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(m->losses(nan, t.at("actions"), t.at("noise"), t.at("time")).equal(loss));
  EXPECT_TRUE(m->sample_actions(nan, t.at("noise")).equal(actions));
  // The last sample alone, its prompt cut to its valid tokens (no padding left to pack).
  const int64_t valid = in.masks[b - 1].sum().item<int64_t>();
  auto one = [&](const at::Tensor& x) { return x.narrow(0, b - 1, 1); };
  Pi05Inputs cut{in.images.narrow(1, b - 1, 1).narrow(0, 0, cams - 1), in.img_masks.narrow(1, b - 1, 1).narrow(0, 0, cams - 1),
                 one(in.tokens).narrow(1, 0, valid), one(in.masks).narrow(1, 0, valid)};
  const auto alone = m->losses(cut, one(t.at("actions")), one(t.at("noise")), one(t.at("time")));
  EXPECT_LT((alone - one(loss)).abs().max().item<double>(), 1e-5);
  EXPECT_LT((m->sample_actions(cut, one(t.at("noise"))) - one(actions)).abs().max().item<double>(), 1e-5);
}

LF_WORKER_CASE(pi05_parity_tp2) {
  const std::string dir = lf::testing::worker_args().at(0);
  auto ctx = lf::testing::make_context(2);
  for (const char* name : {"two_cameras", "wide"}) {
    auto m = load(dir + "/" + name + "/policy", ctx.get());
    auto [loss, actions] = differences(*m, dir + "/" + name);
    std::printf("[pi05 parity] %s TP=2 rank %d: loss %.3g, actions %.3g\n", name, lf::testing::worker_rank(), loss,
                actions);
    EXPECT_LE(loss, kTolerance) << name;
    EXPECT_LE(actions, kTolerance) << name;
    EXPECT_LE(prefix_lm_difference(*load(dir + "/" + name + "/policy", ctx.get(), true), dir + "/" + name), kTolerance)
        << name << " prefix LM";
  }
}

TEST(Pi05, LossAndSampledActionsMatchLeRobotAtTp2) {
  REQUIRE_ORACLE();
  auto results = lf::testing::run_workers("pi05_parity_tp2", {.world_size = 2, .args = {oracle_dir()}});
  lf::testing::expect_all_ok(results);
}

TEST(Pi05, SetupComesFromTheWeightsShapes) {
  REQUIRE_ORACLE();
  const auto s = lr::read_pi05_setup(oracle_dir() + "/wide/policy");
  EXPECT_EQ(s.vision.hidden_size, 48);
  EXPECT_EQ(s.vision.patch_size, 8);
  EXPECT_EQ(s.vision.image_size, 24);
  EXPECT_EQ(s.vision.num_hidden_layers, 1);
  EXPECT_EQ(s.vision.num_attention_heads, 16);
  EXPECT_EQ(s.vlm.width, 48);
  EXPECT_EQ(s.vlm.depth, 3);
  EXPECT_EQ(s.vlm.num_kv_heads, 2);
  EXPECT_EQ(s.vlm.head_dim, 8);
  EXPECT_EQ(s.vlm.vocab_size, 300);
  EXPECT_EQ(s.expert.width, 40);
  EXPECT_EQ(s.expert.mlp_dim, 56);
  EXPECT_EQ(s.expert.vocab_size, 0);
  EXPECT_EQ(s.policy.chunk_size, 4);
  EXPECT_EQ(s.policy.max_action_dim, 5);
  EXPECT_EQ(s.policy.num_inference_steps, 4);
}

// TFLOP/s in the training log counts the data's cameras and prompt length (a LeRobot dataset's, not
// the mock data's) once the model has seen a batch: one camera and a shorter prompt than the mock
// settings here.
TEST(Pi05, ThroughputCountsTheCamerasAndPromptOfTheData) {
  REQUIRE_ORACLE();
  const std::string dir = oracle_dir() + "/two_cameras";
  auto m = load(dir + "/policy");
  auto in = lf::testing::read_safetensors(dir + "/inputs.safetensors");
  const int64_t b = in.at("actions").size(0), tokens = in.at("tokens").size(1) - 1;
  lf::data::Batch batch;
  batch.set("images", in.at("images").narrow(0, 0, 1).transpose(0, 1).contiguous());
  batch.set("image_masks", in.at("img_masks").narrow(0, 0, 1).transpose(0, 1).contiguous());
  batch.set("prompt_tokens", in.at("tokens").narrow(1, 0, tokens).contiguous(), 1);
  batch.set("prompt_masks", in.at("masks").narrow(1, 0, tokens).contiguous(), 1);
  batch.set("actions", in.at("actions"));
  for (int64_t i = 0; i < b; ++i) batch.sample_indices.push_back(i);
  const auto flops = [&](int64_t cams, int64_t prompt) {
    const double img = static_cast<double>(cams * m->vision_config().tokens_per_image());
    return 6.0 * (static_cast<double>(m->vision_config().num_parameters()) * img +
                  static_cast<double>(m->vlm_config().num_parameters(false)) * (img + static_cast<double>(prompt)) +
                  static_cast<double>(m->expert_config().num_parameters(true) * m->config().chunk_size));
  };
  const auto& c = m->config();
  ASSERT_TRUE(c.mock_cameras != 1 || c.mock_tokens != tokens) << "the check needs data unlike the mock settings";
  EXPECT_DOUBLE_EQ(m->flops_per_sample(0), flops(c.mock_cameras, c.mock_tokens));
  m->stage_forward(batch, {}, 0, lf::models::Pass::eval);
  EXPECT_DOUBLE_EQ(m->flops_per_sample(0), flops(1, tokens));
}

TEST(Pi05, RoundTripKeepsEveryTensor) {
  REQUIRE_ORACLE();
  const std::string src = oracle_dir() + "/two_cameras/policy";
  const auto s = lr::read_pi05_setup(src);
  auto full = lr::checked_pi05_tensors(s, lr::read_pi05_weights(src, at::kFloat), src);
  const fs::path out = fs::path(lf::testing::binary_dir()) / "test-tmp" / "pi05_round_trip";
  fs::remove_all(out);
  std::ifstream cfg(src + "/config.json");
  const std::string text{std::istreambuf_iterator<char>(cfg), std::istreambuf_iterator<char>()};
  lr::write_pi05(out.string(), s, full, at::kFloat, text);
  auto a = lf::testing::read_safetensors(src + "/model.safetensors");
  auto b = lf::testing::read_safetensors((out / "model.safetensors").string());
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    if (name.find("gemma_expert.lm_head") != std::string::npos) continue;  // nothing reads it: written as zeros
    EXPECT_TRUE(at::equal(t, b.at(name))) << name;
  }
}

TEST(Pi05, MalformedDirectoriesAreErrors) {
  REQUIRE_ORACLE();
  const std::string src = oracle_dir() + "/two_cameras/policy";
  const auto s = lr::read_pi05_setup(src);
  auto tensors = lr::read_pi05_weights(src, at::kFloat);
  tensors.erase("action_in_proj.weight");
  try {
    lr::checked_pi05_tensors(s, tensors, "DIR");
    FAIL() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("action_in_proj.weight"), std::string::npos) << e.what();
  }
  // Loading into a model: a missing tensor and an unknown one are named.
  auto m = load(src);
  auto extra = lr::read_pi05_weights(src, at::kFloat);
  extra["not_a_parameter.weight"] = at::zeros({1});
  try {
    m->load_full(extra, "DIR");
    FAIL() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not_a_parameter.weight"), std::string::npos) << e.what();
  }
  try {
    m->load_full(tensors, "DIR");  // lacks action_in_proj.weight
    FAIL() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lacks tensor 'action_in_proj.weight'"), std::string::npos) << e.what();
  }
  auto bad = s;
  bad.policy.max_action_dim = 9;
  try {
    lr::checked_pi05_tensors(bad, lr::read_pi05_weights(src, at::kFloat), "DIR");
    FAIL() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("action_in_proj"), std::string::npos) << e.what();
  }
}

// A fresh policy's initialisation: model.init_method fan_in draws each weight matrix from
// N(0, 1/fan_in) (normal: N(0, 0.02)), and vision_encoder.position_embedding_init sincos2d starts
// the position embedding at big_vision's 2D sine-cosine code (still a trained parameter).
TEST(Pi05, FreshWeightsFollowTheInitialisationKeys) {
  lf::models::SiglipConfig sv;
  sv.hidden_size = 64, sv.intermediate_size = 256, sv.num_hidden_layers = 1, sv.num_attention_heads = 4;
  sv.patch_size = 4, sv.image_size = 16;
  lf::models::PiGemmaConfig vlm, ex;
  vlm.width = 64, vlm.depth = 1, vlm.mlp_dim = 512, vlm.num_heads = 2, vlm.num_kv_heads = 1, vlm.head_dim = 16;
  vlm.vocab_size = 300;
  ex = vlm, ex.vocab_size = 0, ex.width = 32, ex.mlp_dim = 64;
  lf::models::Pi05Config c;
  c.chunk_size = 4, c.max_action_dim = 4, c.action_dim = 4;
  auto params = [&](const lf::models::SiglipConfig& v, const lf::models::Pi05Config& pc) {
    Pi05 m(v, vlm, ex, pc, lf::backend::cpu_backend(), 7, at::kFloat, nullptr);
    std::map<std::string, at::Tensor> out;
    for (const auto& g : m.parameter_groups())
      for (const auto& p : g.params) out[p.name] = p.tensor.detach();
    return out;
  };
  const std::string vision = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.";
  const std::string lm = "paligemma_with_expert.paligemma.model.language_model.";
  // {name, fan_in}: the patch embedding (3 x 4 x 4), a vision MLP matrix, the token embedding
  // (its width), a prefix LM down projection and the action output projection (the expert width).
  const std::vector<std::pair<std::string, double>> matrices = {
      {vision + "embeddings.patch_embedding.weight", 48},
      {vision + "encoder.layers.0.mlp.fc2.weight", 256},
      {lm + "embed_tokens.weight", 64},
      {lm + "layers.0.mlp.down_proj.weight", 512},
      {"action_out_proj.weight", 32}};
  const auto normal = params(sv, c);
  auto fan = c;
  fan.init_method = "fan_in";
  const auto fanned = params(sv, fan);
  for (const auto& [name, fan_in] : matrices) {
    ASSERT_TRUE(normal.count(name) && fanned.count(name)) << name;
    EXPECT_NEAR(normal.at(name).std().item<double>(), 0.02, 0.02 * 0.15) << name;
    const double want = 1.0 / std::sqrt(fan_in);
    EXPECT_NEAR(fanned.at(name).std().item<double>(), want, want * 0.15) << name;
  }
  const std::string pos = vision + "embeddings.position_embedding.weight";
  EXPECT_NEAR(normal.at(pos).std().item<double>(), 0.02, 0.02 * 0.15);
  auto sincos = sv;
  sincos.position_embedding_init = "sincos2d";
  const auto coded = params(sincos, c);
  const at::Tensor code = coded.at(pos);
  ASSERT_EQ(code.sizes(), at::IntArrayRef({16, 64}));  // (16 / 4)^2 patches
  EXPECT_TRUE(code.equal(lf::models::sincos2d_position_embedding(sincos)));
  // Patch 6 is image row 1, column 2; channel k of each quarter has frequency 10000^(-k/16).
  for (int64_t k : {0, 5, 15}) {
    const double w = std::pow(10000.0, -static_cast<double>(k) / 16.0);
    EXPECT_NEAR(code[6][k].item<double>(), std::sin(2 * w), 1e-6) << k;
    EXPECT_NEAR(code[6][16 + k].item<double>(), std::cos(2 * w), 1e-6) << k;
    EXPECT_NEAR(code[6][32 + k].item<double>(), std::sin(1 * w), 1e-6) << k;
    EXPECT_NEAR(code[6][48 + k].item<double>(), std::cos(1 * w), 1e-6) << k;
  }
  // The other weights are drawn as without it (the same stream), and the code is trained.
  EXPECT_TRUE(coded.at(lm + "embed_tokens.weight").equal(normal.at(lm + "embed_tokens.weight")));
  Pi05 m(sincos, vlm, ex, c, lf::backend::cpu_backend(), 7, at::kFloat, nullptr);
  bool trained = false;
  for (const auto& g : m.parameter_groups())
    for (const auto& p : g.params) trained = trained || (p.name == pos && g.trainable && p.tensor.requires_grad());
  EXPECT_TRUE(trained);
}

}  // namespace

namespace {

// A fresh two-layer pi05 with the prefix LM head (fan_in weights: token changes move the outputs
// well above rounding) and a batch of two samples whose prompt ends with an answer block.
struct BlockCase {
  std::unique_ptr<Pi05> model;
  lf::data::Batch batch;
  static constexpr int64_t kAnswers = 6;  // prompt positions 6.. are the later block
};

BlockCase block_case() {
  lf::models::SiglipConfig sv;
  sv.hidden_size = 32, sv.intermediate_size = 64, sv.num_hidden_layers = 1, sv.num_attention_heads = 2;
  sv.patch_size = 4, sv.image_size = 8;
  lf::models::PiGemmaConfig vlm, ex;
  vlm.width = 32, vlm.depth = 2, vlm.mlp_dim = 64, vlm.num_heads = 2, vlm.num_kv_heads = 1, vlm.head_dim = 16;
  vlm.vocab_size = 40;
  ex = vlm, ex.vocab_size = 0, ex.width = 16, ex.mlp_dim = 32;
  lf::models::Pi05Config c;
  c.chunk_size = 3, c.max_action_dim = 4, c.action_dim = 4, c.num_inference_steps = 2;
  c.init_method = "fan_in";
  c.prefix_lm_loss_weight = 1;
  BlockCase out;
  out.model = std::make_unique<Pi05>(sv, vlm, ex, c, lf::backend::cpu_backend(), 7, at::kFloat, nullptr);
  // The expert's adaRMSNorm gates start at zero: open them so that the suffix reads the prefix.
  for (const auto& g : out.model->parameter_groups())
    for (const auto& p : g.params)
      if (p.name.find("gemma_expert") != std::string::npos && p.name.find("dense") != std::string::npos) {
        at::NoGradGuard no_grad;
        p.tensor.normal_(0.0, 0.2);
      }
  at::manual_seed(3);
  const int64_t b = 2, L = 10;
  out.batch.set("images", at::rand({b, 1, 3, 8, 8}) * 2 - 1);
  out.batch.set("image_masks", at::ones({b, 1}, at::kBool));
  out.batch.set("prompt_tokens", at::randint(1, 40, {b, L}, at::kLong));
  auto masks = at::ones({b, L}, at::kBool);
  masks[1][L - 1] = false;  // a padded token
  out.batch.set("prompt_masks", masks);
  out.batch.set("actions", at::randn({b, 3, 4}));
  auto labels = at::full({b, L}, -100, at::kLong);
  labels.narrow(1, 2, 4).copy_(at::randint(0, 40, {b, 4}, at::kLong));  // queries at 2..5, before the block
  out.batch.set("prompt_labels", labels);
  auto ar = at::zeros({b, L}, at::kBool);
  ar.select(1, BlockCase::kAnswers).fill_(true);
  out.batch.set("prompt_ar_mask", ar);
  out.batch.sample_indices = {0, 1};
  return out;
}

lf::data::Batch without_ar_mask(const lf::data::Batch& batch) {
  lf::data::Batch out;
  for (const auto& [name, tensor] : batch.fields().items())
    if (name != "prompt_ar_mask") out.set(name, tensor);
  out.sample_indices = batch.sample_indices;
  return out;
}

std::map<std::string, double> eval_metrics(Pi05& m, const lf::data::Batch& batch) {
  std::map<std::string, double> out;
  for (const auto& [name, metric] : m.stage_forward(batch, {}, 0, lf::models::Pass::eval).metrics)
    out[name] = metric.sum / metric.count;
  return out;
}

}  // namespace

// openpi's token_ar_mask (batch field prompt_ar_mask): a prompt token sees its own and earlier
// blocks only, in training's joint pass (the prefix LM loss at the queries), the prefix pass
// (prompt_logits) and sampling; the suffix sees every block. An all-false mask is one block, as
// without the field.
TEST(Pi05, PromptArMaskHidesLaterBlocksFromEarlierTokens) {
  auto c = block_case();
  Pi05& m = *c.model;
  auto changed = c.batch;
  auto tokens = c.batch.at("prompt_tokens").clone();
  tokens.narrow(1, BlockCase::kAnswers, 3).copy_((tokens.narrow(1, BlockCase::kAnswers, 3) + 7).remainder(39) + 1);
  changed.set("prompt_tokens", tokens);
  const auto base = eval_metrics(m, c.batch), moved = eval_metrics(m, changed);
  const std::string lm = Pi05::kPrefixLmLoss, flow = Pi05::kLoss;
  // The queries (before the block) do not see the answers; the actions do.
  EXPECT_EQ(base.at(lm), moved.at(lm));
  EXPECT_GT(std::abs(base.at(flow) - moved.at(flow)), 1e-4 * base.at(flow));
  const auto logits = m.prompt_logits(m.inputs_of(c.batch)), logits2 = m.prompt_logits(m.inputs_of(changed));
  ASSERT_EQ(logits.sizes(), at::IntArrayRef({2, 10, 40}));
  EXPECT_TRUE(logits.narrow(1, 0, BlockCase::kAnswers).equal(logits2.narrow(1, 0, BlockCase::kAnswers)));
  EXPECT_GT((logits - logits2).abs().max().item<double>(), 1e-3);
  // prompt_logits is the head prefix_lm_losses scores.
  const auto labels = c.batch.at("prompt_labels");
  const auto ce = m.prefix_lm_losses(m.inputs_of(c.batch), labels);
  const auto want = at::cross_entropy_loss(logits.view({-1, 40}), labels.view({-1}), {}, at::Reduction::None, -100);
  EXPECT_LT((ce.view({-1}) - want).abs().max().item<double>(), 1e-5);
  // The prefix pass (prefix_lm_losses, for the policy's decoding) hides the block too.
  EXPECT_TRUE(ce.equal(m.prefix_lm_losses(m.inputs_of(changed), labels)));
  // Sampling reads the answers.
  const auto noise = at::randn({2, 3, 4});
  EXPECT_GT((m.sample_actions(m.inputs_of(c.batch), noise) - m.sample_actions(m.inputs_of(changed), noise))
                .abs().max().item<double>(), 1e-4);
  // Without the mask the queries see the changed tokens.
  const auto open = without_ar_mask(c.batch), open_changed = without_ar_mask(changed);
  EXPECT_GT(std::abs(eval_metrics(m, open).at(lm) - eval_metrics(m, open_changed).at(lm)), 1e-5);
  // All false: one block, as without the field (losses, logits and actions alike).
  auto single = c.batch;
  single.set("prompt_ar_mask", at::zeros({2, 10}, at::kBool));
  EXPECT_EQ(eval_metrics(m, single), eval_metrics(m, open));
  EXPECT_TRUE(m.prompt_logits(m.inputs_of(single)).equal(m.prompt_logits(m.inputs_of(open))));
  EXPECT_TRUE(m.sample_actions(m.inputs_of(single), noise).equal(m.sample_actions(m.inputs_of(open), noise)));
  // A mask of another shape is named.
  auto bad = c.batch;
  bad.set("prompt_ar_mask", at::zeros({2, 9}, at::kBool));
  try {
    eval_metrics(m, bad);
    FAIL() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt_ar_mask"), std::string::npos) << e.what();
  }
}

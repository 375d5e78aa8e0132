// DSA (DeepSeek-V3.2's sparse attention) in the decoder: the MLA layer with its lightning indexer
// against dense MLA (a top-k covering every key, and the warm-up stage, equal it; a smaller top-k
// does not), the indexer's KL loss (only the indexer learns from it, its value scales with the
// coefficient, the trainer sees it as a loss term), the config's mistakes named by key, and the
// presets' parameter counts. Logits parity with transformers' DeepseekV32 is in test_hf_parity.cpp.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <map>

#include "loongforge/backend/functional.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/models/blocks/mla.h"
#include "loongforge/models/blocks/moe.h"
#include "loongforge/models/blocks/rope.h"
#include "loongforge/models/composites/causal_lm.h"
#include "multiprocess.h"

namespace {
using namespace lf::models;

const lf::backend::DeviceBackend& cpu() { return lf::backend::cpu_backend(); }

MlaConfig mla_config(bool dsa, int64_t topk, double coeff = 0, bool warmup = false) {
  MlaConfig c;
  c.hidden_size = 32;
  c.num_heads = 4;
  c.q_lora_rank = 12;
  c.kv_lora_rank = 8;
  c.qk_head_dim = 8;
  c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 6;
  c.rotary_interleaved = true;
  c.init_std = 0.3;  // decisive attention: selecting fewer keys visibly changes the output
  c.out_std = 0.3;
  c.dsa = {dsa, 4, 8, topk, coeff, warmup};
  return c;
}

struct Layer {
  MlaAttention block;
  std::vector<lf::parallel::Parameter> params;
};
// Same seed: the main weights are drawn first, so the DSA and the dense layer share them.
Layer make_layer(const MlaConfig& c) {
  ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(5), at::kFloat, c10::Device(c10::kCPU), {});
  Layer l{MlaAttention(b, "attn", c), {}};
  l.params = b.take();
  return l;
}

constexpr int64_t kSeq = 10;

at::Tensor input() {
  return at::randn({kSeq, 2, 32}, at::make_generator<at::CPUGeneratorImpl>(9));  // [s, b, h]
}

AttentionInputs inputs() {
  AttentionInputs in;
  RopeSpec spec{4, 10000.0};
  spec.interleaved = true;
  std::tie(in.cos, in.sin) = rope_tables(spec, 0, kSeq, at::TensorOptions().dtype(at::kFloat));
  return in;
}

at::Tensor run(const Layer& l, MoeStep* step = nullptr, bool training = false) {
  lf::parallel::TensorParallel tp;
  return l.block.forward(cpu(), tp, input(), inputs(), 0, step, training);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(DsaLayer, TopkOverEveryKeyEqualsDenseMlaAndFewerKeysDoNot) {
  at::NoGradGuard no_grad;
  const auto dense = run(make_layer(mla_config(false, 0)));
  const auto all = run(make_layer(mla_config(true, kSeq)));
  const auto sparse = run(make_layer(mla_config(true, 3)));
  EXPECT_LE(max_diff(all, dense), 1e-5);
  EXPECT_GT(max_diff(sparse, dense), 1e-2);  // dsa_indexer_topk does something
  // Queries 0..2 see at most 3 keys: top-3 is dense there.
  EXPECT_LE(max_diff(sparse.narrow(0, 0, 3), dense.narrow(0, 0, 3)), 1e-5);
}

TEST(DsaLayer, WarmupAttendsToEveryKey) {
  at::NoGradGuard no_grad;
  const auto dense = run(make_layer(mla_config(false, 0)));
  const auto warm = run(make_layer(mla_config(true, 3, 1.0, /*warmup=*/true)));
  EXPECT_LE(max_diff(warm, dense), 1e-5);
}

// Gradients of sum(y * cot) for every parameter (undefined: none).
std::map<std::string, at::Tensor> grads(const Layer& l, MoeStep* step) {
  auto y = run(l, step, /*training=*/true);
  auto cot = at::randn(y.sizes(), at::make_generator<at::CPUGeneratorImpl>(3));
  (y * cot).sum().backward();
  std::map<std::string, at::Tensor> g;
  for (const auto& p : l.params) g[p.name] = p.tensor.grad().defined() ? p.tensor.grad().clone() : at::Tensor();
  return g;
}

TEST(DsaLayer, IndexerLossTrainsOnlyTheIndexerAndScalesWithItsCoefficient) {
  MoeStep none_step, half_step, one_step;
  const auto g0 = grads(make_layer(mla_config(true, 3, 0.0)), &none_step);
  const auto g_half = grads(make_layer(mla_config(true, 3, 0.5)), &half_step);
  const auto g_one = grads(make_layer(mla_config(true, 3, 1.0)), &one_step);
  EXPECT_EQ(none_step.loss_sums().count(MoeStep::kIndexerLoss), 0u);
  const double half = half_step.loss_sums().at(MoeStep::kIndexerLoss), one = one_step.loss_sums().at(MoeStep::kIndexerLoss);
  EXPECT_GT(half, 0);
  EXPECT_NEAR(one, 2 * half, 1e-6 * one);  // dsa_indexer_loss_coeff scales the loss
  for (const auto& [name, g] : g_one) {
    const bool indexer = name.find(".indexer.") != std::string::npos;
    SCOPED_TRACE(name);
    if (indexer) {
      // No gradient from the language-model side (its inputs are detached, the top-k is not
      // differentiable); from the KL loss, proportional to its coefficient.
      EXPECT_FALSE(g0.at(name).defined() && g0.at(name).abs().max().item<double>() > 0);
      ASSERT_TRUE(g.defined());
      EXPECT_GT(g.abs().max().item<double>(), 0);
      EXPECT_LE(max_diff(g, 2 * g_half.at(name)), 1e-6 * g.abs().max().item<double>() + 1e-9);
    } else {
      // The main weights see the same gradient with or without the KL loss.
      ASSERT_TRUE(g.defined());
      EXPECT_LE(max_diff(g, g0.at(name)), 1e-6);
    }
  }
}

// The KL loss the layer reports, recomputed from its definition with dense ATen: the attention's
// probabilities over the selected keys summed over heads and L1-normalised (p), the indexer's
// softmax over the same keys (q); the mean over queries of KL(p || q).
TEST(DsaLayer, IndexerLossIsTheKlOfTheHeadSummedAttentionToTheIndexer) {
  at::NoGradGuard no_grad;
  const auto c = mla_config(true, 3, 1.0);
  const auto l = make_layer(c);
  lf::parallel::TensorParallel tp;
  auto x = input();
  const auto in = inputs();
  // The layer's indexer and selection.
  std::map<std::string, at::Tensor> w;
  for (const auto& p : l.params) w[p.name] = p.tensor;
  auto q_latent = at::rms_norm(at::matmul(x, w["attn.linear_q_down_proj.weight"].t()), {12},
                               w["attn.q_layernorm.weight"], 1e-6);
  const auto ix = l.block.indexer(cpu(), x, q_latent, in);
  auto idx = lf::ops::dsa_indexer_topk(cpu(), ix.qi, ix.ki, ix.w, ix.scale, 3);
  auto scores = lf::ops::dsa_indexer_scores(cpu(), ix.qi, ix.ki, ix.w, idx, ix.scale);
  // The attention's probabilities: the op's head_prob from the same q, k, v as the layer's.
  MoeStep step;
  {
    at::AutoGradMode on(true);
    run(l, &step, true);
  }
  // Recompute p from a dense reference of the main attention at the selected keys.
  auto kv_latent = at::matmul(x, w["attn.linear_kv_down_proj.weight"].t());
  auto c_kv = at::rms_norm(kv_latent.narrow(-1, 0, 8), {8}, w["attn.kv_layernorm.weight"], 1e-6);
  auto kv = at::matmul(c_kv, w["attn.linear_kv_up_proj.weight"].t()).view({kSeq, 2, 4, 14});
  auto q = at::matmul(q_latent, w["attn.linear_q_up_proj.weight"].t()).view({kSeq, 2, 4, 12});
  auto qr = apply_rope(cpu(), q.narrow(-1, 8, 4), in.cos, in.sin, true);
  auto kr = apply_rope(cpu(), kv_latent.narrow(-1, 8, 4).unsqueeze(2), in.cos, in.sin, true).expand({kSeq, 2, 4, 4});
  auto qf = at::cat({q.narrow(-1, 0, 8), qr}, -1).permute({1, 2, 0, 3});   // [b, n, s, 12]
  auto kf = at::cat({kv.narrow(-1, 0, 8), kr}, -1).permute({1, 2, 0, 3});
  auto s = at::matmul(qf, kf.transpose(-2, -1)) / std::sqrt(12.0);        // [b, n, s, s]
  auto valid = idx.ge(0);
  auto sel = at::zeros({2, kSeq, kSeq + 1}, at::kBool).scatter_(2, at::where(valid, idx, kSeq), true).narrow(2, 0, kSeq);
  auto probs = at::softmax(s.masked_fill(sel.unsqueeze(1).logical_not(), -INFINITY), -1).sum(1);  // [b, s, s]
  auto p = probs.gather(2, idx.clamp_min(0)).masked_fill(valid.logical_not(), 0);
  p = p / p.sum(-1, true);
  auto logq = at::log_softmax(scores, -1).masked_fill(valid.logical_not(), 0);
  auto kl = (p * (at::log(p.clamp_min(1e-10)) - logq)).masked_fill(valid.logical_not(), 0).sum(-1).mean();
  EXPECT_NEAR(step.loss_sums().at(MoeStep::kIndexerLoss), kl.item<double>(), 1e-5);
}

TEST(DsaLayer, SelectiveRecomputeGivesTheSameOutputLossAndGradients) {
  auto go = [](bool selective) {
    const auto l = make_layer(mla_config(true, 3, 1.0));
    MoeStep step;
    lf::parallel::TensorParallel tp;
    auto in = inputs();
    in.selective_recompute = selective;
    auto y = l.block.forward(cpu(), tp, input(), in, 0, &step, true);
    (y * at::randn(y.sizes(), at::make_generator<at::CPUGeneratorImpl>(3))).sum().backward();
    std::vector<at::Tensor> g{y.detach()};
    for (const auto& p : l.params) g.push_back(p.tensor.grad());
    return std::make_pair(g, step.loss_sums().at(MoeStep::kIndexerLoss));
  };
  const auto [plain, plain_loss] = go(false);
  const auto [re, re_loss] = go(true);
  EXPECT_EQ(plain_loss, re_loss);
  ASSERT_EQ(plain.size(), re.size());
  for (size_t k = 0; k < plain.size(); ++k) EXPECT_LE(max_diff(plain[k], re[k]), 1e-6) << k;
}

DecoderConfig tiny_v32() {
  auto node = lf::config::parse_yaml_file(lf::testing::source_dir() + "/configs/models/deepseek_v32/tiny.yaml");
  return lf::config::load<DecoderConfig>(node, "model.foundation");
}

// Two random rows of 24 tokens, each predicting the next.
lf::data::Batch next_token_batch(const DecoderConfig& c) {
  auto tokens = at::randint(0, c.vocab_size, {2, 24}, at::make_generator<at::CPUGeneratorImpl>(4));
  lf::data::Batch batch;
  batch.set("tokens", tokens, 1);
  batch.set("labels", at::roll(tokens, -1, 1), 1);
  return batch;
}

TEST(DsaDecoder, TrainerSeesTheIndexerLossAndTheIndexerLearns) {
  const auto c = tiny_v32();
  CausalLm m(c, cpu(), 3, at::kFloat);
  m.set_training(true);
  const lf::data::Batch batch = next_token_batch(c);
  const auto counts = m.loss_counts(batch);
  ASSERT_EQ(counts.count(MoeStep::kIndexerLoss), 1u);
  EXPECT_EQ(counts.at(MoeStep::kIndexerLoss), 1);
  const auto out = m.forward_step(batch, Pass::train);
  out.losses[0].sum.backward();
  const auto sums = m.internal_loss_sums();
  ASSERT_EQ(sums.count(MoeStep::kIndexerLoss), 1u);
  EXPECT_GT(sums.at(MoeStep::kIndexerLoss), 0);
  int indexer = 0;
  for (const auto& p : m.parameters())
    if (p.name.find(".indexer.") != std::string::npos) {
      ++indexer;
      ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
      EXPECT_GT(p.tensor.grad().abs().max().item<double>(), 0) << p.name;
    }
  EXPECT_EQ(indexer, 5 * c.num_layers);
  // Built parameters = the config's count (the indexers included).
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.tensor.numel();
  EXPECT_EQ(n, c.num_parameters());
}

// The warm-up stage trains the indexers only: they form the one trainable group, every other
// weight gets no gradient (frozen), while the LM loss still flows to the layer where the indexer
// loss joins the objective.
TEST(DsaDecoder, WarmupFreezesEverythingButTheIndexers) {
  auto c = tiny_v32();
  c.dsa_indexer_warmup = true;
  CausalLm m(c, cpu(), 3, at::kFloat);
  m.set_training(true);
  const lf::data::Batch batch = next_token_batch(c);
  const auto out = m.forward_step(batch, Pass::train);
  out.losses[0].sum.backward();
  int trained = 0, frozen = 0;
  for (const auto& p : m.parameters()) {
    if (p.name.find(".indexer.") != std::string::npos) {
      ++trained;
      ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
      EXPECT_GT(p.tensor.grad().abs().max().item<double>(), 0) << p.name;
    } else {
      ++frozen;
      EXPECT_FALSE(p.tensor.requires_grad()) << p.name;
      EXPECT_FALSE(p.tensor.grad().defined()) << p.name;
    }
  }
  EXPECT_EQ(trained, 5 * c.num_layers);
  EXPECT_GT(frozen, 0);
  std::map<std::string, bool> groups;
  for (const auto& g : m.parameter_groups()) groups[g.name] = g.trainable;
  EXPECT_EQ(groups.at("dsa_indexer"), true);
  EXPECT_EQ(groups.at("model"), false);
  // The expert biases (model state, moved by the load) stay too.
  if (c.num_experts > 0 && c.moe_router_enable_expert_bias) {
    std::map<std::string, at::Tensor> before;
    for (const auto& p : m.parameters())
      if (p.state) before[p.name] = p.tensor.clone();
    m.end_step(at::rand({static_cast<int64_t>(m.foundation().num_moe_layers()), c.num_experts}));
    for (const auto& p : m.parameters())
      if (p.state) EXPECT_TRUE(p.tensor.equal(before.at(p.name))) << p.name;
  }
  // Without the warm-up every weight trains, in the usual groups.
  CausalLm sparse(tiny_v32(), cpu(), 3, at::kFloat);
  for (const auto& g : sparse.parameter_groups()) EXPECT_NE(g.name, "dsa_indexer");
}

// Decoding with a KV cache (the indexer's keys cached too, the selection bottom-right causal over
// the cached keys) gives the logits of the full forward, at lengths where the top-16 is sparse.
TEST(DsaDecoder, KvCacheDecodingEqualsTheFullForward) {
  const auto c = tiny_v32();
  CausalLm m(c, cpu(), 3, at::kFloat);
  m.set_training(false);
  at::NoGradGuard no_grad;
  auto tokens = at::randint(0, c.vocab_size, {2, 28}, at::make_generator<at::CPUGeneratorImpl>(8));
  const auto full = m.forward(tokens);  // [s, b, v]
  KvCache cache;
  std::vector<at::Tensor> steps{m.forward(tokens.narrow(1, 0, 20), cache)};
  for (int64_t t = 20; t < 28; ++t) steps.push_back(m.forward(tokens.narrow(1, t, 1), cache));
  EXPECT_LE(max_diff(at::cat(steps, 0), full), 1e-5);
}

TEST(DsaDecoder, ConfigMistakesNameTheKey) {
  auto check = [](DecoderConfig c, const std::string& key) {
    lf::config::ErrorList errors;
    c.validate(lf::config::Node(), "model.foundation", errors);
    std::string keys;
    for (const auto& i : errors.issues()) keys += i.key + " (" + i.message + ") ";
    EXPECT_TRUE(errors.has_key("model.foundation." + key)) << key << ": " << keys;
  };
  const auto base = tiny_v32();
  {
    lf::config::ErrorList errors;
    base.validate(lf::config::Node(), "model.foundation", errors);
    EXPECT_TRUE(errors.empty());
  }
  auto c = base;
  c.multi_latent_attention = false;
  c.q_lora_rank = c.kv_lora_rank = c.qk_head_dim = c.qk_pos_emb_head_dim = c.v_head_dim = 0;
  check(c, "experimental_attention_variant");  // DSA without MLA
  c = base;
  c.q_lora_rank = 0;
  check(c, "q_lora_rank");
  c = base;
  c.dsa_indexer_topk = c.max_position_embeddings + 1;
  check(c, "dsa_indexer_topk");
  c = base;
  c.dsa_indexer_n_heads = 0;
  check(c, "dsa_indexer_n_heads");
  c = base;
  c.dsa_indexer_head_dim = c.qk_pos_emb_head_dim - 2;
  check(c, "dsa_indexer_head_dim");
  c = base;
  c.dsa_indexer_warmup = true;
  c.dsa_indexer_loss_coeff = 0;
  check(c, "dsa_indexer_warmup");
  c = base;
  c.experimental_attention_variant = "none";
  check(c, "dsa_indexer_topk");  // set but DSA is off
  check(c, "dsa_indexer_loss_coeff");
  // The layout: TP and CP are refused naming their keys.
  auto layout = [&](const std::string& yaml, const std::string& key) {
    auto job = lf::config::parse_yaml_string(yaml, lf::config::Origin::from_default());
    lf::config::ErrorList errors;
    base.validate_layout(job, yaml.find("tensor") != std::string::npos ? 2 : 1, false, 24, errors);
    EXPECT_TRUE(errors.has_key(key)) << key;
  };
  layout("parallel:\n  tensor_model_parallel_size: 2\n", "parallel.tensor_model_parallel_size");
  layout("parallel:\n  context_parallel_size: 2\n", "parallel.context_parallel_size");
}

TEST(DsaDecoder, FlopsCountTheSelectedKeysOnly) {
  auto c = tiny_v32();  // top-16
  auto dense = c;
  dense.experimental_attention_variant = "none";
  dense.dsa_indexer_n_heads = dense.dsa_indexer_head_dim = dense.dsa_indexer_topk = 0;
  dense.dsa_indexer_loss_coeff = 0;
  // At 16 tokens every query sees at most 16 keys: DSA costs the dense attention plus its indexer.
  EXPECT_GT(c.flops_per_token(16), dense.flops_per_token(16));
  // At 128 the attention part grows with the top-k, not the sequence.
  EXPECT_LT(c.flops_per_token(128) - c.flops_per_token(64), dense.flops_per_token(128) - dense.flops_per_token(64));
}

}  // namespace

// The MoE block (models/blocks/moe.h) against a naive implementation written from the published
// definitions, token by token: routing (softmax before/after the top-k, sigmoid with
// normalisation and scaling, DeepSeek's group-limited routing with the expert bias, capacity
// drops by weight and by position), the layer output with shared experts and their gate, every
// gradient (the auxiliary losses' included) against autograd through the naive version, and the
// MoE fields of the decoder config (layer pattern, parameter counts, validation).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/models/blocks/moe.h"
#include "loongforge/models/composites/causal_lm.h"
#include "tiny_decoder.h"

namespace lf::testing {
namespace {

using lf::models::MoeConfig;
using lf::models::MoeLayer;
using lf::models::MoeStep;
using lf::models::ParamBuilder;

const lf::backend::DeviceBackend& cpu() { return lf::backend::cpu_backend(); }

struct Built {
  MoeLayer layer;
  std::vector<lf::parallel::Parameter> params;
  at::Tensor get(const std::string& suffix) const {
    for (const auto& p : params)
      if (p.name == "mlp." + suffix) return p.tensor;
    return {};
  }
};

Built build(const MoeConfig& c, uint64_t seed = 3) {
  ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(seed), at::kDouble, c10::Device(c10::kCPU), {});
  Built out;
  out.layer = MoeLayer(b, "mlp", c);
  out.params = b.take();
  return out;
}

MoeConfig base(int64_t e = 6, int64_t k = 2) {
  MoeConfig c;
  c.hidden_size = 8;
  c.num_experts = e;
  c.ffn_hidden_size = 5;
  c.topk = k;
  c.init_std = 0.5;
  c.out_std = 0.5;
  return c;
}

// Naive routing for one token, from the definitions (Megatron's topk_softmax_with_capacity,
// HF DeepseekV3TopkRouter): returns (expert, weight) pairs.
std::vector<std::pair<int64_t, at::Tensor>> naive_route(const MoeConfig& c, const at::Tensor& logits_row,
                                                        const at::Tensor& bias) {
  const int64_t e = c.num_experts, k = c.topk;
  at::Tensor scores = c.score_function == "sigmoid" ? at::sigmoid(logits_row)
                      : c.pre_softmax               ? at::softmax(logits_row, 0)
                                                    : logits_row;
  std::vector<double> choice(static_cast<size_t>(e));
  for (int64_t i = 0; i < e; ++i)
    choice[static_cast<size_t>(i)] = scores[i].item<double>() + (bias.defined() ? bias[i].item<double>() : 0.0);
  std::vector<bool> allowed(static_cast<size_t>(e), true);
  if (c.num_groups > 0) {
    const int64_t per = e / c.num_groups, take = k / c.group_topk;
    std::vector<std::pair<double, int64_t>> groups;
    for (int64_t g = 0; g < c.num_groups; ++g) {
      std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      double s = 0;
      for (int64_t j = 0; j < take; ++j) s += v[static_cast<size_t>(j)];
      groups.push_back({-s, g});
    }
    std::stable_sort(groups.begin(), groups.end());
    std::fill(allowed.begin(), allowed.end(), false);
    for (int64_t j = 0; j < c.group_topk; ++j)
      for (int64_t i = 0; i < per; ++i) allowed[static_cast<size_t>(groups[static_cast<size_t>(j)].second * per + i)] = true;
  }
  std::vector<std::pair<double, int64_t>> order;
  for (int64_t i = 0; i < e; ++i)
    if (allowed[static_cast<size_t>(i)]) order.push_back({-choice[static_cast<size_t>(i)], i});
  std::stable_sort(order.begin(), order.end());
  std::vector<int64_t> picked;
  for (int64_t j = 0; j < k; ++j) picked.push_back(order[static_cast<size_t>(j)].second);
  auto idx = at::tensor(picked, at::kLong);
  at::Tensor w = scores.index_select(0, idx);
  if (c.score_function == "sigmoid")
    w = k > 1 ? w / (w.sum() + 1e-20) : w;
  else if (!c.pre_softmax)
    w = at::softmax(w, 0);
  if (c.scaling_factor > 0) w = w * c.scaling_factor;
  std::vector<std::pair<int64_t, at::Tensor>> out;
  for (int64_t j = 0; j < k; ++j) out.push_back({picked[static_cast<size_t>(j)], w[j]});
  return out;
}

at::Tensor naive_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2) {
  auto h = at::matmul(w1, x);
  const int64_t f = h.size(0) / 2;
  return at::matmul(w2, at::silu(h.narrow(0, 0, f)) * h.narrow(0, f, f));
}

// The whole layer, token by token, differentiable through ATen (no capacity: see the routing test).
at::Tensor naive_layer(const MoeConfig& c, const Built& m, const at::Tensor& x2d) {
  auto router = m.get("router.weight"), w1 = m.get("experts.linear_fc1.weight"), w2 = m.get("experts.linear_fc2.weight");
  auto bias = m.get("router.expert_bias");
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < x2d.size(0); ++t) {
    auto x = x2d[t];
    at::Tensor y = at::zeros({c.hidden_size}, x.options());
    for (auto& [ex, w] : naive_route(c, at::matmul(router, x), bias)) y = y + w * naive_mlp(x, w1[ex], w2[ex]);
    if (c.shared_ffn_hidden_size > 0) {
      auto s = naive_mlp(x, m.get("shared_experts.linear_fc1.weight"), m.get("shared_experts.linear_fc2.weight"));
      if (c.shared_gate) s = s * at::sigmoid(at::dot(m.get("shared_experts.gate_weight")[0], x));
      y = y + s;
    }
    rows.push_back(y);
  }
  return at::stack(rows);
}

std::vector<at::Tensor> grads(const at::Tensor& out, const std::vector<at::Tensor>& wrt) {
  return torch::autograd::grad({out}, wrt, {}, /*retain_graph=*/false, false, /*allow_unused=*/true);
}

void expect_close(const at::Tensor& a, const at::Tensor& e, double tol, const std::string& what) {
  ASSERT_EQ(a.sizes(), e.sizes()) << what;
  const double d = (a - e).abs().max().item<double>();
  EXPECT_LE(d, tol) << what;
}

struct Variant {
  std::string name;
  std::function<void(MoeConfig&)> set;
};

class MoeVariants : public ::testing::TestWithParam<Variant> {};

// Forward and every gradient (x, router, experts, shared experts, gate) equal the naive version.
TEST_P(MoeVariants, LayerMatchesTokenByTokenDefinition) {
  MoeConfig c = base();
  GetParam().set(c);
  Built m = build(c);
  if (auto bias = m.get("router.expert_bias"); bias.defined())
    bias.copy_(at::linspace(-0.3, 0.4, c.num_experts, at::kDouble));  // makes the bias matter
  at::manual_seed(7);
  auto x = at::randn({5, 2, c.hidden_size}, at::kDouble).requires_grad_(true);
  auto cot = at::randn({5, 2, c.hidden_size}, at::kDouble);
  lf::parallel::TensorParallel tp;
  auto out = m.layer.forward(cpu(), tp, x, /*training=*/false, false, nullptr, 0, 1);
  std::vector<at::Tensor> wrt{x};
  std::vector<std::string> names{"dx"};
  for (const auto& p : m.params)
    if (!p.state) wrt.push_back(p.tensor), names.push_back(p.name);
  auto g = grads((out * cot).sum(), wrt);
  auto want = naive_layer(c, m, x.reshape({10, c.hidden_size})).view({5, 2, c.hidden_size});
  auto gw = grads((want * cot).sum(), wrt);
  expect_close(out, want, 1e-12, "output");
  for (size_t i = 0; i < wrt.size(); ++i) {
    ASSERT_TRUE(g[i].defined() && gw[i].defined()) << i;
    expect_close(g[i], gw[i], 1e-10, names[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Router, MoeVariants,
    ::testing::Values(Variant{"softmax_topk_then_softmax", [](MoeConfig&) {}},
                      Variant{"softmax_pre_softmax_unnormalised", [](MoeConfig& c) { c.pre_softmax = true; }},
                      Variant{"sigmoid_normalised_scaled", [](MoeConfig& c) {
                                c.score_function = "sigmoid";
                                c.scaling_factor = 2.5;
                              }},
                      Variant{"deepseek_v3_groups_bias_shared", [](MoeConfig& c) {
                                c.score_function = "sigmoid";
                                c.num_groups = 3;
                                c.group_topk = 2;
                                c.topk = 2;
                                c.expert_bias = true;
                                c.scaling_factor = 2.5;
                                c.shared_ffn_hidden_size = 7;
                              }},
                      Variant{"qwen2_shared_gate_top1", [](MoeConfig& c) {
                                c.topk = 1;
                                c.shared_ffn_hidden_size = 4;
                                c.shared_gate = true;
                              }}),
    [](const auto& info) { return info.param.name; });

// Capacity: per expert at most ceil(T k / E * factor) slots survive, the highest weights (probs)
// or the earliest tokens (position); the surviving routes are the dropless ones.
TEST(MoeRouting, CapacityDropsByWeightOrPosition) {
  for (bool by_position : {false, true}) {
    MoeConfig c = base(4, 2);
    Built free = build(c);
    c.capacity_factor = 0.5;
    c.drop_by_position = by_position;
    Built capped = build(c);
    at::manual_seed(9);
    auto x = at::randn({12, c.hidden_size}, at::kDouble);
    auto a = free.layer.route(x), r = capped.layer.route(x);
    const int64_t capacity = static_cast<int64_t>(std::ceil(12.0 * 2 / 4 * 0.5));  // 3
    for (int64_t e = 0; e < 4; ++e) {
      auto routed = (a.indices == e).nonzero();  // [slots, 2]: (token, slot)
      auto kept = (r.indices == e).nonzero();
      EXPECT_EQ(kept.size(0), std::min<int64_t>(routed.size(0), capacity)) << "expert " << e;
      if (routed.size(0) <= capacity) continue;
      // Which ones: the top weights, or the first tokens.
      std::vector<std::pair<double, int64_t>> cand;
      for (int64_t i = 0; i < routed.size(0); ++i) {
        const int64_t t = routed[i][0].item<int64_t>(), j = routed[i][1].item<int64_t>();
        cand.push_back({by_position ? static_cast<double>(i) : -a.probs[t][j].item<double>(), t * 2 + j});
      }
      std::stable_sort(cand.begin(), cand.end());
      for (int64_t i = 0; i < kept.size(0); ++i) {
        const int64_t slot = kept[i][0].item<int64_t>() * 2 + kept[i][1].item<int64_t>();
        bool found = false;
        for (int64_t q = 0; q < capacity; ++q) found = found || cand[static_cast<size_t>(q)].second == slot;
        EXPECT_TRUE(found) << "expert " << e << " kept slot " << slot << (by_position ? " (position)" : " (probs)");
      }
    }
    // Weights of surviving slots are unchanged.
    auto keep = r.indices >= 0;
    expect_close(r.probs.masked_select(keep), a.probs.masked_select(keep), 0, "weights");
    EXPECT_TRUE(at::equal(r.indices.masked_select(keep), a.indices.masked_select(keep)));
  }
}

// The auxiliary losses: values from their formulas, and their gradients (scaled by the step's
// weight) enter at the layer output's backward.
TEST(MoeAuxLosses, ValuesAndWeightedGradients) {
  for (const std::string type : {"aux_loss", "seq_aux_loss"}) {
    for (const std::string score : {"softmax", "sigmoid"}) {
      MoeConfig c = base(6, 2);
      c.score_function = score;
      c.load_balancing = type;
      c.aux_loss_coeff = 0.3;
      c.z_loss_coeff = 0.05;
      Built m = build(c);
      at::manual_seed(11);
      const int64_t s = 5, b = 3, t = s * b, e = c.num_experts, k = c.topk;
      auto x = at::randn({s, b, c.hidden_size}, at::kDouble).requires_grad_(true);
      MoeStep step;
      const std::map<std::string, double> weights{{MoeStep::kLoadBalancingLoss, 0.7}, {MoeStep::kZLoss, 1.9}};
      step.set_weights(&weights);
      lf::parallel::TensorParallel tp;
      auto out = m.layer.forward(cpu(), tp, x, /*training=*/true, false, &step, 0, 1);
      auto router = m.params[0].tensor;
      ASSERT_EQ(m.params[0].name, "mlp.router.weight");
      auto g = grads(out.sum(), {x, router});

      // The formulas, differentiable.
      auto logits = at::matmul(x.reshape({t, c.hidden_size}), router.t());
      auto full = score == "softmax" ? at::softmax(logits, -1)
                                     : at::sigmoid(logits) / at::sigmoid(logits).sum(-1, true);
      auto top = std::get<1>(full.detach().topk(k, -1));
      auto routed = at::zeros({t, e}, at::kDouble).scatter_(1, top, 1.0);
      at::Tensor aux;
      if (type == "aux_loss") {
        aux = 0.3 * e / (double(k) * t * t) * (routed.sum(0) * full.sum(0)).sum();
      } else {
        auto cnt = routed.view({s, b, e}).sum(0) * (double(e) / (s * k));
        aux = 0.3 * (cnt * full.view({s, b, e}).mean(0)).sum(1).mean();
      }
      auto z = 0.05 * at::logsumexp(logits, -1).square().mean();
      EXPECT_NEAR(step.loss_sums().at(MoeStep::kLoadBalancingLoss), aux.item<double>(), 1e-12) << type << score;
      EXPECT_NEAR(step.loss_sums().at(MoeStep::kZLoss), z.item<double>(), 1e-12) << type << score;
      auto plain = m.layer.forward(cpu(), tp, x, /*training=*/false, false, nullptr, 0, 1);
      auto gw = grads(plain.sum() + 0.7 * aux + 1.9 * z, {x, router});
      expect_close(g[0], gw[0], 1e-10, type + " " + score + " dx");
      expect_close(g[1], gw[1], 1e-10, type + " " + score + " drouter");
      // The step's load: tokens per expert of the actual routing.
      auto load = step.load();
      ASSERT_TRUE(load.defined());
      EXPECT_EQ(load.sum().item<double>(), static_cast<double>(t * k));
    }
  }
}

// Only a pass whose graph is backpropagated counts (a fully recomputed layer's no-grad first pass
// and evaluation do not).
TEST(MoeAuxLosses, NoGradAndEvaluationPassesRecordNothing) {
  MoeConfig c = base();
  c.aux_loss_coeff = 0.1;
  Built m = build(c);
  MoeStep step;
  auto x = at::randn({4, 1, c.hidden_size}, at::kDouble);
  lf::parallel::TensorParallel tp;
  {
    at::NoGradGuard no_grad;
    m.layer.forward(cpu(), tp, x, true, false, &step, 0, 1);
  }
  m.layer.forward(cpu(), tp, x, /*training=*/false, false, &step, 0, 1);
  EXPECT_FALSE(step.load().defined());
  EXPECT_TRUE(step.loss_sums().empty());
}

// Aux-loss-free balancing: bias += rate * sign(mean - load).
TEST(MoeExpertBias, UpdateRule) {
  MoeConfig c = base(4, 1);
  c.expert_bias = true;
  c.bias_update_rate = 0.01;
  Built m = build(c);
  m.layer.update_expert_bias(at::tensor({8.0, 2.0, 5.0, 5.0}));  // mean 5
  auto bias = m.get("router.expert_bias");
  EXPECT_TRUE(at::allclose(bias, at::tensor({-0.01, 0.01, 0.0, 0.0}, at::kFloat)));
  EXPECT_EQ(bias.scalar_type(), at::kFloat);
  EXPECT_FALSE(bias.requires_grad());
}

lf::models::DecoderConfig tiny_moe() {
  auto c = tiny_decoder_config();
  c.num_layers = 4;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 24;
  c.moe_layer_freq = "([0]*1+[1]*3)";
  c.moe_shared_expert_intermediate_size = 16;
  c.moe_router_enable_expert_bias = true;
  return c;
}

TEST(MoeDecoderConfig, LayerPatternParametersAndFlops) {
  auto c = tiny_moe();
  EXPECT_EQ(c.moe_layer_pattern(), (std::vector<bool>{false, true, true, true}));
  c.moe_layer_freq = "2";
  EXPECT_EQ(c.moe_layer_pattern(), (std::vector<bool>{true, false, true, false}));
  c.moe_layer_freq = "[0,1]*2";
  EXPECT_EQ(c.moe_layer_pattern(), (std::vector<bool>{false, true, false, true}));
  c.moe_layer_freq = "[0]*3";
  EXPECT_THROW(c.moe_layer_pattern(), lf::Error);
  c.moe_layer_freq = "([0]*1+[1]*3)";
  // The counts equal the built model's parameters, expert biases included.
  lf::models::CausalLm model(c, cpu(), 1, at::kFloat);
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.tensor.numel();
  EXPECT_EQ(n, c.num_parameters());
  // Active: 2 of 4 experts in 3 layers.
  EXPECT_EQ(c.num_parameters() - c.num_active_parameters(), 3 * 2 * (2 * 24 * 32 + 32 * 24));
  auto groups = model.parameter_groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1].name, "model_state");
  EXPECT_FALSE(groups[1].trainable);
  EXPECT_EQ(groups[1].params.size(), 3u);
}

TEST(MoeDecoderConfig, ValidationNamesTheField) {
  auto check = [](lf::models::DecoderConfig c, const std::string& field) {
    lf::config::ErrorList errors;
    c.validate(lf::config::Node(), "model.foundation", errors);
    ASSERT_FALSE(errors.empty()) << field;
    std::string keys;
    for (const auto& i : errors.issues()) keys += i.key + " (" + i.message + ") ";
    EXPECT_TRUE(errors.has_key("model.foundation." + field)) << keys;
  };
  auto c = tiny_moe();
  c.moe_router_topk = 5;
  check(c, "moe_router_topk");
  c = tiny_moe();
  c.moe_router_num_groups = 3;
  c.moe_router_group_topk = 1;
  check(c, "moe_router_num_groups");  // 3 does not divide 4 experts
  c = tiny_moe();
  c.moe_router_num_groups = 2;
  check(c, "moe_router_group_topk");  // one without the other
  c = tiny_moe();
  c.moe_shared_expert_intermediate_size = 0;
  c.moe_shared_expert_gate = true;
  check(c, "moe_shared_expert_gate");
  c = tiny_moe();
  c.moe_layer_freq = "[1,x]";
  check(c, "moe_layer_freq");
  c = tiny_moe();
  c.add_bias_linear = true;  // experts have no biases: refused, not ignored
  check(c, "add_bias_linear");
  // Settings of a feature that is off are refused, not ignored.
  c = tiny_decoder_config();
  c.moe_router_topk = 8;
  check(c, "moe_router_topk");
  c = tiny_moe();
  c.moe_router_enable_expert_bias = false;
  c.moe_router_bias_update_rate = 0.01;
  check(c, "moe_router_bias_update_rate");
  c = tiny_moe();
  c.moe_token_drop_policy = "position";
  check(c, "moe_token_drop_policy");
  c = tiny_decoder_config();
  c.kv_lora_rank = 16;
  check(c, "kv_lora_rank");
  c = tiny_decoder_config();
  c.mscale_all_dim = 1;
  check(c, "mscale_all_dim");
}

// ---- multi-latent attention in the decoder -----------------------------------------------------

lf::models::DecoderConfig tiny_mla(bool q_lora) {
  auto c = tiny_decoder_config();
  make_tiny_mla(c, q_lora);
  return c;
}

// The parameter count formula equals the built model's; decoding with the KV cache (expanded keys
// and values cached per layer) equals the full forward, with MoE layers too (DeepSeek-V3's shape).
TEST(MlaDecoder, ParameterCountAndKvCacheDecoding) {
  for (int which = 0; which < 3; ++which) {
    auto c = tiny_mla(which != 1);
    if (which == 2) {
      c.num_layers = 3;
      c.num_experts = 4;
      c.moe_router_topk = 2;
      c.moe_ffn_hidden_size = 16;
      c.moe_layer_freq = "[0,1,1]";
      c.moe_router_score_function = "sigmoid";
      c.moe_router_enable_expert_bias = true;
      c.moe_shared_expert_intermediate_size = 16;
    }
    SCOPED_TRACE(which);
    lf::config::ErrorList errors;
    c.validate(lf::config::Node(), "model.foundation", errors);
    ASSERT_TRUE(errors.empty());
    lf::models::CausalLm m(c, cpu(), 21, at::kFloat);
    int64_t n = 0;
    for (const auto& p : m.parameters()) n += p.tensor.numel();
    EXPECT_EQ(n, c.num_parameters());
    {
      at::NoGradGuard no_grad;
      for (const auto& p : m.parameters()) p.tensor.add_(at::randn(p.tensor.sizes()) * 0.05);
    }
    m.set_training(false);
    auto tokens = at::randint(0, 50, {2, 10}, at::TensorOptions().dtype(at::kLong));
    at::NoGradGuard no_grad;
    auto full = m.forward(tokens);
    lf::models::KvCache cache;
    std::vector<at::Tensor> parts;
    int64_t pos = 0;
    for (int64_t k : {5, 1, 1, 3}) {
      parts.push_back(m.forward(tokens.narrow(1, pos, k), cache));
      pos += k;
    }
    auto inc = at::cat(parts, 0);
    EXPECT_TRUE(at::allclose(inc, full, 1e-5, 1e-5)) << (inc - full).abs().max();
  }
}

TEST(MlaDecoder, ValidationNamesTheField) {
  auto c = tiny_mla(true);
  c.kv_lora_rank = 0;
  lf::config::ErrorList errors;
  c.validate(lf::config::Node(), "model.foundation", errors);
  EXPECT_TRUE(errors.has_key("model.foundation.kv_lora_rank"));
  c = tiny_mla(true);
  c.qk_layernorm = true;
  lf::config::ErrorList e2;
  c.validate(lf::config::Node(), "model.foundation", e2);
  EXPECT_TRUE(e2.has_key("model.foundation.qk_layernorm"));
  c = tiny_mla(true);
  c.rope_scaling = true;
  lf::config::ErrorList e3;
  c.validate(lf::config::Node(), "model.foundation", e3);
  EXPECT_TRUE(e3.has_key("model.foundation.rope_scaling"));
}

}  // namespace
}  // namespace lf::testing

// Sampling (greedy, temperature, top-k, top-p) against hand-computed distributions, and the
// KV-cache generation loop against recomputing the whole prefix every step.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/models/generation.h"
#include "tiny_decoder.h"

namespace {
using lf::models::SamplingOptions;

lf::models::DecoderConfig tiny() {
  auto c = lf::testing::tiny_decoder_config();
  c.max_position_embeddings = 24;
  c.qk_layernorm = true;
  return c;
}

// Empirical frequencies of `draws` samples.
std::vector<double> frequencies(const at::Tensor& logits, const SamplingOptions& o, int draws) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  std::vector<double> f(static_cast<size_t>(logits.size(0)), 0.0);
  for (int i = 0; i < draws; ++i) f[static_cast<size_t>(lf::models::sample_token(logits, o, gen))] += 1.0 / draws;
  return f;
}

TEST(Sampling, GreedyTakesTheFirstMaximum) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  EXPECT_EQ(lf::models::sample_token(at::tensor({0.5f, 3.f, 3.f, -1.f}), {}, gen), 1);
}

// 8000 draws: the standard error of a frequency p is sqrt(p (1 - p) / 8000) <= 0.0056, so
// 0.025 is > 4 standard errors (a false failure is ~1e-5 likely); a wrong temperature, a wrong
// cut or a missing renormalisation moves some frequency by far more.
TEST(Sampling, TemperatureTopKTopPFollowTheirDistributions) {
  const auto logits = at::tensor({2.0, 1.0, 0.0, -1.0, 0.5}, at::kDouble);
  auto expect_freq = [&](const SamplingOptions& o, std::vector<double> want) {
    auto got = frequencies(logits, o, 8000);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.025) << "id " << i;
  };
  // Temperature 0.7: softmax(l / 0.7).
  auto p = at::softmax(logits / 0.7, 0);
  std::vector<double> want(p.data_ptr<double>(), p.data_ptr<double>() + 5);
  expect_freq({0.7, 0, 1.0}, want);
  // Top-2 at temperature 1: ids 0 and 1 renormalised, e^2 / (e^2 + e).
  const double a = std::exp(2.0) / (std::exp(2.0) + std::exp(1.0));
  expect_freq({1.0, 2, 1.0}, {a, 1 - a, 0, 0, 0});
  // Top-p 0.8 at temperature 1: sorted probabilities 0.543, 0.200, 0.121 (id 4), ... reach 0.8
  // with the third one, so ids {0, 1, 4} renormalised.
  auto q = at::softmax(logits, 0);
  const double z = q[0].item<double>() + q[1].item<double>() + q[4].item<double>();
  expect_freq({1.0, 0, 0.8}, {q[0].item<double>() / z, q[1].item<double>() / z, 0, 0, q[4].item<double>() / z});
  // Top-k 1 and a tiny top-p both reduce to greedy.
  expect_freq({1.0, 1, 1.0}, {1, 0, 0, 0, 0});
  expect_freq({1.0, 0, 1e-6}, {1, 0, 0, 0, 0});
}

TEST(Sampling, InvalidOptionsNameTheValue) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  auto l = at::zeros({4});
  auto expect_error = [&](SamplingOptions o, const std::string& text) {
    try {
      lf::models::sample_token(l, o, gen);
      ADD_FAILURE() << text;
    } catch (const lf::Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error({-1.0, 0, 1.0}, "temperature must be >= 0, got -1");
  expect_error({1.0, 0, 0.0}, "top_p must be in (0, 1], got 0");
  expect_error({1.0, 0, 1.5}, "top_p must be in (0, 1], got 1.5");
  expect_error({1.0, -2, 1.0}, "top_k must be >= 0, got -2");
}

TEST(Generate, KvCacheEqualsRecomputingThePrefix) {
  lf::models::CausalLm m(tiny(), lf::backend::cpu_backend(), 5, at::kFloat);
  {
    at::NoGradGuard no_grad;  // a model with some structure: perturbed weights
    auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
    for (const auto& p : m.parameters()) p.tensor.add_(at::randn(p.tensor.sizes(), gen) * 0.5);
  }
  const std::vector<int64_t> prompt = {3, 17, 42, 8};
  for (SamplingOptions s : {SamplingOptions{}, SamplingOptions{0.9, 10, 0.9}}) {
    lf::models::GenerateOptions o;
    o.sampling = s;
    o.max_new_tokens = 12;
    const auto cached = lf::models::generate(m, prompt, o);
    o.use_kv_cache = false;
    const auto full = lf::models::generate(m, prompt, o);
    EXPECT_EQ(cached.size(), 12u);
    EXPECT_EQ(cached, full);
  }
}

TEST(Generate, SeedStopTokensAndContextLimit) {
  lf::models::CausalLm m(tiny(), lf::backend::cpu_backend(), 5, at::kFloat);
  lf::models::GenerateOptions o;
  o.sampling = {1.5, 0, 1.0};  // hot: the draws differ between seeds
  o.max_new_tokens = 40;       // more than the context leaves: 24 - 4 = 20
  const std::vector<int64_t> prompt = {1, 2, 3, 4};
  const auto a = lf::models::generate(m, prompt, o);
  EXPECT_EQ(a.size(), 20u);
  EXPECT_EQ(lf::models::generate(m, prompt, o), a);
  o.seed = 99;
  EXPECT_NE(lf::models::generate(m, prompt, o), a);
  o.seed = 1234;
  o.stop_ids = {a[5]};
  const auto stopped = lf::models::generate(m, prompt, o);
  const auto first = std::find(a.begin(), a.end(), a[5]) - a.begin();
  EXPECT_EQ(stopped, std::vector<int64_t>(a.begin(), a.begin() + first));
  try {
    lf::models::generate(m, {3, 60}, o);
    ADD_FAILURE();
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt token 60 is outside the vocabulary"), std::string::npos);
  }
}
}  // namespace

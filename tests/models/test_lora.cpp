// LoRA adapters on the decoder (models/blocks/lora.h, models/lora_io.h): a fresh adapter leaves
// the model unchanged; adapters change the output by exactly scale * B A x (the merged weights give
// the same logits: the fused q/k/v and gate/up layouts are right); only adapters get gradients,
// also under full and selective recomputation (the frozen base's activations do not require
// grad); adapter dropout acts in training only; the planned PEFT names round-trip.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>

#include "loongforge/backend/registry.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/lora_io.h"
#include "multiprocess.h"
#include "tiny_decoder.h"

namespace {

using lf::models::CausalLm;
using lf::models::LoraSpec;

LoraSpec all_linear(int64_t r = 4, double alpha = 8, double dropout = 0) {
  return LoraSpec::from(r, alpha, dropout, false, {"all-linear"});
}

// Random (non-zero) adapters for every LoRA parameter of `m`, by name.
std::map<std::string, at::Tensor> random_adapters(const CausalLm& m, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.lora_parameters()) out[p.name] = at::normal(0.0, 0.1, p.full_shape(), gen, at::kFloat);
  return out;
}

TEST(LoraAdapter, FreshAdaptersLeaveTheModelUnchanged) {
  const auto& be = lf::backend::cpu_backend();
  auto c = lf::testing::tiny_decoder_config();
  auto tokens = at::randint(0, 50, {2, 10}, at::TensorOptions().dtype(at::kLong));
  CausalLm plain(c, be, 5, at::kFloat), adapted(c, be, 5, at::kFloat);
  adapted.add_lora(all_linear(), 5);
  EXPECT_EQ(adapted.lora_parameters().size(), 2u * 7u * 2u);
  at::NoGradGuard g;
  EXPECT_TRUE(at::equal(plain.forward(tokens), adapted.forward(tokens)));
  // Every base parameter is frozen; the groups say so.
  for (const auto& p : adapted.parameters()) EXPECT_FALSE(p.tensor.requires_grad()) << p.name;
  for (const auto& p : adapted.lora_parameters()) EXPECT_TRUE(p.tensor.requires_grad()) << p.name;
  const auto groups = adapted.parameter_groups();
  ASSERT_EQ(groups.back().name, "lora");
  EXPECT_TRUE(groups.back().trainable);
  for (size_t i = 0; i + 1 < groups.size(); ++i) EXPECT_TRUE(!groups[i].trainable && groups[i].base) << groups[i].name;
}

// Merging W + scale B A into the fused tensors gives the adapted model's logits: q/k/v rows land in
// their query groups, gate/up in fc1's halves; a module subset and rsLoRA scale too.
TEST(LoraAdapter, MergedWeightsGiveTheAdaptedLogits) {
  const auto& be = lf::backend::cpu_backend();
  auto c = lf::testing::tiny_decoder_config();
  c.swiglu = true;
  auto tokens = at::randint(0, 50, {2, 10}, at::TensorOptions().dtype(at::kLong));
  for (const LoraSpec& spec : {all_linear(4, 8), LoraSpec::from(2, 4, 0, true, {"k_proj", "v_proj", "up_proj"})}) {
    CausalLm adapted(c, be, 5, at::kFloat);
    adapted.add_lora(spec, 5);
    const auto adapters = random_adapters(adapted, 9);
    adapted.load_full_lora(adapters);
    lf::models::NamedTensorList base, ad;
    for (const auto& p : adapted.parameters()) base.emplace_back(p.name, p.tensor.detach().clone());
    for (const auto& [n, t] : adapters) ad.emplace_back(n, t);
    std::map<std::string, at::Tensor> merged;
    for (auto& [n, t] : lf::models::merge_lora(base, spec, ad, c)) merged[n] = t;
    CausalLm plain(c, be, 1, at::kFloat);
    plain.load_full_parameters(merged);
    at::NoGradGuard g;
    const auto want = adapted.forward(tokens), got = plain.forward(tokens);
    EXPECT_LE((want - got).abs().max().item<double>(), 1e-5);
    CausalLm base_only(c, be, 5, at::kFloat);
    EXPECT_GT((base_only.forward(tokens) - want).abs().max().item<double>(), 1e-3);  // the adapters matter
  }
}

// Only the adapters get gradients, identical with full or selective recomputation (a recomputed
// layer whose input does not require grad must still give its adapters theirs).
TEST(LoraAdapter, GradientsReachOnlyTheAdaptersWithAndWithoutRecompute) {
  using R = lf::models::RecomputeOptions;
  const auto& be = lf::backend::cpu_backend();
  auto c = lf::testing::tiny_decoder_config();
  c.num_layers = 3;
  auto tokens = at::randint(0, 50, {2, 12}, at::TensorOptions().dtype(at::kLong));
  auto run = [&](R r) {
    CausalLm m(c, be, 9, at::kFloat);
    m.add_lora(all_linear(), 9);
    m.load_full_lora(random_adapters(m, 4));
    m.set_recompute(r);
    auto loss = m.loss(tokens, tokens).sum();
    loss.backward();
    for (const auto& p : m.parameters()) EXPECT_FALSE(p.tensor.grad().defined()) << p.name << " got a gradient";
    std::vector<at::Tensor> out{loss.detach()};
    for (const auto& p : m.lora_parameters()) out.push_back(p.tensor.grad());
    return out;
  };
  const auto want = run(R{});
  for (const auto& [name, r] : std::vector<std::pair<const char*, R>>{
           {"full uniform 1", {R::Granularity::full, R::Method::uniform, 1}},
           {"selective", {R::Granularity::selective, R::Method::uniform, 1}}}) {
    const auto got = run(r);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].defined()) << name << " tensor " << i << " has no gradient";
      EXPECT_TRUE(at::allclose(got[i], want[i], 1e-6, 1e-7)) << name << " tensor " << i;
    }
  }
}

TEST(LoraAdapter, DropoutActsInTrainingOnly) {
  const auto& be = lf::backend::cpu_backend();
  auto c = lf::testing::tiny_decoder_config();
  auto tokens = at::randint(0, 50, {2, 10}, at::TensorOptions().dtype(at::kLong));
  CausalLm m(c, be, 3, at::kFloat), nodrop(c, be, 3, at::kFloat);
  m.add_lora(all_linear(4, 8, 0.5), 3);
  nodrop.add_lora(all_linear(4, 8, 0.0), 3);
  const auto adapters = random_adapters(m, 2);
  m.load_full_lora(adapters);
  nodrop.load_full_lora(adapters);
  at::NoGradGuard g;
  m.set_training(false);
  nodrop.set_training(false);
  const auto want = nodrop.loss(tokens, tokens);
  EXPECT_TRUE(at::equal(m.loss(tokens, tokens), want));  // evaluation: no dropout
  m.set_training(true);
  const auto a = m.loss(tokens, tokens), b = m.loss(tokens, tokens);
  EXPECT_FALSE(at::allclose(a, want));  // training: the adapters' inputs are dropped
  EXPECT_FALSE(at::equal(a, b));        // the stream advances
  nodrop.set_training(true);
  EXPECT_TRUE(at::equal(nodrop.loss(tokens, tokens), want));  // dropout 0 is the identity
}

// PEFT's file names and config round-trip through write_peft_adapter / read_peft_adapter; an
// adapter for more layers than the model has, or a DoRA adapter, is refused naming the file.
TEST(LoraAdapter, PeftFilesRoundTripAndMismatchesAreRefused) {
  const auto& be = lf::backend::cpu_backend();
  auto c = lf::testing::tiny_decoder_config();
  CausalLm m(c, be, 3, at::kFloat);
  const LoraSpec spec = LoraSpec::from(4, 16, 0.05, true, {"q_proj", "o_proj", "down_proj"});
  m.add_lora(spec, 3);
  const auto adapters = random_adapters(m, 8);
  lf::models::NamedTensorList list(adapters.begin(), adapters.end());
  const std::string dir = lf::testing::make_temp_dir("peft_io") + "/adapter";
  lf::models::write_peft_adapter(dir, spec, list, "/models/base");
  const auto back = lf::models::read_peft_adapter(dir, c);
  EXPECT_EQ(back.spec.rank, 4);
  EXPECT_EQ(back.spec.alpha, 16);
  EXPECT_TRUE(back.spec.rslora);
  EXPECT_EQ(back.spec.targets.size(), 3u);
  EXPECT_EQ(back.base_model, "/models/base");
  ASSERT_EQ(back.tensors.size(), adapters.size());
  for (const auto& [n, t] : back.tensors) EXPECT_TRUE(at::equal(t, adapters.at(n))) << n;
  auto fewer = c;
  fewer.num_layers = 1;
  try {
    lf::models::read_peft_adapter(dir, fewer);
    FAIL() << "an adapter for 2 layers loaded into 1";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 does not exist"), std::string::npos) << e.what();
  }
  {
    std::ofstream(dir + "/adapter_config.json") << R"({"peft_type": "LORA", "r": 4, "use_dora": true, "target_modules": ["q_proj"]})";
  }
  try {
    lf::models::read_peft_adapter(dir, c);
    FAIL() << "a DoRA adapter was accepted";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("DoRA"), std::string::npos) << e.what();
  }
}

}  // namespace

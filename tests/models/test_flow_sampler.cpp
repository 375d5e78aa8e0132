// The flow-matching Euler sampler (models/flow_sampler.h) against diffusers
// (tests/models/wan_sample_oracle.py, Python as an oracle only): FlowMatchEulerDiscreteScheduler's
// schedule (shift 5, 8 steps) value for value, and the final latents of the oracle's tiny random
// WanTransformer3DModel sampled from the same noise and text embeddings with classifier-free
// guidance 4, guidance 1 (one pass), first-frame conditioning (Wan 2.2 TI2V) and two noise experts
// joined at a boundary timestep (Wan 2.2 A14B), fp32 within 1e-4.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "cached_oracle.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/models/blocks/param_builder.h"
#include "loongforge/models/flow_sampler.h"
#include "loongforge/models/wan_diffusers.h"
#include "multiprocess.h"

namespace {
namespace fs = std::filesystem;
namespace df = lf::models::diffusers;
using lf::models::FlowSamplerOptions;

std::string oracle_dir() {
  static const std::string dir = lf::testing::cached_oracle(
      lf::testing::source_dir() + "/tests/models/wan_sample_oracle.py", "wan_sample_oracle", "done");
  return dir;
}

#define REQUIRE_ORACLE()                                                    \
  if (oracle_dir().empty()) GTEST_SKIP() << "no Python environment (.venv)"; \
  ASSERT_TRUE(fs::exists(oracle_dir() + "/done"))

struct Loaded {
  std::unique_ptr<lf::models::ParamBuilder> builder;
  std::unique_ptr<lf::models::WanDit> dit;
};

Loaded load(const std::string& dir) {
  Loaded m;
  const auto c = df::read_wan_config(dir);
  m.builder = std::make_unique<lf::models::ParamBuilder>(at::make_generator<at::CPUGeneratorImpl>(0), at::kFloat,
                                                         at::Device(at::kCPU), lf::parallel::TensorParallel{},
                                                         /*trainable=*/false);
  m.dit = std::make_unique<lf::models::WanDit>(c, lf::backend::cpu_backend(), *m.builder, 0, 0);
  df::load_into(m.builder->params(), df::read_wan_weights(dir, at::kFloat), dir);
  m.dit->set_training(false);
  return m;
}

TEST(FlowSampler, ScheduleIsDiffusersFlowMatchEuler) {
  REQUIRE_ORACLE();
  const auto r = lf::testing::read_safetensors(oracle_dir() + "/t2v/sample.safetensors");
  const auto s = lf::models::flow_euler_schedule(8, 5.0);
  ASSERT_EQ(s.sigmas.size(), 9u);
  ASSERT_EQ(s.timesteps.size(), 8u);
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(s.sigmas[i], r.at("sigmas")[int64_t(i)].item<float>()) << i;
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(s.timesteps[i], r.at("timesteps")[int64_t(i)].item<float>()) << i;
  // Without shift the grid is linear from 1000 to 1 (numpy's linspace, fp64, then fp32).
  const auto plain = lf::models::flow_euler_schedule(4, 1.0);
  const std::vector<float> want{1000.0f, 667.0f, 334.0f, 1.0f};
  ASSERT_EQ(plain.timesteps.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(plain.timesteps[i], want[i], 1e-3) << i;
  EXPECT_EQ(plain.sigmas.back(), 0.0f);
  const auto one = lf::models::flow_euler_schedule(1, 5.0);
  EXPECT_EQ(one.sigmas, (std::vector<float>{1.0f, 0.0f}));
  EXPECT_THROW(lf::models::flow_euler_schedule(0, 5.0), lf::Error);
}

TEST(FlowSampler, EulerWithGuidanceEqualsDiffusers) {
  REQUIRE_ORACLE();
  auto m = load(oracle_dir() + "/t2v");
  const auto r = lf::testing::read_safetensors(oracle_dir() + "/t2v/sample.safetensors");
  const auto& noise = r.at("noise");
  const int64_t b = noise.size(0);
  const at::Tensor text = r.at("prompt").unsqueeze(0).expand({b, -1, -1});
  const at::Tensor negative = r.at("negative_prompt").unsqueeze(0).expand({b, -1, -1});
  FlowSamplerOptions o;
  o.num_inference_steps = 8;
  o.shift = 5.0;
  int64_t calls = 0;
  const lf::models::FlowVelocity counted = [&](const lf::models::WanInputs& in) {
    ++calls;
    return m.dit->forward(in);
  };
  const auto& ps = m.dit->config().patch_size;
  for (const auto& [g, want_name, passes] :
       {std::tuple<double, const char*, int64_t>{4.0, "latents_g4", 2}, {1.0, "latents_g1", 1}}) {
    o.guidance_scale = g;
    calls = 0;
    const at::Tensor got = lf::models::flow_euler_sample(counted, noise, text, negative, {}, ps, o);
    EXPECT_EQ(calls, 8 * passes) << "guidance " << g;
    const double diff = (got - r.at(want_name)).abs().max().item<double>();
    std::printf("[flow sampler] guidance %g: max |latents - diffusers| = %.3g (max |latents| %.3g)\n", g, diff,
                r.at(want_name).abs().max().item<double>());
    EXPECT_LE(diff, 1e-4) << want_name;
  }
  // No negative text: one pass whatever the guidance, the same as guidance 1.
  o.guidance_scale = 4.0;
  calls = 0;
  const at::Tensor single = lf::models::flow_euler_sample(counted, noise, text, {}, {}, ps, o);
  EXPECT_EQ(calls, 8);
  EXPECT_LE((single - r.at("latents_g1")).abs().max().item<double>(), 1e-4);
  // The WanDit overload is the same sampler.
  const at::Tensor again = lf::models::flow_euler_sample(*m.dit, noise, text, negative, {}, o);
  EXPECT_LE((again - r.at("latents_g4")).abs().max().item<double>(), 1e-4);
}

TEST(FlowSampler, FirstFrameConditioningEqualsDiffusersTi2v) {
  REQUIRE_ORACLE();
  auto m = load(oracle_dir() + "/t2v");
  const auto r = lf::testing::read_safetensors(oracle_dir() + "/t2v/sample.safetensors");
  const auto& noise = r.at("noise");
  const int64_t b = noise.size(0);
  FlowSamplerOptions o;
  o.num_inference_steps = 8;
  o.guidance_scale = 4.0;
  o.first_frame = r.at("first_frame");
  const at::Tensor got = lf::models::flow_euler_sample(*m.dit, noise, r.at("prompt").unsqueeze(0).expand({b, -1, -1}),
                                                       r.at("negative_prompt").unsqueeze(0).expand({b, -1, -1}), {}, o);
  const double diff = (got - r.at("latents_first_frame")).abs().max().item<double>();
  std::printf("[flow sampler] first frame: max |latents - diffusers| = %.3g\n", diff);
  EXPECT_LE(diff, 1e-4);
  EXPECT_TRUE(at::equal(got.narrow(2, 0, 1), o.first_frame));
  // A first frame of another shape is an error.
  o.first_frame = r.at("first_frame").narrow(3, 0, 4);
  EXPECT_THROW(lf::models::flow_euler_sample(*m.dit, noise, r.at("prompt").unsqueeze(0).expand({b, -1, -1}), {}, {}, o),
               lf::Error);
}

// Wan 2.2 A14B: the high-noise expert at timesteps >= 800 (guidance 4), the low-noise one below
// (guidance 2), as diffusers' WanPipeline with boundary_ratio 0.8 joins them.
TEST(FlowSampler, TwoNoiseExpertsSwitchAtTheBoundaryAsDiffusers) {
  REQUIRE_ORACLE();
  auto high = load(oracle_dir() + "/t2v");
  auto low = load(oracle_dir() + "/t2v_low");
  const auto r = lf::testing::read_safetensors(oracle_dir() + "/t2v/sample.safetensors");
  const auto& noise = r.at("noise");
  const int64_t b = noise.size(0);
  int64_t high_calls = 0, low_calls = 0;
  FlowSamplerOptions o;
  o.num_inference_steps = 8;
  o.guidance_scale = 4.0;
  o.guidance_scale_low = 2.0;
  o.boundary_timestep = 0.8 * 1000;
  o.low_noise = [&](const lf::models::WanInputs& in) {
    ++low_calls;
    return low.dit->forward(in);
  };
  const at::Tensor got = lf::models::flow_euler_sample(
      [&](const lf::models::WanInputs& in) {
        ++high_calls;
        return high.dit->forward(in);
      },
      noise, r.at("prompt").unsqueeze(0).expand({b, -1, -1}), r.at("negative_prompt").unsqueeze(0).expand({b, -1, -1}),
      {}, high.dit->config().patch_size, o);
  // Timesteps 1000, 968, 926, 871 on the high-noise expert, 791 ... 24 on the low-noise one.
  EXPECT_EQ(high_calls, 4 * 2);
  EXPECT_EQ(low_calls, 4 * 2);
  const double diff = (got - r.at("latents_two_experts")).abs().max().item<double>();
  std::printf("[flow sampler] two experts: max |latents - diffusers| = %.3g\n", diff);
  EXPECT_LE(diff, 1e-4);
}

}  // namespace

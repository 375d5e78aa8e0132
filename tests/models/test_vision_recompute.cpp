// The job's full recomputation (--recompute-granularity full, uniform or block) reaches the
// vision towers' blocks (Qwen2.5-VL, Qwen3-VL with its DeepStack outputs, InternViT): outputs
// and every gradient are bit for bit those without it, and after the forward the tower holds
// less (the live tensor memory of the CPU backend).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <functional>

#include "loongforge/backend/registry.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/composites/internvl.h"
#include "loongforge/models/composites/qwen2_5_vl.h"
#include "loongforge/models/composites/qwen3_vl.h"
#include "loongforge/models/encoders/intern_vit.h"
#include "loongforge/models/encoders/qwen2_5_vl_vision.h"
#include "loongforge/models/encoders/qwen3_vl_vision.h"
#include "loongforge/models/blocks/param_builder.h"
#include "tiny_decoder.h"

namespace {
using R = lf::models::RecomputeOptions;

lf::models::ParamBuilder builder() {
  return lf::models::ParamBuilder(at::make_generator<at::CPUGeneratorImpl>(7), at::kFloat, c10::Device(c10::kCPU), {});
}

// One forward + backward: the outputs, every gradient, and the live bytes the forward left.
struct Pass {
  std::vector<at::Tensor> tensors;
  int64_t kept = 0;
};

template <class Encoder, class Forward>
Pass run(Encoder& e, const R& r, const Forward& forward) {
  const auto& be = lf::backend::cpu_backend();
  for (const auto& p : e.parameters()) p.tensor.mutable_grad() = at::Tensor();
  e.set_recompute(r);
  Pass out;
  std::vector<at::Tensor> outputs;
  {
    const int64_t before = be.memory_stats().allocated_bytes;
    outputs = forward();
    out.kept = be.memory_stats().allocated_bytes - before;
  }
  at::Tensor loss;
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto term = (outputs[i] * outputs[i]).sum() * static_cast<double>(i + 1);
    loss = loss.defined() ? loss + term : term;
  }
  loss.backward();
  for (auto& o : outputs) out.tensors.push_back(o.detach());
  for (const auto& p : e.parameters()) out.tensors.push_back(p.tensor.grad());
  return out;
}

template <class Encoder, class Forward>
void expect_recomputation_exact_and_smaller(Encoder& e, const Forward& forward, const char* what) {
  const Pass plain = run(e, R{}, forward);
  const std::pair<const char*, R> modes[] = {{"full uniform 1", {R::Granularity::full, R::Method::uniform, 1}},
                                             {"full uniform 2", {R::Granularity::full, R::Method::uniform, 2}},
                                             {"full block 1", {R::Granularity::full, R::Method::block, 1}}};
  for (const auto& [name, r] : modes) {
    const Pass got = run(e, r, forward);
    ASSERT_EQ(got.tensors.size(), plain.tensors.size());
    for (size_t i = 0; i < got.tensors.size(); ++i) {
      ASSERT_TRUE(got.tensors[i].defined()) << what << " " << name << " tensor " << i;
      EXPECT_TRUE(at::equal(got.tensors[i], plain.tensors[i])) << what << " " << name << " tensor " << i;
    }
    std::printf("[%s] %s: the forward keeps %lld bytes, %lld without recomputation\n", what, name,
                static_cast<long long>(got.kept), static_cast<long long>(plain.kept));
    if (r.method == R::Method::uniform && r.num_layers == 1)
      EXPECT_LT(got.kept, plain.kept / 2) << what << ": recomputation keeps as much as a plain forward";
    else
      EXPECT_LT(got.kept, plain.kept) << what << " " << name;
  }
}

// Four-block towers of width 32 (the composites' foundation width, tiny_decoder.h).
lf::models::Qwen25VisionConfig qwen25_tower() {
  lf::models::Qwen25VisionConfig c;
  c.depth = 4;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_heads = 2;
  c.window_size = 56;
  c.fullatt_block_indexes = {1, 3};
  c.out_hidden_size = 32;
  return c;
}
lf::models::Qwen3VisionConfig qwen3_tower() {
  lf::models::Qwen3VisionConfig c;
  c.depth = 4;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_heads = 2;
  c.num_position_embeddings = 16;
  c.deepstack_visual_indexes = {0, 2};
  c.out_hidden_size = 32;
  return c;
}
lf::models::InternVisionConfig intern_tower() {
  lf::models::InternVisionConfig c;
  c.hidden_size = 32;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 2;
  c.intermediate_size = 64;
  c.image_size = 56;
  c.out_hidden_size = 32;
  return c;
}

TEST(VisionRecompute, Qwen25TowerRecomputesItsBlocks) {
  const auto c = qwen25_tower();
  auto b = builder();
  lf::models::Qwen25VisionEncoder e(c, lf::backend::cpu_backend(), b, "vision_encoder");
  const auto grid = at::tensor({1, 8, 8, 1, 4, 6}, at::kLong).view({2, 3});
  const auto pixels = at::randn({88, c.patch_dim()}, at::make_generator<at::CPUGeneratorImpl>(3));
  expect_recomputation_exact_and_smaller(e, [&] { return std::vector<at::Tensor>{e.forward(pixels, grid)}; },
                                         "qwen2_5_vl_vision");
}

// DeepStack reads the outputs of blocks 0 and 2: recomputed groups end there.
TEST(VisionRecompute, Qwen3TowerRecomputesItsBlocksAndKeepsTheDeepStackOutputs) {
  const auto c = qwen3_tower();
  auto b = builder();
  lf::models::Qwen3VisionEncoder e(c, lf::backend::cpu_backend(), b, "vision_encoder");
  const auto grid = at::tensor({1, 8, 8, 1, 4, 6}, at::kLong).view({2, 3});
  const auto pixels = at::randn({88, c.patch_dim()}, at::make_generator<at::CPUGeneratorImpl>(3));
  expect_recomputation_exact_and_smaller(
      e,
      [&] {
        auto out = e.forward(pixels, grid);
        std::vector<at::Tensor> all{out.merged};
        all.insert(all.end(), out.deepstack.begin(), out.deepstack.end());
        return all;
      },
      "qwen3_vl_vision");
}

TEST(VisionRecompute, InternVitRecomputesItsBlocks) {
  const auto c = intern_tower();
  auto b = builder();
  lf::models::InternVisionEncoder e(c, lf::backend::cpu_backend(), b, "vision_encoder");
  const auto [rows, grid] =
      e.rows_of_pixels(at::randn({2, 3, c.image_size, c.image_size}, at::make_generator<at::CPUGeneratorImpl>(3)));
  expect_recomputation_exact_and_smaller(e, [&] { return std::vector<at::Tensor>{e.forward(rows, grid)}; },
                                         "intern_vit");
}

// The composites hand the job's recomputation (Model::set_recompute) to the decoder and the tower.
TEST(VisionRecompute, TheCompositesPassTheJobsRecomputationToTheTower) {
  const auto& be = lf::backend::cpu_backend();
  const auto text = lf::testing::tiny_decoder_config();
  const R r{R::Granularity::full, R::Method::block, 3};
  auto expect = [&](const lf::models::CausalLm& m, const R& tower, const char* what) {
    EXPECT_EQ(m.recompute().granularity, R::Granularity::full) << what;
    EXPECT_EQ(tower.granularity, R::Granularity::full) << what;
    EXPECT_EQ(tower.method, R::Method::block) << what;
    EXPECT_EQ(tower.num_layers, 3) << what;
  };
  lf::models::Qwen25VlConfig q25;
  q25.image_token_id = 7;
  q25.video_token_id = 8;
  lf::models::Qwen25Vl a(text, qwen25_tower(), q25, be, 1, at::kFloat, nullptr, false, {});
  a.set_recompute(r);
  expect(a, a.vision_encoder().recompute(), "qwen2_5_vl");
  lf::models::Qwen3VlConfig q3;
  q3.image_token_id = 7;
  q3.video_token_id = 8;
  auto text3 = text;  // interleaved M-RoPE over head_dim / 2 = 4
  text3.mrope_section = {2, 1, 1};
  text3.mrope_interleaved = true;
  lf::models::Qwen3Vl b(text3, qwen3_tower(), q3, be, 1, at::kFloat, nullptr, false, {});
  b.set_recompute(r);
  expect(b, b.vision_encoder().recompute(), "qwen3_vl");
  lf::models::InternVlConfig iv;
  iv.image_token_id = 7;
  lf::models::InternVl c(text, intern_tower(), iv, be, 1, at::kFloat, nullptr, false, {});
  c.set_recompute(r);
  expect(c, c.vision_encoder().recompute(), "internvl");
}

}  // namespace

// The blocks every foundation is made of, each against an independent plain-ATen composition:
// attention under its masks (bidirectional, block / packed documents, prefix-LM) and
// cross-attention, the adaptive (modulated) norm, and the RoPE tables (1D at arbitrary positions,
// multi-section M-RoPE, N-D) against their defining formulas and invariants.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/models/blocks/attention.h"
#include "loongforge/models/blocks/norms.h"
#include "loongforge/models/blocks/rope.h"

namespace {
using namespace lf::models;

// fp32, tiny shapes: the backend's fused attention and ATen's differ by summation order only.
constexpr double kTol = 1e-5;

ParamBuilder builder(uint64_t seed) {
  return ParamBuilder(at::make_generator<at::CPUGeneratorImpl>(seed), at::kFloat, c10::Device(c10::kCPU), {});
}

const at::Tensor& param(const ParamBuilder& b, const std::string& name) {
  for (const auto& p : b.params())
    if (p.name == name) return p.tensor;
  throw std::runtime_error("no parameter " + name);
}

AttentionConfig attention_config() {
  AttentionConfig c;
  c.hidden_size = 16;
  c.num_heads = 4;
  c.num_groups = 2;
  c.head_dim = 4;
  c.qkv_bias = true;
  return c;
}

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::normal(0.0, 1.0, shape, g, at::kFloat);
}

// Plain self-attention over the block's own weights: x [s, b, h], mask bool [b, 1, s, s] (true:
// may attend) or undefined (bidirectional).
at::Tensor reference_attention(const ParamBuilder& b, const AttentionConfig& c, const at::Tensor& x,
                               const at::Tensor& mask) {
  const int64_t s = x.size(0), bs = x.size(1), d = c.head_dim, nq = c.num_heads, nkv = c.num_groups;
  auto qkv = at::linear(x, param(b, "attn.linear_qkv.weight"), param(b, "attn.linear_qkv.bias"))
                 .view({s, bs, nkv, nq / nkv + 2, d});
  auto parts = qkv.split({nq / nkv, 1, 1}, 3);
  auto q = parts[0].reshape({s, bs, nq, d}).permute({1, 2, 0, 3});
  auto k = parts[1].reshape({s, bs, nkv, d}).permute({1, 2, 0, 3}).repeat_interleave(nq / nkv, 1);
  auto v = parts[2].reshape({s, bs, nkv, d}).permute({1, 2, 0, 3}).repeat_interleave(nq / nkv, 1);
  auto o = at::scaled_dot_product_attention(q, k, v, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt);
  return at::linear(o.permute({2, 0, 1, 3}).reshape({s, bs, nq * d}), param(b, "attn.linear_proj.weight"));
}

TEST(AttentionBlock, BidirectionalEqualsPlainAttentionWithoutMask) {
  auto b = builder(3);
  const auto c = attention_config();
  SelfAttention attn(b, "attn", c);
  auto x = randn({6, 2, 16}, 4);
  AttentionInputs in;
  in.mask = lf::backend::AttentionMask::none();
  auto got = attn.forward(lf::backend::cpu_backend(), {}, x, in, 0);
  auto want = reference_attention(b, c, x, {});
  EXPECT_LE((got - want).abs().max().item<double>(), kTol);
  // Bidirectional differs from causal: the first position sees the last.
  AttentionInputs causal;
  auto c_out = attn.forward(lf::backend::cpu_backend(), {}, x, causal, 0);
  EXPECT_GT((c_out - got).abs().max().item<double>(), 1e-3);
}

TEST(AttentionBlock, BlockMaskEqualsEachDocumentAlone) {
  auto b = builder(5);
  const auto c = attention_config();
  SelfAttention attn(b, "attn", c);
  // Two packed documents per sample: positions 0-2 and 3-7 (sample 0), 0-4 and 5-7 (sample 1).
  auto x = randn({8, 2, 16}, 6);
  auto docs = at::tensor({0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1}, at::kLong).view({2, 8});
  AttentionInputs in;
  in.mask = lf::backend::AttentionMask::boolean(block_causal_mask(docs));
  auto got = attn.forward(lf::backend::cpu_backend(), {}, x, in, 0);
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> spans = {{{0, 3}, {3, 5}}, {{0, 5}, {5, 3}}};
  for (int64_t i = 0; i < 2; ++i)
    for (auto [start, len] : spans[static_cast<size_t>(i)]) {
      AttentionInputs alone;  // causal over the document by itself
      auto doc = attn.forward(lf::backend::cpu_backend(), {}, x.narrow(0, start, len).narrow(1, i, 1).contiguous(), alone, 0);
      auto part = got.narrow(0, start, len).narrow(1, i, 1);
      EXPECT_LE((part - doc).abs().max().item<double>(), kTol) << "sample " << i << " document at " << start;
    }
}

TEST(AttentionBlock, PrefixLmMaskIsBidirectionalInThePrefixCausalAfter) {
  auto m = prefix_lm_mask(at::tensor({3, 0}, at::kLong), 5);  // [2, 1, 5, 5]
  ASSERT_EQ(m.sizes(), (std::vector<int64_t>{2, 1, 5, 5}));
  for (int64_t q = 0; q < 5; ++q)
    for (int64_t k = 0; k < 5; ++k) {
      EXPECT_EQ(m[0][0][q][k].item<bool>(), k <= q || k < 3) << q << "," << k;
      EXPECT_EQ(m[1][0][q][k].item<bool>(), k <= q) << q << "," << k;  // no prefix: causal
    }
  auto b = builder(7);
  const auto c = attention_config();
  SelfAttention attn(b, "attn", c);
  auto x = randn({5, 2, 16}, 8);
  AttentionInputs in;
  in.mask = lf::backend::AttentionMask::boolean(m);
  EXPECT_LE((attn.forward(lf::backend::cpu_backend(), {}, x, in, 0) - reference_attention(b, c, x, m)).abs().max().item<double>(),
            kTol);
}

TEST(AttentionBlock, CrossAttentionEqualsPlainComposition) {
  auto b = builder(9);
  auto c = attention_config();
  c.qkv_bias = false;
  CrossAttention attn(b, "cross", c, /*context_size=*/12);
  auto x = randn({5, 2, 16}, 10), ctx = randn({7, 2, 12}, 11);
  auto got = attn.forward(lf::backend::cpu_backend(), {}, x, ctx);
  const int64_t d = 4, nq = 4, nkv = 2;
  auto q = at::linear(x, param(b, "cross.linear_q.weight")).view({5, 2, nq, d}).permute({1, 2, 0, 3});
  auto kv = at::linear(ctx, param(b, "cross.linear_kv.weight")).view({7, 2, nkv, 2, d});
  auto k = kv.select(3, 0).permute({1, 2, 0, 3}).repeat_interleave(nq / nkv, 1);
  auto v = kv.select(3, 1).permute({1, 2, 0, 3}).repeat_interleave(nq / nkv, 1);
  auto o = at::scaled_dot_product_attention(q, k, v).permute({2, 0, 1, 3}).reshape({5, 2, nq * d});
  auto want = at::linear(o, param(b, "cross.linear_proj.weight"));
  EXPECT_LE((got - want).abs().max().item<double>(), kTol);
}

TEST(AdaptiveNorm, ModulatesThePlainNormAndGatesTheBranch) {
  auto b = builder(12);
  AdaptiveNorm norm(b, "block", /*cond_size=*/6, /*h=*/8, /*outputs=*/3, NormSpec{false, 1e-6});
  // adaLN-Zero: the modulation starts at zero, so the block starts as the plain norm, gate 0.
  auto x = randn({4, 2, 8}, 13), cond = randn({2, 6}, 14);
  const auto& be = lf::backend::cpu_backend();
  auto m0 = norm.modulation(be, cond);
  auto plain = x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6);
  EXPECT_LE((norm(be, x, m0) - plain).abs().max().item<double>(), 1e-5);
  // With weights: norm(x) * (1 + scale) + shift, gate * branch.
  at::NoGradGuard no_grad;
  for (const auto& p : b.params()) p.tensor.copy_(randn(p.tensor.sizes().vec(), 15 + p.tensor.numel()));
  auto w = param(b, "block.adaLN_modulation.weight"), bias = param(b, "block.adaLN_modulation.bias");
  auto mod = at::linear(at::silu(cond), w, bias).split(8, -1);
  auto m = norm.modulation(be, cond);
  auto want = plain * (1 + mod[1].unsqueeze(0)) + mod[0].unsqueeze(0);
  EXPECT_LE((norm(be, x, m) - want).abs().max().item<double>(), 1e-5);
  auto branch = randn({4, 2, 8}, 16);
  EXPECT_LE((AdaptiveNorm::gated(x, branch, m) - (x + mod[2].unsqueeze(0) * branch)).abs().max().item<double>(), 1e-6);
}

TEST(Rope, TablesAtPositionsEqualContiguousTables) {
  RopeSpec spec{8, 10000};
  auto [c1, s1] = rope_tables(spec, 3, 5, at::kFloat);
  auto [c2, s2] = rope_tables_at(spec, at::arange(3, 8, at::kLong), at::kFloat);
  EXPECT_TRUE(at::allclose(c1, c2) && at::allclose(s1, s2));
  // The definition: angle[p, i] = p * base^(-2i/d), both halves alike.
  EXPECT_NEAR(c1[2][1].item<double>(), std::cos(5 * std::pow(10000.0, -2.0 / 8)), 1e-6);
  EXPECT_NEAR(s1[2][5].item<double>(), std::sin(5 * std::pow(10000.0, -2.0 / 8)), 1e-6);
}

TEST(Rope, MultiSectionWithEqualAxesIsOneDimensional) {
  RopeSpec spec{16, 10000};
  auto pos = at::arange(0, 6, at::kLong);
  auto [c1, s1] = rope_tables_at(spec, pos, at::kFloat);
  auto [cm, sm] = mrope_tables(spec, at::stack({pos, pos, pos}), {2, 3, 3}, at::kFloat);
  EXPECT_TRUE(at::allclose(c1, cm) && at::allclose(s1, sm));
  // Different axes: frequency i takes its section's axis (t: 0-1, h: 2-4, w: 5-7).
  auto t = at::zeros({6}, at::kLong), h = pos, w = pos * 2;
  auto [c3, s3] = mrope_tables(spec, at::stack({t, h, w}), {2, 3, 3}, at::kFloat);
  const auto inv = rope_inv_freq(spec);
  for (int64_t i = 0; i < 8; ++i) {
    const double p = i < 2 ? 0.0 : i < 5 ? 4.0 : 8.0;  // position 4 on each axis
    EXPECT_NEAR(c3[4][i].item<double>(), std::cos(p * inv[i].item<double>()), 1e-6) << i;
    EXPECT_NEAR(c3[4][i + 8].item<double>(), c3[4][i].item<double>(), 1e-7) << "halves";
  }
  EXPECT_THROW(mrope_tables(spec, at::stack({t, h, w}), {2, 3, 4}, at::kFloat), lf::Error);
}

// M-RoPE on DeepSeek's decoupled RoPE dims: the tables follow the spec (pairs layout, YaRN's
// frequencies and attention factor), so equal axes are exactly the 1D tables, and each pair of
// dims (2i, 2i+1) turns by its frequency's section's axis.
TEST(Rope, MultiSectionFollowsTheSpecsPairsLayoutAndYarn) {
  RopeSpec spec{8, 10000};
  spec.interleaved = true;
  spec.yarn = true;
  spec.yarn_factor = 4;
  spec.original_max_position = 32;
  spec.mscale = 0.7;
  spec.mscale_all_dim = 1.0;
  ASSERT_NE(rope_attention_factor(spec), 1.0);
  auto pos = at::arange(0, 6, at::kLong);
  auto [c1, s1] = rope_tables_at(spec, pos, at::kFloat);
  for (bool interleaved_sections : {false, true}) {
    auto [cm, sm] = mrope_tables(spec, at::stack({pos, pos, pos}), {1, 1, 2}, at::kFloat, interleaved_sections);
    EXPECT_TRUE(at::equal(c1, cm) && at::equal(s1, sm)) << interleaved_sections;
  }
  auto t = at::zeros({6}, at::kLong), h = pos, w = pos * 2;
  auto [c3, s3] = mrope_tables(spec, at::stack({t, h, w}), {1, 1, 2}, at::kFloat);
  const auto inv = rope_inv_freq(spec);
  const double a = rope_attention_factor(spec);
  for (int64_t i = 0; i < 4; ++i) {
    const double p = i < 1 ? 0.0 : i < 2 ? 4.0 : 8.0;  // position 4 on each axis
    for (int64_t j : {2 * i, 2 * i + 1})
      EXPECT_NEAR(s3[4][j].item<double>(), a * std::sin(p * inv[i].item<double>()), 1e-6) << i << " " << j;
  }
}

TEST(Rope, NdTablesGiveEachAxisItsOwnFrequencies) {
  auto rows = at::arange(0, 4, at::kLong), cols = at::arange(10, 14, at::kLong);
  // One axis is 1D RoPE.
  auto [c1, s1] = rope_nd_tables(10000, {8}, rows.unsqueeze(0), at::kFloat);
  auto [cr, sr] = rope_tables_at(RopeSpec{8, 10000}, rows, at::kFloat);
  EXPECT_TRUE(at::allclose(c1, cr) && at::allclose(s1, sr));
  // 2D (ViT): axis 0 owns rotation pairs 0-1 (dims 4), axis 1 pairs 2-5 (dims 8), of d = 12.
  auto [c2, s2] = rope_nd_tables(100, {4, 8}, at::stack({rows, cols}), at::kFloat);
  ASSERT_EQ(c2.sizes(), (std::vector<int64_t>{4, 12}));
  for (int64_t n = 0; n < 4; ++n) {
    for (int64_t i = 0; i < 2; ++i)
      EXPECT_NEAR(c2[n][i].item<double>(), std::cos(n * std::pow(100.0, -2.0 * i / 4)), 1e-6);
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_NEAR(s2[n][2 + i].item<double>(), std::sin((10 + n) * std::pow(100.0, -2.0 * i / 8)), 1e-5);
    EXPECT_NEAR(c2[n][6].item<double>(), c2[n][0].item<double>(), 1e-7) << "second half repeats the first";
  }
}

}  // namespace

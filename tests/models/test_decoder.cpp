// The decoder through the backend's fused ops equals an independent plain-ATen composition of the
// same math (RMSNorm, rotate-half RoPE, GQA causal attention via at::scaled_dot_product_attention,
// SwiGLU, cross-entropy), in logits, loss and every parameter gradient.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "loongforge/backend/registry.h"
#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/models/causal_lm.h"
#include "loongforge/models/decoder.h"

namespace {
using lf::models::DecoderConfig;

DecoderConfig tiny() {
  DecoderConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.ffn_hidden_size = 48;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 8;
  c.max_position_embeddings = 16;
  return c;
}

at::Tensor rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * w;
}
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // x: [s, b, n, d]; cos/sin: [s, d]
  auto halves = x.chunk(2, -1);
  auto rot = at::cat({-halves[1], halves[0]}, -1);
  return x * cos.unsqueeze(1).unsqueeze(1) + rot * sin.unsqueeze(1).unsqueeze(1);
}

// The same forward, written with plain ATen over the decoder's own parameter tensors.
at::Tensor reference_logits(const lf::models::Decoder& m, const at::Tensor& tokens) {
  const auto& c = m.config();
  const auto& p = m.parameters();
  auto get = [&](const std::string& name) {
    for (const auto& np : p)
      if (np.name == name) return np.tensor;
    ADD_FAILURE() << "no parameter " << name;
    return at::Tensor();
  };
  const int64_t s = tokens.size(1), b = tokens.size(0), d = c.head_dim(),
                nq = c.num_attention_heads, nkv = c.query_groups();
  auto [cos, sin] = lf::models::rope_tables(s, d, c.rotary_base, at::kFloat);
  auto emb = get("embedding.word_embeddings.weight");
  auto x = emb.index_select(0, tokens.t().reshape({-1})).view({s, b, -1});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    std::string pre = "decoder.layers." + std::to_string(i) + ".";
    auto h = rms(x, get(pre + "input_layernorm.weight"), c.norm_epsilon);
    // Megatron's per-group layout: for each query group, its nq/nkv query heads, its key, its value.
    auto qkv = at::matmul(h, get(pre + "self_attention.linear_qkv.weight").t())
                   .view({s, b, nkv, nq / nkv + 2, d});
    auto parts = qkv.split({nq / nkv, 1, 1}, 3);
    auto q = rotate(parts[0].reshape({s, b, nq, d}), cos, sin).permute({1, 2, 0, 3});
    auto k = rotate(parts[1].reshape({s, b, nkv, d}), cos, sin).permute({1, 2, 0, 3});
    auto v = parts[2].reshape({s, b, nkv, d}).permute({1, 2, 0, 3});
    k = k.repeat_interleave(nq / nkv, 1);
    v = v.repeat_interleave(nq / nkv, 1);
    auto o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    o = o.permute({2, 0, 1, 3}).reshape({s, b, nq * d});
    x = x + at::matmul(o, get(pre + "self_attention.linear_proj.weight").t());
    h = rms(x, get(pre + "pre_mlp_layernorm.weight"), c.norm_epsilon);
    auto gu = at::matmul(h, get(pre + "mlp.linear_fc1.weight").t()).chunk(2, -1);
    x = x + at::matmul(at::silu(gu[0]) * gu[1], get(pre + "mlp.linear_fc2.weight").t());
  }
  x = rms(x, get("decoder.final_layernorm.weight"), c.norm_epsilon);
  // Padding rows of the table are not part of the vocabulary: the logits stop at vocab_size.
  return at::matmul(x, emb.t()).narrow(-1, 0, c.vocab_size);
}

TEST(Decoder, ParameterCountMatchesFormula) {
  const auto& be = lf::backend::cpu_backend();
  for (bool untie : {false, true}) {
    auto c = tiny();
    c.untie_embeddings_and_output_weights = untie;
    lf::models::Decoder m(c, be, 7, at::kFloat);
    int64_t n = 0;
    for (const auto& p : m.parameters()) n += p.tensor.numel();
    EXPECT_EQ(n, c.num_parameters());
  }
  // Hand count for tiny(): vocab padded 50 -> 56; per layer qkv (4+2*2)*8*32 + proj 32*32 +
  // fc1 96*32 + fc2 32*48 + 2 norms of 32.
  EXPECT_EQ(tiny().num_parameters(), 56 * 32 + 2 * (2048 + 1024 + 3072 + 1536 + 64) + 32);
}

TEST(Decoder, SameSeedSameParameters) {
  const auto& be = lf::backend::cpu_backend();
  lf::models::Decoder a(tiny(), be, 3, at::kFloat), b(tiny(), be, 3, at::kFloat),
      c(tiny(), be, 4, at::kFloat);
  for (size_t i = 0; i < a.parameters().size(); ++i)
    EXPECT_TRUE(at::equal(a.parameters()[i].tensor, b.parameters()[i].tensor));
  EXPECT_FALSE(at::equal(a.parameters()[0].tensor, c.parameters()[0].tensor));
}

TEST(Decoder, VocabularyPaddingRowsAreZeroAndDoNotChangeOtherParameters) {
  // The padding (56 vs 64 rows) must not shift the random stream of the tensors drawn after it:
  // TP sizes pad differently and must still build the same model.
  const auto& be = lf::backend::cpu_backend();
  auto c = tiny();
  auto wide = tiny();
  wide.make_vocab_size_divisible_by = 32;
  lf::models::Decoder a(c, be, 5, at::kFloat), b(wide, be, 5, at::kFloat);
  const auto& emb_a = a.parameters()[0].tensor;
  const auto& emb_b = b.parameters()[0].tensor;
  ASSERT_EQ(emb_a.size(0), 56);
  ASSERT_EQ(emb_b.size(0), 64);
  EXPECT_TRUE(at::equal(emb_a.narrow(0, 0, 50), emb_b.narrow(0, 0, 50)));
  EXPECT_TRUE(emb_b.narrow(0, 50, 14).eq(0).all().item<bool>());
  for (size_t i = 1; i < a.parameters().size(); ++i)
    EXPECT_TRUE(at::equal(a.parameters()[i].tensor, b.parameters()[i].tensor))
        << a.parameters()[i].name;
  auto tokens = at::randint(0, 50, {2, 8}, at::TensorOptions().dtype(at::kLong));
  EXPECT_TRUE(at::allclose(a.loss(tokens, tokens), b.loss(tokens, tokens), 1e-6, 1e-6));
  EXPECT_EQ(a.forward(tokens).size(-1), 50);
}

TEST(Decoder, DropoutIsRefusedUntilImplemented) {
  auto c = tiny();
  c.hidden_dropout = 0.1;
  EXPECT_THROW(lf::models::Decoder(c, lf::backend::cpu_backend(), 1, at::kFloat), lf::Error);
}

TEST(Decoder, BackendOpsEqualPlainAtenReference) {
  const auto& be = lf::backend::cpu_backend();
  lf::models::Decoder m(tiny(), be, 11, at::kFloat);
  auto tokens = at::randint(0, 50, {3, 12}, at::TensorOptions().dtype(at::kLong));
  auto labels = at::randint(0, 50, {3, 12}, at::TensorOptions().dtype(at::kLong));
  labels.index_put_({0, 0}, -100);  // an ignored label

  auto logits = m.forward(tokens);
  auto ref = reference_logits(m, tokens);
  // fp32, different op order (fused vs composed): differences are a few ulps of O(1) values.
  EXPECT_TRUE(at::allclose(logits, ref, 1e-5, 1e-5)) << (logits - ref).abs().max();

  auto loss = m.loss(tokens, labels).sum();
  loss.backward();
  std::vector<at::Tensor> grads;
  for (const auto& p : m.parameters()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    grads.push_back(p.tensor.grad().clone());
    p.tensor.mutable_grad() = at::Tensor();
  }
  auto ref_logits = reference_logits(m, tokens);
  auto ref_loss = at::cross_entropy_loss(ref_logits.reshape({-1, ref_logits.size(-1)}),
                                         labels.t().reshape({-1}), {}, at::Reduction::Sum, -100);
  EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-4 * std::abs(ref_loss.item<double>()));
  ref_loss.backward();
  for (size_t i = 0; i < grads.size(); ++i) {
    const auto& p = m.parameters()[i];
    EXPECT_TRUE(at::allclose(grads[i], p.tensor.grad(), 1e-4, 1e-5))
        << p.name << " max diff " << (grads[i] - p.tensor.grad()).abs().max();
  }
}

TEST(CausalLm, MisspelledFoundationKeyNamesKeyAndSuggestion) {
  auto tree = lf::config::parse_yaml_string(
      "type: causal_lm\nfoundation:\n  num_layers: 2\n  hidden_sise: 8\n  ffn_hidden_size: 8\n"
      "  num_attention_heads: 2\n  vocab_size: 10\n  max_position_embeddings: 8\n",
      lf::config::Origin::from_file("model.yaml", 1));
  try {
    lf::models::load_causal_lm(tree);
    FAIL() << "no error";
  } catch (const lf::config::ConfigError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("model.foundation.hidden_sise"), std::string::npos) << what;
    EXPECT_NE(what.find("hidden_size"), std::string::npos) << what;
    EXPECT_NE(what.find("model.yaml:4"), std::string::npos) << what;
  }
}

TEST(CausalLm, GqaMustDivideHeads) {
  auto tree = lf::config::parse_yaml_string(
      "type: causal_lm\nfoundation: {num_layers: 1, hidden_size: 8, ffn_hidden_size: 8, "
      "num_attention_heads: 4, num_query_groups: 3, vocab_size: 10, max_position_embeddings: 8}\n",
      lf::config::Origin::from_file("m.yaml", 1));
  EXPECT_THROW(lf::models::load_causal_lm(tree), lf::config::ConfigError);
}
}  // namespace

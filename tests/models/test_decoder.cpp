// The decoder through the backend's fused ops equals an independent plain-ATen composition of the
// same math (RMSNorm, rotate-half RoPE, GQA causal attention via at::scaled_dot_product_attention,
// SwiGLU, cross-entropy), in logits, loss and every parameter gradient.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>

#include <map>
#include <set>

#include "loongforge/backend/fp8.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/models/composites/causal_lm.h"
#include "recording_sink.h"
#include "tiny_decoder.h"

namespace {
using lf::models::DecoderConfig;

DecoderConfig tiny() { return lf::testing::tiny_decoder_config(); }

at::Tensor rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * w;
}
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // x: [s, b, n, d]; cos/sin: [s, d]
  auto halves = x.chunk(2, -1);
  auto rot = at::cat({-halves[1], halves[0]}, -1);
  return x * cos.unsqueeze(1).unsqueeze(1) + rot * sin.unsqueeze(1).unsqueeze(1);
}

at::Tensor norm(const lf::models::DecoderConfig& c, const at::Tensor& x, const at::Tensor& w,
                const at::Tensor& b) {
  if (c.normalization == "LayerNorm") return at::layer_norm(x, {x.size(-1)}, w, b, c.norm_epsilon);
  return rms(x, w, c.norm_epsilon);
}
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  auto y = at::matmul(x, w.t());
  return b.defined() ? y + b : y;
}

// The same forward, written with plain ATen over the decoder's own parameter tensors (every
// variant: LayerNorm, GELU, biases, QK norm, llama3 RoPE scaling through rope_tables).
at::Tensor reference_logits(const lf::models::CausalLm& m, const at::Tensor& tokens) {
  const auto& c = m.config();
  const auto& p = m.parameters();
  auto get = [&](const std::string& name) {
    for (const auto& np : p)
      if (np.name == name) return np.tensor;
    return at::Tensor();  // an absent optional parameter (bias, QK norm)
  };
  const int64_t s = tokens.size(1), b = tokens.size(0), d = c.head_dim(),
                nq = c.num_attention_heads, nkv = c.query_groups();
  auto [cos, sin] = lf::models::rope_tables(lf::models::rope_spec(c), 0, s, at::kFloat);
  auto emb = get("embedding.word_embeddings.weight");
  auto x = emb.index_select(0, tokens.t().reshape({-1})).view({s, b, -1});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    std::string pre = "decoder.layers." + std::to_string(i) + ".";
    auto h = norm(c, x, get(pre + "input_layernorm.weight"), get(pre + "input_layernorm.bias"));
    // Megatron's per-group layout: for each query group, its nq/nkv query heads, its key, its value.
    auto qkv = linear(h, get(pre + "self_attention.linear_qkv.weight"), get(pre + "self_attention.linear_qkv.bias"))
                   .view({s, b, nkv, nq / nkv + 2, d});
    auto parts = qkv.split({nq / nkv, 1, 1}, 3);
    auto q = parts[0].reshape({s, b, nq, d}), k = parts[1].reshape({s, b, nkv, d});
    if (c.qk_layernorm) {
      q = rms(q, get(pre + "self_attention.q_layernorm.weight"), c.norm_epsilon);
      k = rms(k, get(pre + "self_attention.k_layernorm.weight"), c.norm_epsilon);
    }
    q = rotate(q, cos, sin).permute({1, 2, 0, 3});
    k = rotate(k, cos, sin).permute({1, 2, 0, 3});
    auto v = parts[2].reshape({s, b, nkv, d}).permute({1, 2, 0, 3});
    k = k.repeat_interleave(nq / nkv, 1);
    v = v.repeat_interleave(nq / nkv, 1);
    auto o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    o = o.permute({2, 0, 1, 3}).reshape({s, b, nq * d});
    x = x + linear(o, get(pre + "self_attention.linear_proj.weight"), get(pre + "self_attention.linear_proj.bias"));
    h = norm(c, x, get(pre + "pre_mlp_layernorm.weight"), get(pre + "pre_mlp_layernorm.bias"));
    auto fc1 = linear(h, get(pre + "mlp.linear_fc1.weight"), get(pre + "mlp.linear_fc1.bias"));
    at::Tensor act;
    if (c.swiglu) {
      auto gu = fc1.chunk(2, -1);
      act = at::silu(gu[0]) * gu[1];
    } else {
      act = fc1 * 0.5 * (1 + at::erf(fc1 * M_SQRT1_2));  // erf GELU
    }
    x = x + linear(act, get(pre + "mlp.linear_fc2.weight"), get(pre + "mlp.linear_fc2.bias"));
  }
  x = norm(c, x, get("decoder.final_layernorm.weight"), get("decoder.final_layernorm.bias"));
  auto out = get("output_layer.weight");
  // Padding rows of the table are not part of the vocabulary: the logits stop at vocab_size.
  return at::matmul(x, (out.defined() ? out : emb).t()).narrow(-1, 0, c.vocab_size);
}

// The family's variants, on the tiny shape.
struct Variant {
  const char* name;
  void (*apply)(DecoderConfig&);
};
const Variant kVariants[] = {
    {"llama", [](DecoderConfig&) {}},
    {"qwen2_qkv_bias", [](DecoderConfig& c) { c.add_qkv_bias = true; }},
    {"qwen3_qk_norm_head_dim", [](DecoderConfig& c) {
       c.qk_layernorm = true;
       c.kv_channels = 16;  // head dim independent of hidden / heads (32 / 4 = 8)
       c.untie_embeddings_and_output_weights = true;
     }},
    {"layernorm_gelu_biases", [](DecoderConfig& c) {
       c.normalization = "LayerNorm";
       c.swiglu = false;
       c.add_bias_linear = true;
     }},
    {"llama3_rope_scaling", [](DecoderConfig& c) {
       c.rope_scaling = true;
       c.rope_scaling_factor = 8;
       c.rope_scaling_original_max_position_embeddings = 8;  // scale inside the tiny context
       c.rotary_base = 500000;
     }},
};

// Parameters moved off their initial values (ones, zeros) so that norms and biases matter.
void perturb(lf::models::CausalLm& m, uint64_t seed) {
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& p : m.parameters())
    p.tensor.add_(at::randn(p.tensor.sizes(), gen, at::TensorOptions().dtype(at::kFloat)) * 0.05);
}

// The fused output layer + cross entropy runs only the tokens whose loss counts (nonzero loss
// mask, a label): its loss and every gradient equal the unfused head's, which forms the logits of
// every token and weights the masked ones by 0 (1e-5 relative, fp32 sums in other orders).
TEST(Decoder, FusedLossOverTheCountedTokensEqualsTheUnfusedHead) {
  auto run = [](bool fused) {
    auto c = tiny();
    c.cross_entropy_loss_fusion = fused;
    lf::models::CausalLm m(c, lf::backend::cpu_backend(), 11, at::kFloat);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
    auto tokens = at::randint(0, c.vocab_size, {3, 16}, gen);
    auto labels = at::roll(tokens, -1, 1);
    labels.narrow(1, 12, 4).fill_(-100);                          // ignored labels
    auto mask = at::ones({3, 16}, at::kFloat);
    mask.narrow(1, 0, 5).fill_(0);                                // a prompt
    lf::data::Batch batch;
    batch.set("tokens", tokens, 1);
    batch.set("labels", labels, 1);
    batch.set("loss_mask", mask, 1);
    auto out = m.forward_step(batch, lf::models::Pass::train);
    out.losses.at(0).sum.backward();
    std::vector<at::Tensor> r{out.losses.at(0).sum.detach()};
    for (const auto& p : m.parameters()) r.push_back(p.tensor.grad());
    return r;
  };
  const auto fused = run(true), plain = run(false);
  ASSERT_EQ(fused.size(), plain.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    const double scale = std::max(1e-12, plain[i].abs().max().item<double>());
    EXPECT_LE((fused[i] - plain[i]).abs().max().item<double>(), 1e-5 * scale) << "tensor " << i;
  }
}

// Gradient-accumulation fusion's wiring (the trainer's gradient sink, here a recording one): in a
// training step the token embedding and every dense layer's linear_qkv, linear_proj, linear_fc1
// and linear_fc2 weight ask the sink for their slot and write their gradient there (autograd gets
// none); norms and the output layer (whose take() gives no slot here) keep autograd's path. What
// ends up in the slots plus .grad equals the step without a sink (1e-5 relative), tied and untied.
TEST(Decoder, GradientSinkTakesTheLinearAndEmbeddingWeightGradients) {
  for (const bool untie : {false, true}) {
    auto c = tiny();
    c.untie_embeddings_and_output_weights = untie;
    auto step = [&](lf::models::CausalLm& m) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
      auto tokens = at::randint(0, c.vocab_size, {2, 16}, gen);
      lf::data::Batch batch;
      batch.set("tokens", tokens, 1);
      batch.set("labels", at::roll(tokens, -1, 1), 1);
      batch.set("loss_mask", at::ones({2, 16}, at::kFloat), 1);
      m.forward_step(batch, lf::models::Pass::train).losses.at(0).sum.backward();
    };
    lf::models::CausalLm ref(c, lf::backend::cpu_backend(), 5, at::kFloat);
    step(ref);
    lf::models::CausalLm m(c, lf::backend::cpu_backend(), 5, at::kFloat);
    lf::testing::RecordingSink sink;
    std::set<std::string> fused;
    for (const auto& p : m.parameters()) {
      const bool linear = p.name.find(".linear_") != std::string::npos && p.name.size() > 7 &&
                          p.name.compare(p.name.size() - 7, 7, ".weight") == 0;
      if (linear || p.name == "embedding.word_embeddings.weight") {
        sink.slots[p.tensor.unsafeGetTensorImpl()] = at::zeros_like(p.tensor);
        fused.insert(p.name);
      }
    }
    ASSERT_EQ(fused.size(), 1 + 4 * static_cast<size_t>(c.num_layers));
    sink.run(m, [&] { step(m); });
    for (size_t i = 0; i < m.parameters().size(); ++i) {
      const auto& p = m.parameters()[i];
      const auto* key = p.tensor.unsafeGetTensorImpl();
      if (fused.count(p.name) > 0) {
        EXPECT_GE(sink.asked[key], 1) << p.name << " never asked for its slot";
        EXPECT_EQ(p.tensor.grad().defined(), untie ? false : p.name == "embedding.word_embeddings.weight")
            << p.name << ": only a tied embedding also gets the output layer's gradient through autograd";
      } else {
        EXPECT_EQ(sink.asked.count(key), 0u) << p.name;
      }
      EXPECT_LE(lf::testing::relative_max_difference(sink.total_grad(p.tensor), ref.parameters()[i].tensor.grad()),
                1e-5)
          << p.name << " untie " << untie;
    }
  }
}

// How many autograd nodes reachable from t's grad_fn have `part` in their name.
int count_nodes(const at::Tensor& t, const std::string& part) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo{t.grad_fn().get()};
  int n = 0;
  while (!todo.empty()) {
    auto* f = todo.back();
    todo.pop_back();
    if (f == nullptr || !seen.insert(f).second) continue;
    if (f->name().find(part) != std::string::npos) ++n;
    for (const auto& e : f->next_edges()) todo.push_back(e.function.get());
  }
  return n;
}

// The dense layers hold neither their norms' outputs nor the MLP's activation for backward: the
// input and pre-MLP RMSNorms are fused into linear_qkv and linear_fc1 (lf::ops::rms_norm_linear),
// the activation into linear_fc2 (lf::ops::activated_linear). A LayerNorm stays a node of its own,
// and so does a norm or activation that LoRA adapters read as well (q/k/v, gate/up, down_proj).
TEST(Decoder, DenseLayersFuseTheirNormsAndActivationIntoTheLinears) {
  auto loss_of = [](lf::models::CausalLm& m) {
    auto tokens = at::randint(0, 50, {2, 16}, at::make_generator<at::CPUGeneratorImpl>(3));
    lf::data::Batch batch;
    batch.set("tokens", tokens, 1);
    batch.set("labels", at::roll(tokens, -1, 1), 1);
    batch.set("loss_mask", at::ones({2, 16}, at::kFloat), 1);
    return m.forward_step(batch, lf::models::Pass::train).losses.at(0).sum;
  };
  auto c = tiny();
  const int layers = static_cast<int>(c.num_layers);
  lf::models::CausalLm m(c, lf::backend::cpu_backend(), 5, at::kFloat);
  const auto loss = loss_of(m);
  EXPECT_EQ(count_nodes(loss, "RmsNormLinearFn"), 2 * layers);
  EXPECT_EQ(count_nodes(loss, "ActivatedLinearFn"), layers);
  EXPECT_EQ(count_nodes(loss, "SwigluFn"), 0);
  EXPECT_EQ(count_nodes(loss, "RmsNormFn"), 1) << "the final norm, before the output layer";
  c.normalization = "LayerNorm";
  lf::models::CausalLm ln(c, lf::backend::cpu_backend(), 5, at::kFloat);
  const auto ln_loss = loss_of(ln);
  EXPECT_EQ(count_nodes(ln_loss, "RmsNormLinearFn"), 0);
  EXPECT_EQ(count_nodes(ln_loss, "LayerNormFn"), 2 * layers + 1);
  EXPECT_EQ(count_nodes(ln_loss, "ActivatedLinearFn"), layers);
  // With LoRA the base is frozen: what comes before layer 0's first adapter needs no gradient and
  // leaves no node, so layer 0 counts only from its adapters on.
  c.normalization = "RMSNorm";
  lf::models::CausalLm qv(c, lf::backend::cpu_backend(), 5, at::kFloat);
  qv.add_lora(lf::models::LoraSpec::from(2, 4, 0, false, {"q_proj", "v_proj"}), 5);
  const auto qv_loss = loss_of(qv);
  EXPECT_EQ(count_nodes(qv_loss, "RmsNormLinearFn"), layers) << "every pre-MLP norm, fused";
  EXPECT_EQ(count_nodes(qv_loss, "RmsNormFn"), (layers - 1) + 1) << "the input norms the adapters read, the final";
  EXPECT_EQ(count_nodes(qv_loss, "ActivatedLinearFn"), layers);
  lf::models::CausalLm down(c, lf::backend::cpu_backend(), 5, at::kFloat);
  down.add_lora(lf::models::LoraSpec::from(2, 4, 0, false, {"down_proj"}), 5);
  const auto down_loss = loss_of(down);
  EXPECT_EQ(count_nodes(down_loss, "RmsNormLinearFn"), 2 * (layers - 1));
  EXPECT_EQ(count_nodes(down_loss, "ActivatedLinearFn"), 0);
  EXPECT_EQ(count_nodes(down_loss, "SwigluFn"), layers - 1) << "down_proj's adapter reads the activation";
}

TEST(Decoder, ParameterCountMatchesFormula) {
  const auto& be = lf::backend::cpu_backend();
  for (bool untie : {false, true}) {
    auto c = tiny();
    c.untie_embeddings_and_output_weights = untie;
    lf::models::CausalLm m(c, be, 7, at::kFloat);
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
  lf::models::CausalLm a(tiny(), be, 3, at::kFloat), b(tiny(), be, 3, at::kFloat),
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
  lf::models::CausalLm a(c, be, 5, at::kFloat), b(wide, be, 5, at::kFloat);
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

TEST(Decoder, AttentionDropoutIsRefusedNamingTheValue) {
  auto c = tiny();
  c.attention_dropout = 0.1;
  try {
    lf::models::CausalLm(c, lf::backend::cpu_backend(), 1, at::kFloat);
    FAIL();
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention_dropout 0.1"), std::string::npos) << e.what();
  }
}

// Every variant through the backend's fused ops equals the plain-ATen composition, in logits,
// loss and every parameter gradient.
class DecoderVariant : public ::testing::TestWithParam<Variant> {};

TEST_P(DecoderVariant, BackendOpsEqualPlainAtenReference) {
  const auto& be = lf::backend::cpu_backend();
  auto c = tiny();
  GetParam().apply(c);
  lf::models::CausalLm m(c, be, 11, at::kFloat);
  perturb(m, 12);
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.tensor.numel();
  EXPECT_EQ(n, c.num_parameters());
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

// Incremental decoding with the KV cache (prefill, single tokens, a multi-token chunk) gives the
// logits of the full forward at every position.
TEST_P(DecoderVariant, KvCacheDecodingEqualsFullForward) {
  const auto& be = lf::backend::cpu_backend();
  auto c = tiny();
  GetParam().apply(c);
  lf::models::CausalLm m(c, be, 21, at::kFloat);
  perturb(m, 22);
  auto tokens = at::randint(0, 50, {2, 10}, at::TensorOptions().dtype(at::kLong));
  at::Tensor full;
  {
    at::NoGradGuard no_grad;
    full = m.forward(tokens);  // [10, 2, 50]
  }
  lf::models::KvCache cache;
  std::vector<at::Tensor> parts;
  int64_t pos = 0;
  for (int64_t n : {5, 1, 1, 3}) {
    parts.push_back(m.forward(tokens.narrow(1, pos, n), cache));
    pos += n;
    EXPECT_EQ(cache.length, pos);
  }
  auto inc = at::cat(parts, 0);
  // Same math, attention over different key counts per call: fp32 rounding only.
  EXPECT_TRUE(at::allclose(inc, full, 1e-5, 1e-5)) << (inc - full).abs().max();
}

INSTANTIATE_TEST_SUITE_P(Family, DecoderVariant, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Decoder, Llama3RopeScalingMatchesTheHfFormula) {
  // HF _compute_llama3_parameters on 8 frequencies: base 500000, factor 8, low 1, high 4, old 8192.
  lf::models::RopeSpec spec{16, 500000, true, 8, 1, 4, 8192};
  auto [cos, sin] = lf::models::rope_tables(spec, 1, 1, at::kDouble);  // angle = inv_freq at p = 1
  auto inv = at::atan2(sin[0], cos[0]).narrow(0, 0, 8);
  const double pi = 3.141592653589793;
  for (int i = 0; i < 8; ++i) {
    double f = std::pow(500000.0, -2.0 * i / 16), wl = 2 * pi / f, want;
    if (wl < 8192.0 / 4) want = f;
    else if (wl > 8192.0 / 1) want = f / 8;
    else {
      double sm = (8192.0 / wl - 1) / (4 - 1);
      want = (1 - sm) * f / 8 + sm * f;
    }
    EXPECT_NEAR(inv[i].item<double>(), want, 1e-12 * std::max(1.0, want)) << i;
  }
}

TEST(Decoder, HiddenDropoutInTrainingModeOnlyAndReproducible) {
  const auto& be = lf::backend::cpu_backend();
  auto c = tiny();
  auto tokens = at::randint(0, 50, {2, 8}, at::TensorOptions().dtype(at::kLong));
  lf::models::CausalLm plain(c, be, 3, at::kFloat);
  c.hidden_dropout = 0.3;
  lf::models::CausalLm a(c, be, 3, at::kFloat), b(c, be, 3, at::kFloat);
  at::NoGradGuard no_grad;
  auto want = plain.loss(tokens, tokens);
  auto la = a.loss(tokens, tokens), lb = b.loss(tokens, tokens);
  EXPECT_TRUE(at::equal(la, lb));      // same seed, same masks
  EXPECT_FALSE(at::allclose(la, want));  // dropout changes the loss in training mode
  EXPECT_FALSE(at::equal(a.loss(tokens, tokens), la));  // the stream advances
  a.set_training(false);
  EXPECT_TRUE(at::equal(a.loss(tokens, tokens), want));  // eval mode: no dropout
}

// Recomputation changes memory, not math: loss and every gradient are bit-identical to the run
// that keeps activations (the recomputed forward repeats the same ops, and dropout replays the
// same masks from the saved RNG state).
TEST(Decoder, RecomputeGivesIdenticalLossAndGradients) {
  using R = lf::models::RecomputeOptions;
  const auto& be = lf::backend::cpu_backend();
  auto c = tiny();
  c.num_layers = 3;
  c.hidden_dropout = 0.2;
  c.qk_layernorm = true;
  auto tokens = at::randint(0, 50, {2, 12}, at::TensorOptions().dtype(at::kLong));
  auto run = [&](R r) {
    lf::models::CausalLm m(c, be, 9, at::kFloat);
    m.set_recompute(r);
    auto loss = m.loss(tokens, tokens).sum();
    loss.backward();
    std::vector<at::Tensor> out{loss.detach()};
    for (const auto& p : m.parameters()) out.push_back(p.tensor.grad());
    return out;
  };
  const auto want = run(R{});
  const std::vector<std::pair<const char*, R>> modes = {
      {"full uniform 1", {R::Granularity::full, R::Method::uniform, 1}},
      {"full uniform 2", {R::Granularity::full, R::Method::uniform, 2}},
      {"full block 2", {R::Granularity::full, R::Method::block, 2}},
      {"selective", {R::Granularity::selective, R::Method::uniform, 1}},
  };
  for (const auto& [name, r] : modes) {
    const auto got = run(r);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].defined()) << name << " tensor " << i;
      EXPECT_TRUE(at::equal(got[i], want[i])) << name << " tensor " << i << " max diff "
                                               << (got[i] - want[i]).abs().max();
    }
  }
}

TEST(Decoder, LoadFullParametersRoundTripsAndNamesMismatches) {
  const auto& be = lf::backend::cpu_backend();
  auto c = tiny();
  c.add_qkv_bias = true;
  lf::models::CausalLm a(c, be, 1, at::kFloat), b(c, be, 2, at::kFloat);
  std::map<std::string, at::Tensor> full;
  for (const auto& p : a.parameters()) full[p.name] = p.tensor.detach().clone();
  // HF tables carry only the real vocabulary rows.
  full["embedding.word_embeddings.weight"] = full["embedding.word_embeddings.weight"].narrow(0, 0, 50);
  b.load_full_parameters(full);
  for (size_t i = 0; i < a.parameters().size(); ++i)
    EXPECT_TRUE(at::equal(a.parameters()[i].tensor, b.parameters()[i].tensor)) << a.parameters()[i].name;
  auto expect_error = [&](std::map<std::string, at::Tensor> m, const std::string& text) {
    try {
      b.load_full_parameters(m);
      ADD_FAILURE() << "no error for " << text;
    } catch (const lf::Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  auto missing = full;
  missing.erase("decoder.layers.1.mlp.linear_fc2.weight");
  expect_error(missing, "decoder.layers.1.mlp.linear_fc2.weight");
  auto extra = full;
  extra["decoder.layers.0.self_attention.q_layernorm.weight"] = at::ones({8});
  expect_error(extra, "q_layernorm.weight is not a parameter of this model");
  auto wrong = full;
  wrong["decoder.layers.0.mlp.linear_fc1.weight"] = at::zeros({48, 32});
  expect_error(wrong, "the model needs [96, 32]");
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
// --first-last-layers-bf16: the layers FP8 skips, by index in the model; with every layer skipped
// the model reports no FP8 GEMM (the trainer then refuses the run), and counts beyond the model's
// layers are refused. The forward of the skipped layers is the plain one: with every layer but
// the last skipped, the logits differ from the plain model's (the last layer in FP8), and skipping
// that one too gives them back bit for bit.
TEST(Decoder, Fp8LeavesTheFirstAndLastLayersInTheTrainingDtype) {
  auto c = lf::testing::tiny_decoder_config();
  c.num_layers = 4;
  lf::models::CausalLm m(c, lf::backend::cpu_backend(), 3, at::kFloat);
  m.set_training(false);
  const auto tokens = at::randint(0, 50, {2, 16});
  const auto plain = m.forward(tokens);
  lf::ops::Fp8Policy p(lf::ops::Fp8Recipe{});
  p.set_layers_in_training_dtype(1, 2);
  ASSERT_TRUE(m.set_fp8(&p));
  std::vector<bool> on;
  for (size_t i = 0; i < 4; ++i) on.push_back(m.foundation().layer(i).fp8());
  EXPECT_EQ(on, (std::vector<bool>{false, true, false, false}));
  p.set_layers_in_training_dtype(3, 0);
  ASSERT_TRUE(m.set_fp8(&p));
  EXPECT_FALSE(at::equal(m.forward(tokens), plain));
  p.set_layers_in_training_dtype(3, 1);
  EXPECT_FALSE(m.set_fp8(&p));
  EXPECT_TRUE(at::equal(m.forward(tokens), plain));
  p.set_layers_in_training_dtype(3, 2);
  try {
    m.set_fp8(&p);
    ADD_FAILURE() << "5 of 4 layers kept out of FP8 was accepted";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceed the model's 4 layers"), std::string::npos) << e.what();
  }
  m.set_fp8(nullptr);
}

}  // namespace


// The decoder under tensor parallelism (TP) and TP + sequence parallelism (SP) equals the
// single-process decoder built from the same seed: the gathered parameter shards equal its
// parameters (initialisation does not depend on the layout), and logits, per-token loss and
// every gathered gradient match, in fp32 and bf16. Worlds: 2 ranks (TP 2, GQA 4 heads / 2
// groups) and 4 ranks (TP 4, 8 heads / 4 groups). The vocabulary (50) is padded differently at
// each TP size (56 / 64), so padding independence is exercised too.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/models/composites/causal_lm.h"
#include "multiprocess.h"
#include "../models/tiny_decoder.h"
#include "tp_testing.h"

namespace {
using Decoder = lf::models::CausalLm;
using lf::models::DecoderConfig;
using lf::testing::gather_shards;
using lf::testing::max_abs_diff;

DecoderConfig tiny(int tp) {
  DecoderConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.ffn_hidden_size = 48;
  c.num_attention_heads = 4 * tp / 2;
  c.num_query_groups = 2 * tp / 2;
  c.kv_channels = 8;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 8;
  c.max_position_embeddings = 16;
  return c;
}

// Tolerances, relative to the largest magnitude of the reference tensor.
// fp32: TP splits each matmul's reduction (row-parallel) and sums partials in another order, a
//   few ulps (1e-7) per op through 2 layers: 1e-5 is ~100x that and far below any real bug (a
//   missing all-reduce or a wrong shard is O(1)).
//   (Measured: <= 4e-7.)
// bf16: every op rounds to 8 mantissa bits (eps 2^-8 = 3.9e-3); the TP partial sums are rounded
//   before they are added, so single and TP runs differ by a few eps after 2 layers: 3e-2
//   (measured: <= 1.1e-2, on the small norm-weight gradients).
struct Tolerance {
  double values, grads;
};

void compare(const char* what, const std::string& name, const at::Tensor& got,
             const at::Tensor& want, double rel) {
  const double scale = std::max(1e-3, want.abs().max().to(at::kDouble).item<double>());
  EXPECT_LE(max_abs_diff(got, want), rel * scale) << what << " " << name << " (scale " << scale << ")";
}

// Variants with parameters of every TP kind: QKV bias (split with the rows), per-head QK norms
// (replicated, gradient summed over TP), row-parallel biases (replicated), LayerNorm biases,
// GELU's unstacked fc1, multi-latent attention.
DecoderConfig variant(int tp, int which) {
  auto c = tiny(tp);
  if (which == 1) {
    c.add_qkv_bias = true;
    c.qk_layernorm = true;
    c.untie_embeddings_and_output_weights = true;
  } else if (which == 2) {
    c.normalization = "LayerNorm";
    c.swiglu = false;
    c.add_bias_linear = true;
  } else if (which == 4) {
    // MoE (expert TP = TP): the router replicated with its gradient summed over TP, each expert's
    // fc1/fc2 split as the dense MLP; shared experts with their gate; both auxiliary losses, whose
    // gradient each rank takes 1/tp of; DeepSeek-style sigmoid routing in groups with the bias.
    c.num_layers = 3;
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 8;
    c.moe_layer_freq = "[0,1,1]";
    c.moe_router_score_function = "sigmoid";
    c.moe_router_num_groups = 2;
    c.moe_router_group_topk = 1;
    c.moe_router_enable_expert_bias = true;
    c.moe_shared_expert_intermediate_size = 8;
    c.moe_shared_expert_gate = true;
    c.moe_router_load_balancing_type = "seq_aux_loss";
    c.moe_aux_loss_coeff = 0.1;
    c.moe_z_loss_coeff = 0.01;
  } else if (which == 3 || which == 5) {
    // Multi-latent attention (heads split; the down projections and latent norms replicated, their
    // output gradients summed over TP in the forward so that their own gradients are whole on every
    // rank), YaRN RoPE on interleaved pairs; 5: without a query latent (linear_q_proj split, its
    // partial input gradient summed at the region's entry with the kv latent's counted once).
    lf::testing::make_tiny_mla(c, which == 3);
  }
  return c;
}

void check_decoder(lf::dist::ParallelContext& ctx, at::ScalarType dtype, bool sp, Tolerance tol,
                   int which = 0) {
  SCOPED_TRACE(std::string(c10::toString(dtype)) + (sp ? " TP+SP" : " TP") + " variant " +
               std::to_string(which));
  const auto& be = lf::backend::cpu_backend();
  auto& tp = ctx.tp();
  const auto c = variant(tp.size(), which);
  Decoder single(c, be, 11, dtype);
  Decoder par(c, be, 11, dtype, &ctx, sp);
  ASSERT_EQ(par.parameters().size(), single.parameters().size());
  if (which != 0) {  // biases start at zero and norms at one: move them so that they matter
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < par.parameters().size(); ++i) {
      auto& q = single.parameters()[i];
      auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + i);
      q.tensor.add_(at::randn(q.tensor.sizes(), gen, at::TensorOptions().dtype(at::kFloat)).to(dtype) * 0.05);
    }
    std::map<std::string, at::Tensor> full;
    for (const auto& q : single.parameters()) full[q.name] = q.tensor.detach();
    par.load_full_parameters(full);
  }

  // Initialisation: the TP model from seed 11 is the single model from seed 11, sharded.
  for (size_t i = 0; i < par.parameters().size(); ++i) {
    const auto& p = par.parameters()[i];
    const auto& q = single.parameters()[i];
    ASSERT_EQ(p.name, q.name);
    // Replicated with a gradient partial per TP rank: the MoE router, per-head QK norms. MLA's
    // latents (down projections and their norms) are replicated with a whole gradient, never summed.
    const bool mla = which == 3 || which == 5;
    const bool latent = mla && (p.name.find("down_proj") != std::string::npos ||
                                p.name.find("q_layernorm") != std::string::npos ||
                                p.name.find("kv_layernorm") != std::string::npos);
    const bool replicated = p.name.find("norm") != std::string::npos ||
                            p.name.find("linear_proj.bias") != std::string::npos ||
                            p.name.find("linear_fc2.bias") != std::string::npos ||
                            p.name.find("gate_weight") != std::string::npos || p.state || latent ||
                            p.name.find("router.weight") != std::string::npos;
    EXPECT_EQ(p.sharding.is_replicated(), replicated) << p.name;
    EXPECT_EQ(p.is_split(), !replicated) << p.name;
    const bool partial = p.name.find("router.weight") != std::string::npos ||
                         (!mla && (p.name.find("q_layernorm") != std::string::npos ||
                                   p.name.find("k_layernorm") != std::string::npos));
    EXPECT_EQ(p.sequence_parallel, !p.state && !latent && ((sp && replicated) || partial)) << p.name;
    auto full = gather_shards(p.tensor, p.sharding.dim, p.sharding.blocks, tp);
    auto want = q.tensor.detach();
    if (full.size(0) != want.size(0)) {  // vocabulary tables: compare the real rows
      EXPECT_TRUE(full.narrow(0, c.vocab_size, full.size(0) - c.vocab_size).eq(0).all().item<bool>());
      full = full.narrow(0, 0, c.vocab_size);
      want = want.narrow(0, 0, c.vocab_size);
    }
    EXPECT_TRUE(at::equal(full, want)) << p.name;
  }

  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto tokens = at::randint(0, c.vocab_size, {2, 8}, gen, at::TensorOptions().dtype(at::kLong));
  auto labels = at::randint(0, c.vocab_size, {2, 8}, gen, at::TensorOptions().dtype(at::kLong));
  labels.index_put_({0, 3}, -100);
  labels.index_put_({1, 0}, c.vocab_size - 1);

  {
    at::NoGradGuard no_grad;
    auto want = single.forward(tokens);
    auto got = par.forward(tokens);
    ASSERT_EQ(got.sizes(), want.sizes());
    ASSERT_EQ(got.size(-1), c.vocab_size);
    compare("logits", "", got, want, tol.values);
  }

  auto want_loss = single.loss(tokens, labels);
  auto got_loss = par.loss(tokens, labels);
  ASSERT_EQ(got_loss.sizes(), want_loss.sizes());  // the whole sequence, also under SP
  compare("loss", "", got_loss, want_loss, tol.values);
  want_loss.sum().backward();
  got_loss.sum().backward();
  for (size_t i = 0; i < par.parameters().size(); ++i) {
    const auto& p = par.parameters()[i];
    if (p.state) continue;  // the expert bias: model state, no gradient
    at::Tensor g = p.tensor.grad();
    ASSERT_TRUE(g.defined()) << p.name;
    // What the optimizer does for `sequence_parallel` parameters: sum over TP.
    if (p.sequence_parallel) g = lf::parallel::comm::all_reduce(g, tp);
    auto full = gather_shards(g, p.sharding.dim, p.sharding.blocks, tp);
    auto want = single.parameters()[i].tensor.grad();
    if (full.size(0) != want.size(0)) {
      EXPECT_EQ(full.narrow(0, c.vocab_size, full.size(0) - c.vocab_size).abs().max().item<double>(), 0);
      full = full.narrow(0, 0, c.vocab_size);
      want = want.narrow(0, 0, c.vocab_size);
    }
    compare("gradient", p.name, full, want, tol.grads);
  }
}

LF_WORKER_CASE(tp_decoder) {
  auto ctx = lf::testing::make_context(lf::testing::worker_world_size());
  for (bool sp : {false, true}) {
    check_decoder(*ctx, at::kFloat, sp, {1e-5, 1e-5});
    check_decoder(*ctx, at::kBFloat16, sp, {3e-2, 3e-2});
    for (int which : {1, 2, 3, 4, 5}) check_decoder(*ctx, at::kFloat, sp, {1e-5, 1e-5}, which);
  }
}

TEST(TpDecoder, Tp2AndSpEqualSingleProcess) {
  lf::testing::expect_all_ok(lf::testing::run_workers("tp_decoder", {.world_size = 2}));
}
TEST(TpDecoder, Tp4AndSpEqualSingleProcess) {
  lf::testing::expect_all_ok(lf::testing::run_workers("tp_decoder", {.world_size = 4}));
}

// Invalid layouts are errors naming the values.
LF_WORKER_CASE(tp_decoder_errors) {
  auto ctx = lf::testing::make_context(2);
  const auto& be = lf::backend::cpu_backend();
  auto c = tiny(2);
  c.num_query_groups = 1;
  try {
    Decoder d(c, be, 1, at::kFloat, ctx.get());
    ADD_FAILURE() << "no error for 1 query group over TP 2";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_query_groups 1"), std::string::npos) << e.what();
  }
  Decoder d(tiny(2), be, 1, at::kFloat, ctx.get(), /*sequence_parallel=*/true);
  auto tokens = at::zeros({1, 7}, at::TensorOptions().dtype(at::kLong));
  try {
    d.forward(tokens);
    ADD_FAILURE() << "no error for sequence 7 over TP 2 with SP";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence length 7"), std::string::npos) << e.what();
  }
}

TEST(TpDecoder, IndivisibleGroupsOrSequenceNameTheValues) {
  lf::testing::expect_all_ok(lf::testing::run_workers("tp_decoder_errors", {.world_size = 2}));
}

}  // namespace

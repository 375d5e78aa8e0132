// ChunkPipe in-process: a sequence cut into chunks that run through the stages one after another,
// each attending to the keys/values of the chunks before it, gives the loss and every gradient of
// the unchunked decoder: 8 chunks of a 4096-token sequence in one process (plain and Qwen-style
// variants), under PP = 2 (tied and untied embeddings) and under TP = 2 with sequence
// parallelism. With hidden dropout the recomputation replays the first pass's masks: the
// gradients equal those of one autograd graph over all chunks drawn in the same order.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "error_message.h"
#include "loongforge/dist/launch_env.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/dist/rendezvous.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/parallel/pipeline/chunkpipe.h"
#include "multiprocess.h"
#include "tp_testing.h"
#include "../models/tiny_decoder.h"

namespace {
using Decoder = lf::models::CausalLm;
using lf::models::DecoderConfig;
namespace pl = lf::parallel::pipeline;
using RngStates = std::vector<std::map<std::string, at::Tensor>>;

DecoderConfig model(int64_t max_positions, bool variant) {
  DecoderConfig c = lf::testing::tiny_decoder_config();
  c.max_position_embeddings = max_positions;
  if (variant) {  // Qwen-style: untied head, QK norm, QKV bias
    c.untie_embeddings_and_output_weights = true;
    c.qk_layernorm = true;
    c.add_qkv_bias = true;
  }
  return c;
}

// tokens and labels [b, s] (labels[i]: the target of tokens[i]; some ignored).
std::pair<at::Tensor, at::Tensor> sequence(int64_t b, int64_t s, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77);
  auto tokens = at::randint(0, vocab, {b, s}, gen, at::TensorOptions().dtype(at::kLong));
  auto labels = at::randint(0, vocab, {b, s}, gen, at::TensorOptions().dtype(at::kLong));
  labels.index_put_({0, 3}, -100);
  return {tokens, labels};
}

// Biases start at zero and norms at one: move every parameter a little so that all of them matter.
void perturb(Decoder& d) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < d.parameters().size(); ++i) {
    auto& p = d.parameters()[i];
    auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + i);
    p.tensor.add_(at::randn(p.tensor.sizes(), gen, at::TensorOptions().dtype(at::kFloat)) * 0.05);
  }
}

std::map<std::string, at::Tensor> full_parameters(const Decoder& d) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : d.parameters()) out[p.name] = p.tensor.detach();
  return out;
}

// The trainer's ChunkPipe step for `d` (a stage or the whole model) over chunks of c tokens; the
// loss of every chunk divided by the sequence's token count, so the chunks sum to the mean. The
// first pass saves the dropout RNG state of each chunk, the recomputation restores it.
pl::ChunkPipeStep chunk_step(const Decoder& d, const at::Tensor& tokens, const at::Tensor& labels, int64_t c,
                             RngStates& rng) {
  const double denom = static_cast<double>(tokens.numel());
  pl::ChunkPipeStep step;
  step.forward = [&d, tokens, labels, c, denom, &rng](int64_t k, const pl::TensorMap& input, pl::ChunkAttention& kv,
                                                       bool with_grad) {
    if (static_cast<int64_t>(rng.size()) <= k) rng.resize(static_cast<size_t>(k + 1));
    if (with_grad)
      d.rng().set_state(rng[static_cast<size_t>(k)]);
    else
      rng[static_cast<size_t>(k)] = d.rng().state();
    const auto& stage = d.stage();
    at::Tensor in = stage.first ? tokens.narrow(1, k * c, c) : input.at("hidden_states");
    pl::StageResult r;
    if (!stage.last || !with_grad)
      r.activations.set("hidden_states", d.stage_forward_chunk(in, {}, k * c, kv, /*with_head=*/false));
    else
      r.loss = d.stage_forward_chunk(in, labels.narrow(1, k * c, c), k * c, kv).sum() / denom;
    return r;
  };
  return step;
}

// fp32 tolerance, relative to the largest magnitude of the reference: the chunked attention
// splits each softmax into the prefix part and the chunk's own part merged by log-sum-exp, and
// the parameter gradients are summed chunk by chunk, so sums run in another order (~1e-7
// relative per op). A lost chunk, a missing key/value gradient or a wrong position is >1e-2.
constexpr double kRel = 1e-5;

void expect_grads_equal(const Decoder& got, const Decoder& want, lf::backend::Communicator* tied_group = nullptr,
                        lf::backend::Communicator* tp = nullptr) {
  std::map<std::string, const lf::parallel::Parameter*> by_name;
  for (const auto& q : want.parameters()) by_name[q.name] = &q;
  for (const auto& p : got.parameters()) {
    at::Tensor g = p.tensor.grad();
    ASSERT_TRUE(g.defined()) << p.name;
    g = g.clone();
    if (tied_group && p.name.starts_with("embedding")) tied_group->all_reduce(g, lf::backend::ReduceOp::sum);
    if (tp && p.sequence_parallel) tp->all_reduce(g, lf::backend::ReduceOp::sum);
    if (tp) g = lf::testing::gather_shards(g, p.sharding.dim, p.sharding.blocks, *tp);
    ASSERT_TRUE(by_name.count(p.name)) << p.name;
    auto w = by_name[p.name]->tensor.grad();
    if (g.size(0) != w.size(0) && g.dim() == 2) {  // vocabulary padding differs with TP: real rows
      const int64_t rows = want.config().vocab_size;
      g = g.narrow(0, 0, rows);
      w = w.narrow(0, 0, rows);
    }
    ASSERT_EQ(g.sizes(), w.sizes()) << p.name;
    const double scale = std::max(1e-3, w.abs().max().item<double>());
    EXPECT_LE((g - w).abs().max().item<double>(), kRel * scale) << p.name;
  }
}

// The reference: the unchunked model's mean loss, gradients left on its parameters.
double unchunked(const Decoder& d, const at::Tensor& tokens, const at::Tensor& labels) {
  auto loss = d.loss(tokens, labels).sum() / static_cast<double>(tokens.numel());
  loss.backward();
  return loss.item<double>();
}

TEST(ChunkPipe, EightChunksOf4096TokensEqualUnchunked) {
  const auto& be = lf::backend::cpu_backend();
  for (bool variant : {false, true}) {
    SCOPED_TRACE(variant ? "untied, QK norm, QKV bias" : "llama");
    const auto c = model(4096, variant);
    Decoder whole(c, be, 5, at::kFloat), chunked(c, be, 5, at::kFloat);
    if (variant) {
      perturb(whole);
      chunked.load_full_parameters(full_parameters(whole));
    }
    auto [tokens, labels] = sequence(1, 4096, c.vocab_size);
    const double want = unchunked(whole, tokens, labels);
    RngStates rng;
    const double got = pl::run_chunkpipe(nullptr, 8, chunk_step(chunked, tokens, labels, 512, rng));
    EXPECT_NEAR(got, want, kRel * std::abs(want));
    expect_grads_equal(chunked, whole);
  }
}

// Multi-latent attention (DeepSeek): each chunk keeps its expanded keys/values for the later
// chunks, the softmax scale (YaRN mscale) carried into the prefix attention too.
TEST(ChunkPipe, MultiLatentAttentionChunkedEqualsUnchunked) {
  const auto& be = lf::backend::cpu_backend();
  auto c = model(256, false);
  lf::testing::make_tiny_mla(c, true, 64);
  Decoder whole(c, be, 5, at::kFloat), chunked(c, be, 5, at::kFloat);
  perturb(whole);
  chunked.load_full_parameters(full_parameters(whole));
  auto [tokens, labels] = sequence(2, 256, c.vocab_size);
  const double want = unchunked(whole, tokens, labels);
  RngStates rng;
  const double got = pl::run_chunkpipe(nullptr, 4, chunk_step(chunked, tokens, labels, 64, rng));
  EXPECT_NEAR(got, want, kRel * std::abs(want));
  expect_grads_equal(chunked, whole);
}

TEST(ChunkPipe, OneChunkIsTheUnchunkedStep) {
  const auto& be = lf::backend::cpu_backend();
  const auto c = model(64, false);
  Decoder whole(c, be, 6, at::kFloat), chunked(c, be, 6, at::kFloat);
  auto [tokens, labels] = sequence(2, 64, c.vocab_size);
  const double want = unchunked(whole, tokens, labels);
  RngStates rng;
  EXPECT_NEAR(pl::run_chunkpipe(nullptr, 1, chunk_step(chunked, tokens, labels, 64, rng)), want, 1e-6);
  expect_grads_equal(chunked, whole);
}

// Dropout: the unchunked run draws other masks, so the reference is one autograd graph over all
// chunks run in order with live (not recomputed) keys/values: the same draws as ChunkPipe's first
// pass. Equal gradients mean the recomputation replayed every mask and fed every key/value
// gradient back.
TEST(ChunkPipe, DropoutMasksAreReplayedInTheRecomputation) {
  const auto& be = lf::backend::cpu_backend();
  auto c = model(64, false);
  c.hidden_dropout = 0.2;
  Decoder graph(c, be, 8, at::kFloat), chunked(c, be, 8, at::kFloat);
  auto [tokens, labels] = sequence(2, 64, c.vocab_size);
  const int64_t n = 16, chunks = 4;
  const double denom = static_cast<double>(tokens.numel());
  at::Tensor total = at::zeros({}, at::kDouble);
  std::vector<std::vector<at::Tensor>> ks, vs;  // per chunk, per layer
  for (int64_t k = 0; k < chunks; ++k) {
    pl::ChunkAttention kv;
    if (k > 0) {
      for (size_t l = 0; l < 2; ++l) {
        std::vector<at::Tensor> pk, pv;
        for (int64_t j = 0; j < k; ++j) pk.push_back(ks[j][l]), pv.push_back(vs[j][l]);
        kv.prefix_k.push_back(at::cat(pk, 2));
        kv.prefix_v.push_back(at::cat(pv, 2));
      }
    }
    total = total + graph.stage_forward_chunk(tokens.narrow(1, k * n, n), labels.narrow(1, k * n, n), k * n, kv)
                            .sum()
                            .to(at::kDouble) /
                        denom;
    ks.push_back(kv.k);
    vs.push_back(kv.v);
  }
  total.backward();
  RngStates rng;
  const double got = pl::run_chunkpipe(nullptr, chunks, chunk_step(chunked, tokens, labels, n, rng));
  EXPECT_NEAR(got, total.item<double>(), kRel * std::abs(total.item<double>()));
  expect_grads_equal(chunked, graph);
  // And dropout is on: the masked loss differs from the unmasked one.
  Decoder plain(c, be, 8, at::kFloat);
  plain.set_training(false);
  EXPECT_GT(std::abs(plain.loss(tokens, labels).sum().item<double>() / denom - got), 1e-4);
}

std::unique_ptr<lf::dist::ParallelContext> make_pp_context(int pp) {
  static lf::dist::Rendezvous rendezvous(lf::dist::detect_launch_env(), std::chrono::seconds(60));
  lf::dist::ParallelSizes sizes;
  sizes.pp = pp;
  lf::dist::ParallelContextOptions options;
  options.timeout = std::chrono::seconds(60);
  options.kinds = {lf::dist::GroupKind::world, lf::dist::GroupKind::pp, lf::dist::GroupKind::dp,
                   lf::dist::GroupKind::embedding};
  return std::make_unique<lf::dist::ParallelContext>(
      rendezvous, lf::dist::ParallelLayout(rendezvous.world_size(), sizes), options);
}

// PP = 2: layer 0 + embedding on stage 0, layer 1 + head on stage 1 (or by a layout: the
// embedding alone, then both layers and the head); 8 chunks of 128 tokens.
LF_WORKER_CASE(chunkpipe_pp) {
  auto ctx = make_pp_context(2);
  const auto& be = lf::backend::cpu_backend();
  // Third case: a layout whose first stage holds the embedding alone (no layers, no keys/values).
  for (int variant : {0, 1, 2}) {
    SCOPED_TRACE(variant == 0 ? "tied" : variant == 1 ? "untied" : "layout E|ttL");
    const auto c = model(1024, variant == 1);
    Decoder whole(c, be, 9, at::kFloat);
    if (variant == 1) perturb(whole);
    const auto stage = variant == 2 ? lf::models::pipeline_stage(c, 2, ctx->pp_rank(), {}, {}, {}, std::string("E|ttL"))
                                    : lf::models::pipeline_stage(c, 2, ctx->pp_rank());
    Decoder part(c, be, 9, at::kFloat, ctx.get(), false, stage);
    if (variant == 1) part.load_full_parameters(full_parameters(whole));
    auto [tokens, labels] = sequence(2, 1024, c.vocab_size);
    const double want = unchunked(whole, tokens, labels);
    pl::StageExchange ex(ctx->pp(), be.device());
    RngStates rng;
    const double loss = pl::run_chunkpipe(&ex, 8, chunk_step(part, tokens, labels, 128, rng));
    auto t = at::full({1}, loss, at::kDouble);
    ctx->pp().broadcast(t, 1);
    EXPECT_NEAR(t.item<double>(), want, kRel * std::abs(want));
    expect_grads_equal(part, whole, variant == 1 ? nullptr : &ctx->embedding());
  }
}

TEST(ChunkPipe, Pp2EqualsUnchunkedSingleProcess) {
  lf::testing::expect_all_ok(lf::testing::run_workers("chunkpipe_pp", {.world_size = 2}));
}

// TP = 2 with sequence parallelism: each chunk's hidden states are split over the two ranks (the
// chunk size is a multiple of TP), keys/values by head. Variants: Qwen-style attention; MLA with a
// query latent; MLA without one (column-parallel linear_q_proj). MLA's latents are whole on every
// rank (their output gradients summed over TP where they enter the heads), and each chunk keeps
// its expanded keys/values, this rank's heads, for the later chunks.
LF_WORKER_CASE(chunkpipe_tp) {
  auto ctx = lf::testing::make_context(2);
  const auto& be = lf::backend::cpu_backend();
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    auto c = model(512, variant == 0);
    if (variant > 0) lf::testing::make_tiny_mla(c, variant == 1, 64);
    Decoder whole(c, be, 10, at::kFloat);
    perturb(whole);
    Decoder part(c, be, 10, at::kFloat, ctx.get(), /*sequence_parallel=*/true);
    part.load_full_parameters(full_parameters(whole));
    auto [tokens, labels] = sequence(1, 512, c.vocab_size);
    const double want = unchunked(whole, tokens, labels);
    RngStates rng;
    const double got = pl::run_chunkpipe(nullptr, 8, chunk_step(part, tokens, labels, 64, rng));
    EXPECT_NEAR(got, want, kRel * std::abs(want));
    expect_grads_equal(part, whole, nullptr, &ctx->tp());
  }
}

TEST(ChunkPipe, Tp2WithSequenceParallelEqualsUnchunked) {
  lf::testing::expect_all_ok(lf::testing::run_workers("chunkpipe_tp", {.world_size = 2}));
}

TEST(ChunkPipe, UnequalChunksAndVirtualStagesAreErrors) {
  const auto& be = lf::backend::cpu_backend();
  auto c = model(64, false);
  c.num_layers = 4;
  lf::models::PipelineStage two_chunks;
  two_chunks.chunks = {{0, 2}, {2, 4}};
  Decoder d(c, be, 1, at::kFloat, nullptr, false, two_chunks);
  pl::ChunkAttention kv;
  auto m = lf::testing::error_message([&] { d.stage_forward_chunk(at::zeros({1, 8}, at::kLong), {}, 0, kv); });
  EXPECT_NE(m.find("ChunkPipe runs one model chunk per pipeline rank"), std::string::npos) << m;
  Decoder whole(model(64, false), be, 1, at::kFloat);
  pl::ChunkPipeStep step;
  auto tokens = at::zeros({1, 64}, at::kLong);
  step.forward = [&](int64_t k, const pl::TensorMap&, pl::ChunkAttention& a, bool) {
    const int64_t len = k == 0 ? 16 : 8;  // the second chunk is shorter
    pl::StageResult r;
    r.activations.set("hidden_states", whole.stage_forward_chunk(tokens.narrow(1, 0, len), {}, 0, a, false));
    return r;
  };
  m = lf::testing::error_message([&] { pl::run_chunkpipe(nullptr, 2, step); });
  EXPECT_NE(m.find("chunk 1 has 8 tokens, chunk 0 had 16"), std::string::npos) << m;
}

}  // namespace

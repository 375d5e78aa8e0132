// The case table of the op harness (op_cases.h).
//
// Tolerances: fp32 cases allow 1e-5 absolute / 1e-4 relative, enough for a different reduction
// order (CUDA) over the few hundred terms these shapes sum, and far below any formula error
// (which shows at 1e-2 or more). bf16 cases produce bf16 outputs: a different summation order
// may round to the neighbouring bf16 value, one ulp = 2^-8 relative, so 2e-2 (about 2-5 ulps).
#include "op_cases.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>
#include <sstream>

#include "loongforge/core/error.h"

namespace lf::testing {
namespace {

using backend::AdamWHyper;
using backend::AttentionMask;
using backend::MaskKind;
using backend::OpTable;

constexpr double kF32Atol = 1e-5, kF32Rtol = 1e-4, kBf16Tol = 2e-2;

struct Rng {
  at::Generator gen;
  explicit Rng(uint64_t seed) : gen(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  at::Tensor randn(at::IntArrayRef shape, at::ScalarType dt, double scale = 1.0) {
    return (at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * scale).to(dt);
  }
  at::Tensor randint(int64_t high, at::IntArrayRef shape) {
    return at::randint(high, shape, gen, at::TensorOptions().dtype(at::kLong));
  }
};

const char* dt_name(at::ScalarType dt) { return dt == at::kBFloat16 ? "bf16" : "f32"; }
double atol_for(at::ScalarType dt) { return dt == at::kBFloat16 ? kBf16Tol : kF32Atol; }
double rtol_for(at::ScalarType dt) { return dt == at::kBFloat16 ? kBf16Tol : kF32Rtol; }

// cos/sin [s, r] for positions 0..s-1, laid out for the halves or the interleaved rotation.
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t s, int64_t r, bool interleaved) {
  auto inv_freq = at::pow(10000.0, -at::arange(0, r, 2, at::kDouble) / static_cast<double>(r));
  auto freqs = at::outer(at::arange(s, at::kDouble), inv_freq);  // [s, r/2]
  auto emb = interleaved ? freqs.repeat_interleave(2, 1) : at::cat({freqs, freqs}, 1);
  return {at::cos(emb).to(at::kFloat), at::sin(emb).to(at::kFloat)};
}

void add_norm_cases(std::vector<OpCase>& cases) {
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    cases.push_back({std::string("rms_norm_") + dt_name(dt), atol_for(dt), rtol_for(dt),
                     [dt] {
                       Rng g(1);
                       return std::vector<at::Tensor>{g.randn({4, 3, 64}, dt),
                                                      g.randn({64}, dt, 0.5) + 1.0,
                                                      g.randn({4, 3, 64}, dt)};
                     },
                     [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                       auto f = ops.rms_norm_fwd(in[0], in[1], 1e-6);
                       auto b = ops.rms_norm_bwd(in[2], in[0], in[1], f.rstd);
                       return NamedTensors{{"y", f.y}, {"rstd", f.rstd}, {"dx", b.dx},
                                           {"dw", b.dw}};
                     }});
  }
  // A width that is not a multiple of the vector lanes (the fp32 row kernels' tails) over enough
  // rows for every thread's weight-gradient partial sums.
  cases.push_back({"rms_norm_f32_odd_width", kF32Atol, kF32Rtol,
                   [] {
                     Rng g(3);
                     return std::vector<at::Tensor>{g.randn({70, 259}, at::kFloat),
                                                    g.randn({259}, at::kFloat, 0.5) + 1.0,
                                                    g.randn({70, 259}, at::kFloat)};
                   },
                   [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                     auto f = ops.rms_norm_fwd(in[0], in[1], 1e-6);
                     auto b = ops.rms_norm_bwd(in[2], in[0], in[1], f.rstd);
                     return NamedTensors{{"y", f.y}, {"rstd", f.rstd}, {"dx", b.dx}, {"dw", b.dw}};
                   }});
  // A non-contiguous x (a permuted view), as attention outputs often are.
  cases.push_back({"rms_norm_f32_strided", kF32Atol, kF32Rtol,
                   [] {
                     Rng g(2);
                     return std::vector<at::Tensor>{g.randn({3, 32, 5}, at::kFloat).permute({0, 2, 1}),
                                                    g.randn({32}, at::kFloat),
                                                    g.randn({3, 5, 32}, at::kFloat)};
                   },
                   [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                     auto f = ops.rms_norm_fwd(in[0], in[1], 1e-5);
                     auto b = ops.rms_norm_bwd(in[2], in[0], in[1], f.rstd);
                     return NamedTensors{{"y", f.y}, {"dx", b.dx}, {"dw", b.dw}};
                   }});
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    const bool bias = dt == at::kFloat;  // fp32 with bias, bf16 without
    cases.push_back({std::string("layer_norm_") + dt_name(dt) + (bias ? "_bias" : "_nobias"),
                     atol_for(dt), rtol_for(dt),
                     [dt, bias] {
                       Rng g(3);
                       return std::vector<at::Tensor>{
                           g.randn({6, 2, 48}, dt, 2.0) + 0.5, g.randn({48}, dt),
                           bias ? g.randn({48}, dt) : at::Tensor(), g.randn({6, 2, 48}, dt)};
                     },
                     [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                       auto f = ops.layer_norm_fwd(in[0], in[1], in[2], 1e-5);
                       auto b = ops.layer_norm_bwd(in[3], in[0], in[1], in[2].defined(), f.mean,
                                                   f.rstd);
                       NamedTensors out{{"y", f.y}, {"mean", f.mean}, {"rstd", f.rstd},
                                        {"dx", b.dx}, {"dw", b.dw}};
                       if (b.db.defined()) out.push_back({"db", b.db});
                       return out;
                     }});
  }
}

void add_rope_swiglu_ce_cases(std::vector<OpCase>& cases) {
  // strided: x a column slice of a wider [s, b, n, 40] (the query part of a fused QKV) and dy a
  // permuted view of [b, n, s, d] memory (attention's dq), as the attention layer passes them.
  // bf16_tables: cos / sin in bf16 too (the decoder makes fp32 tables for either dtype).
  struct RopeCfg { const char* name; at::ScalarType dt; bool interleaved; int64_t r; bool strided = false;
                   bool bf16_tables = false; };
  for (RopeCfg c : {RopeCfg{"rope_f32_halves", at::kFloat, false, 16},
                    RopeCfg{"rope_f32_interleaved_partial", at::kFloat, true, 8},
                    RopeCfg{"rope_bf16_halves_partial", at::kBFloat16, false, 8},
                    RopeCfg{"rope_f32_halves_strided_views", at::kFloat, false, 16, true},
                    RopeCfg{"rope_bf16_halves_partial_strided_views", at::kBFloat16, false, 8, true},
                    RopeCfg{"rope_bf16_halves_bf16_tables", at::kBFloat16, false, 16, false, true}}) {
    cases.push_back({c.name, atol_for(c.dt), rtol_for(c.dt),
                     [c] {
                       Rng g(4);
                       auto [cos, sin] = rope_tables(6, c.r, c.interleaved);
                       if (c.bf16_tables) cos = cos.to(at::kBFloat16), sin = sin.to(at::kBFloat16);
                       if (c.strided)
                         return std::vector<at::Tensor>{g.randn({6, 2, 3, 40}, c.dt).narrow(3, 8, 16), cos, sin,
                                                        g.randn({2, 3, 6, 16}, c.dt).permute({2, 0, 1, 3})};
                       return std::vector<at::Tensor>{g.randn({6, 2, 3, 16}, c.dt), cos, sin,
                                                      g.randn({6, 2, 3, 16}, c.dt)};
                     },
                     [c](const OpTable& ops, const std::vector<at::Tensor>& in) {
                       return NamedTensors{
                           {"y", ops.rope_fwd(in[0], in[1], in[2], c.interleaved)},
                           {"dx", ops.rope_bwd(in[3], in[1], in[2], c.interleaved)}};
                     }});
  }
  // Tables with different halves (the contract allows any; real tables repeat the angles, which
  // would hide a kernel that mixes up the halves' cos/sin), rotating 8 of 16 dims.
  cases.push_back({"rope_f32_halves_partial_arbitrary_tables", kF32Atol, kF32Rtol,
                   [] {
                     Rng g(6);
                     return std::vector<at::Tensor>{g.randn({6, 2, 3, 16}, at::kFloat), g.randn({6, 8}, at::kFloat),
                                                    g.randn({6, 8}, at::kFloat), g.randn({6, 2, 3, 16}, at::kFloat)};
                   },
                   [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                     return NamedTensors{{"y", ops.rope_fwd(in[0], in[1], in[2], false)},
                                         {"dx", ops.rope_bwd(in[3], in[1], in[2], false)}};
                   }});
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    cases.push_back({std::string("swiglu_") + dt_name(dt), atol_for(dt), rtol_for(dt),
                     [dt] {
                       Rng g(5);
                       return std::vector<at::Tensor>{g.randn({5, 3, 48}, dt, 2.0),
                                                      g.randn({5, 3, 24}, dt)};
                     },
                     [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                       return NamedTensors{{"y", ops.swiglu_fwd(in[0])},
                                           {"dgate_up", ops.swiglu_bwd(in[1], in[0])}};
                     }});
    cases.push_back({std::string("gelu_") + dt_name(dt), atol_for(dt), rtol_for(dt),
                     [dt] {
                       Rng g(7);
                       return std::vector<at::Tensor>{g.randn({5, 3, 24}, dt, 2.0),
                                                      g.randn({5, 3, 24}, dt)};
                     },
                     [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                       return NamedTensors{{"y", ops.gelu_fwd(in[0])},
                                           {"dx", ops.gelu_bwd(in[1], in[0])}};
                     }});
    // The tanh form over [-16, 16]: both saturated ends (|u| > 9 from |x| ~ 5.1) and the middle.
    cases.push_back({std::string("gelu_tanh_") + dt_name(dt), atol_for(dt), rtol_for(dt),
                     [dt] {
                       Rng g(8);
                       auto x = at::cat({at::linspace(-16, 16, 641, at::kFloat), g.randn({2, 3, 100}, at::kFloat, 2.0).flatten()})
                                    .to(dt);
                       return std::vector<at::Tensor>{x, g.randn({x.size(0)}, dt)};
                     },
                     [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                       return NamedTensors{{"y", ops.gelu_tanh_fwd(in[0])},
                                           {"dx", ops.gelu_tanh_bwd(in[1], in[0])}};
                     }});
    // GeGLU: gates over [-16, 16] (both saturated ends) in a shape whose size is not a multiple of
    // the CPU kernel's 256-element blocks.
    cases.push_back({std::string("geglu_tanh_") + dt_name(dt), atol_for(dt), rtol_for(dt),
                     [dt] {
                       Rng g(9);
                       auto gate = at::cat({at::linspace(-16, 16, 641, at::kFloat), g.randn({2, 3, 100}, at::kFloat, 2.0).flatten()})
                                       .view({17, 73})
                                       .to(dt);
                       return std::vector<at::Tensor>{gate, g.randn({17, 73}, dt), g.randn({17, 73}, dt)};
                     },
                     [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                       auto b = ops.geglu_tanh_bwd(in[2], in[0], in[1]);
                       return NamedTensors{{"y", ops.geglu_tanh_fwd(in[0], in[1])}, {"dgate", b.dgate}, {"dup", b.dup}};
                     }});
    cases.push_back({std::string("cross_entropy_") + dt_name(dt), atol_for(dt), rtol_for(dt),
                     [dt] {
                       Rng g(6);
                       auto target = g.randint(50, {16});
                       target.index_fill_(0, at::arange(0, 16, 5), -100);  // some ignored rows
                       return std::vector<at::Tensor>{g.randn({16, 50}, dt, 3.0), target,
                                                      g.randn({16}, at::kFloat)};
                     },
                     [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                       auto f = ops.softmax_cross_entropy_fwd(in[0], in[1], -100);
                       auto d = ops.softmax_cross_entropy_bwd(in[2], in[0], in[1], f.lse, -100);
                       return NamedTensors{{"loss", f.loss}, {"lse", f.lse}, {"dlogits", d}};
                     }});
  }
}

struct SdpaCfg {
  const char* name;
  at::ScalarType dt;
  int64_t b, nq, nkv, s, t, d, dv;
  MaskKind kind;
  bool block_mask = false;  // additive: pi05's block mask (openpi's -2.38e38 on the masked keys)
  bool query_major = false;  // q and dout as transposed views of [b, s, nq, d] memory (pi05's layout)
};

void add_sdpa_cases(std::vector<OpCase>& cases) {
  for (SdpaCfg c : {SdpaCfg{"sdpa_f32_nomask", at::kFloat, 2, 4, 4, 5, 5, 8, 8, MaskKind::none},
                    SdpaCfg{"sdpa_f32_causal_gqa", at::kFloat, 2, 4, 2, 6, 6, 8, 8,
                            MaskKind::causal},
                    SdpaCfg{"sdpa_f32_causal_kvcache", at::kFloat, 1, 2, 1, 3, 7, 8, 4,
                            MaskKind::causal},
                    SdpaCfg{"sdpa_f32_bool_mask", at::kFloat, 2, 2, 2, 4, 6, 8, 8,
                            MaskKind::explicit_bool},
                    SdpaCfg{"sdpa_f32_additive_mask_gqa", at::kFloat, 1, 6, 2, 5, 5, 16, 8,
                            MaskKind::explicit_additive},
                    // pi05's joint attention: a per-sample [b, 1, s, t] block mask (prefix keys
                    // bidirectional, padding keys never, action keys from action rows only), 8
                    // query heads on one key/value head (the CPU backend's own kernel; ATen's flash
                    // kernel, heads folded, with fewer tasks than threads).
                    SdpaCfg{"sdpa_f32_additive_block_mask_gqa", at::kFloat, 3, 8, 1, 12, 12, 16, 16,
                            MaskKind::explicit_additive, true},
                    // The same with q and dout in pi05's memory order, [b, s, nq, d] (the CPU
                    // backend reads them through their strides, or folds the heads query-major for
                    // the flash kernel, without copies), and without a mask in bf16 (2 tasks: the
                    // backend's own kernel, widened, up to 2 threads; the one-task bf16 cases
                    // below keep ATen's flash kernel from 2 threads on).
                    SdpaCfg{"sdpa_f32_additive_block_mask_gqa_query_major", at::kFloat, 3, 8, 1, 12, 12, 16, 16,
                            MaskKind::explicit_additive, true, true},
                    SdpaCfg{"sdpa_bf16_nomask_gqa_query_major", at::kBFloat16, 2, 4, 1, 6, 6, 16, 16, MaskKind::none,
                            false, true},
                    // The block mask on both fp32 paths whatever the core count: 16 (batch, kv
                    // head) tasks take the backend's own kernel up to 16 threads; one task takes
                    // ATen's flash kernel from 2 threads on (the own kernel at 1).
                    SdpaCfg{"sdpa_f32_additive_block_mask_16_tasks", at::kFloat, 16, 8, 1, 12, 12, 16, 16,
                            MaskKind::explicit_additive, true, true},
                    SdpaCfg{"sdpa_f32_additive_block_mask_one_task", at::kFloat, 1, 8, 1, 12, 12, 16, 16,
                            MaskKind::explicit_additive, true},
                    SdpaCfg{"sdpa_bf16_causal_gqa", at::kBFloat16, 2, 4, 1, 8, 8, 16, 16,
                            MaskKind::causal},
                    // bf16 on ATen's flash kernel (one (batch, kv head) task): causal with the
                    // heads expanded, and without a mask folded query-major.
                    SdpaCfg{"sdpa_bf16_causal_gqa_one_task", at::kBFloat16, 1, 4, 1, 8, 8, 16, 16,
                            MaskKind::causal},
                    SdpaCfg{"sdpa_bf16_nomask_gqa_query_major_one_task", at::kBFloat16, 1, 4, 1, 6, 6, 16, 16,
                            MaskKind::none, false, true},
                    // GQA without a mask over more keys than queries (ChunkPipe's prefix part;
                    // the CPU kernel folds each group's queries instead of copying K/V).
                    SdpaCfg{"sdpa_f32_nomask_gqa_long_keys", at::kFloat, 2, 6, 2, 5, 9, 8, 8, MaskKind::none},
                    SdpaCfg{"sdpa_bf16_nomask_gqa_long_keys", at::kBFloat16, 1, 4, 1, 6, 11, 16, 16,
                            MaskKind::none},
                    // The CPU backend's own fp32 kernel (backends/cpu/cpu_attention.cpp) takes
                    // calls with a (batch, kv head) task per thread: 16 tasks here. Its blocks:
                    // ~128 query rows (r heads x positions) by 512 keys, so 600 / 700 keys span
                    // two key blocks (online softmax) and several query blocks (causal skipping),
                    // with three query heads per group, a key prefix (bottom-right causal) and a
                    // value head size other than the query's.
                    SdpaCfg{"sdpa_f32_causal_gqa_16_tasks", at::kFloat, 4, 8, 4, 37, 37, 8, 8, MaskKind::causal},
                    SdpaCfg{"sdpa_f32_causal_gqa3_blocks", at::kFloat, 2, 24, 8, 600, 600, 8, 8,
                            MaskKind::causal},
                    SdpaCfg{"sdpa_f32_causal_prefix_blocks_dv", at::kFloat, 4, 8, 4, 100, 700, 16, 8,
                            MaskKind::causal},
                    SdpaCfg{"sdpa_f32_nomask_blocks_dv", at::kFloat, 4, 8, 4, 130, 530, 8, 12, MaskKind::none},
                    // bf16 on the same kernel, widened to fp32 (16 tasks: up to 16 threads), over
                    // two key blocks with causal skipping, and with pi05's block mask on
                    // query-major inputs.
                    SdpaCfg{"sdpa_bf16_causal_gqa_16_tasks_blocks", at::kBFloat16, 4, 8, 4, 600, 600, 16, 16,
                            MaskKind::causal},
                    SdpaCfg{"sdpa_bf16_additive_block_mask_16_tasks", at::kBFloat16, 16, 8, 1, 12, 12, 16, 16,
                            MaskKind::explicit_additive, true, true}}) {
    cases.push_back({c.name, atol_for(c.dt), rtol_for(c.dt),
                     [c] {
                       Rng g(7);
                       std::vector<at::Tensor> in{g.randn({c.b, c.nq, c.s, c.d}, c.dt),
                                                  g.randn({c.b, c.nkv, c.t, c.d}, c.dt),
                                                  g.randn({c.b, c.nkv, c.t, c.dv}, c.dt),
                                                  g.randn({c.b, c.nq, c.s, c.dv}, c.dt)};
                       if (c.query_major)
                         for (int i : {0, 3}) in[i] = in[i].transpose(1, 2).contiguous().transpose(1, 2);
                       if (c.kind == MaskKind::explicit_bool) {
                         // [b, 1, s, t], with row 1 of batch 0 seeing no key at all.
                         auto m = g.randn({c.b, 1, c.s, c.t}, at::kFloat).gt(-0.3);
                         m.select(0, 0).select(1, 1).fill_(false);
                         in.push_back(m);
                       } else if (c.kind == MaskKind::explicit_additive && c.block_mask) {
                         // Keys 0-7 the prefix (sample i: its last i % 8 keys padding), 8-11 actions.
                         auto allowed = at::zeros({c.b, 1, c.s, c.t}, at::kBool);
                         for (int64_t i = 0; i < c.b; ++i) {
                           allowed[i].narrow(2, 0, 8 - i % 8).fill_(true);
                           allowed[i].narrow(1, 8, 4).narrow(2, 8, 4).fill_(true);
                         }
                         in.push_back(at::where(allowed, at::zeros({}, at::kFloat),
                                                at::full({}, -2.3819763e38, at::kFloat)));
                       } else if (c.kind == MaskKind::explicit_additive) {
                         in.push_back(g.randn({1, 1, c.s, c.t}, at::kFloat));  // ALiBi-like bias
                       }
                       return in;
                     },
                     [c](const OpTable& ops, const std::vector<at::Tensor>& in) {
                       AttentionMask mask{c.kind, in.size() > 4 ? in[4] : at::Tensor()};
                       const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
                       auto f = ops.sdpa_fwd(in[0], in[1], in[2], mask, scale);
                       auto b = ops.sdpa_bwd(in[3], in[0], in[1], in[2], f.o, f.lse, mask, scale);
                       return NamedTensors{{"o", f.o}, {"lse", f.lse}, {"dq", b.dq},
                                           {"dk", b.dk}, {"dv", b.dv}};
                     }});
  }
}

// The output layer + cross entropy: 37 tokens (not a multiple of the 8-token chunks), 64 real
// vocabulary rows of 70 (padding), some tokens ignored, weights with zeros. dx and dw sum over
// the tokens (37 terms of the chunks in a different order than the reference's one GEMM).
void add_linear_cross_entropy_cases(std::vector<OpCase>& cases) {
  for (auto dt : {at::kFloat, at::kBFloat16})
    for (int64_t chunk : {int64_t{8}, int64_t{0}}) {
      const std::string name = std::string("linear_cross_entropy_") + dt_name(dt) + (chunk ? "_chunk8" : "_auto");
      cases.push_back({name, dt == at::kFloat ? 1e-5 : kBf16Tol, dt == at::kFloat ? kF32Rtol : kBf16Tol,
                       [dt] {
                         Rng g(13);
                         auto target = g.randint(64, {37});
                         target.index_fill_(0, at::arange(0, 37, 6), -100);
                         auto weight = g.randn({37}, at::kFloat).abs();
                         weight.index_fill_(0, at::arange(1, 37, 7), 0.0);
                         return std::vector<at::Tensor>{g.randn({37, 16}, dt), g.randn({70, 16}, dt, 0.5), target,
                                                        weight};
                       },
                       [chunk](const OpTable& ops, const std::vector<at::Tensor>& in) {
                         backend::VocabShard shard;
                         shard.valid = 64;
                         auto r = ops.linear_cross_entropy(in[0], in[1], in[2], in[3], -100, shard, chunk);
                         return NamedTensors{{"loss", r.loss}, {"dx", r.dx}, {"dw", r.dw}};
                       }});
      // The weight gradient into a destination (the gradient buffer's fp32 slot), scaled: written
      // over its contents (padding rows zeroed) or added to them; the result's dw is then undefined.
      for (bool accumulate : {false, true}) {
        cases.push_back({name + (accumulate ? "_into_add" : "_into_write"), dt == at::kFloat ? 1e-5 : kBf16Tol,
                         dt == at::kFloat ? kF32Rtol : kBf16Tol,
                         [dt] {
                           Rng g(13);
                           auto target = g.randint(64, {37});
                           target.index_fill_(0, at::arange(0, 37, 6), -100);
                           auto weight = g.randn({37}, at::kFloat).abs();
                           return std::vector<at::Tensor>{g.randn({37, 16}, dt), g.randn({70, 16}, dt, 0.5), target,
                                                          weight, g.randn({70, 16}, at::kFloat)};
                         },
                         [chunk, accumulate](const OpTable& ops, const std::vector<at::Tensor>& in) {
                           backend::VocabShard shard;
                           shard.valid = 64;
                           backend::GradInto into{in[4].clone(), 0.37, accumulate};
                           auto r = ops.linear_cross_entropy(in[0], in[1], in[2], in[3], -100, shard, chunk, into);
                           LF_CHECK(!r.dw.defined(), "linear_cross_entropy returned dw although it had a destination");
                           return NamedTensors{{"loss", r.loss}, {"dx", r.dx}, {"dw_into", into.dw}};
                         }});
      }
      // A frozen weight (LoRA's base): no weight gradient at all, the same loss and dx.
      cases.push_back({name + "_frozen_weight", dt == at::kFloat ? 1e-5 : kBf16Tol, dt == at::kFloat ? kF32Rtol : kBf16Tol,
                       [dt] {
                         Rng g(15);
                         auto target = g.randint(64, {37});
                         target.index_fill_(0, at::arange(0, 37, 5), -100);
                         auto weight = g.randn({37}, at::kFloat).abs();
                         return std::vector<at::Tensor>{g.randn({37, 16}, dt), g.randn({70, 16}, dt, 0.5), target, weight};
                       },
                       [chunk](const OpTable& ops, const std::vector<at::Tensor>& in) {
                         backend::VocabShard shard;
                         shard.valid = 64;
                         backend::GradInto into;
                         into.skip = true;
                         auto r = ops.linear_cross_entropy(in[0], in[1], in[2], in[3], -100, shard, chunk, into);
                         LF_CHECK(!r.dw.defined(), "linear_cross_entropy returned dw for a frozen weight");
                         return NamedTensors{{"loss", r.loss}, {"dx", r.dx}};
                       }});
    }
}

void add_squared_norm_cases(std::vector<OpCase>& cases) {
  // Tensors over several 16K blocks, and one smaller than a block; fp64 sums compared at 1e-12.
  cases.push_back({"squared_norm_f32", 0.0, 1e-12,
                   [] {
                     Rng g(14);
                     return std::vector<at::Tensor>{g.randn({40000}, at::kFloat), g.randn({7, 3}, at::kFloat),
                                                    g.randn({300, 110}, at::kFloat, 3.0)};
                   },
                   [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                     return NamedTensors{{"sum_sq", ops.squared_norm(in)}};
                   }});
  // Mixed storage dtypes in one list, a tensor over more than one of the CUDA kernel's 64K-element
  // chunks, and an empty tensor.
  cases.push_back({"squared_norm_mixed_dtypes", 0.0, 1e-12,
                   [] {
                     Rng g(16);
                     return std::vector<at::Tensor>{g.randn({70001}, at::kBFloat16), g.randn({0}, at::kFloat),
                                                    g.randn({129, 3}, at::kFloat, 2.0), g.randn({11}, at::kBFloat16)};
                   },
                   [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                     return NamedTensors{{"sum_sq", ops.squared_norm(in)}};
                   }});
}

// One AdamW step on clones of (param, grad, exp_avg, exp_avg_sq) quadruples; the updated states.
NamedTensors run_adamw(const OpTable& ops, const std::vector<at::Tensor>& in, const AdamWHyper& h) {
  std::vector<at::Tensor> p, gr, m, v;
  for (size_t i = 0; i < in.size(); i += 4) {
    p.push_back(in[i].clone());
    gr.push_back(in[i + 1]);
    m.push_back(in[i + 2].clone());
    v.push_back(in[i + 3].clone());
  }
  ops.adamw_step(p, gr, m, v, h);
  NamedTensors out;
  for (size_t i = 0; i < p.size(); ++i) {
    out.push_back({"param" + std::to_string(i), p[i]});
    out.push_back({"exp_avg" + std::to_string(i), m[i]});
    out.push_back({"exp_avg_sq" + std::to_string(i), v[i]});
  }
  return out;
}

void add_adamw_cases(std::vector<OpCase>& cases) {
  // fp32 grads over tensors larger than one thread's range (the flat pass splits inside and across
  // tensors), with a gradient scale (unscale x clip) and weight decay.
  cases.push_back({"adamw_f32_flat_scaled", kF32Atol, kF32Rtol,
                   [] {
                     Rng g(15);
                     std::vector<at::Tensor> in;
                     for (int64_t n : {40000, 5, 70001, 33}) {
                       in.push_back(g.randn({n}, at::kFloat));
                       in.push_back(g.randn({n}, at::kFloat, 4.0));
                       in.push_back(g.randn({n}, at::kFloat, 0.1));
                       in.push_back(g.randn({n}, at::kFloat, 0.1).square());
                     }
                     return in;
                   },
                   [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                     AdamWHyper h{3e-3, 0.9, 0.95, 1e-8, 0.1, 7};
                     h.grad_scale = 0.37;
                     return run_adamw(ops, in, h);
                   }});
  cases.push_back({"adamw_f32_bf16_grads", kF32Atol, kF32Rtol,
                   [] {
                     Rng g(8);
                     std::vector<at::Tensor> in;
                     for (auto shape : {std::vector<int64_t>{7, 5}, std::vector<int64_t>{13}}) {
                       in.push_back(g.randn(shape, at::kFloat));                   // param
                       in.push_back(g.randn(shape, at::kBFloat16));                // grad
                       in.push_back(g.randn(shape, at::kFloat, 0.1));              // exp_avg
                       in.push_back(g.randn(shape, at::kFloat, 0.1).square());     // exp_avg_sq
                     }
                     return in;
                   },
                   [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                     return run_adamw(ops, in, AdamWHyper{1e-2, 0.9, 0.95, 1e-8, 0.1, 3});
                   }});
  // fp32 and bf16 grads in one list (the CUDA kernel launches once per grad dtype), no decay.
  cases.push_back({"adamw_f32_mixed_grad_dtypes", kF32Atol, kF32Rtol,
                   [] {
                     Rng g(9);
                     std::vector<at::Tensor> in;
                     int i = 0;
                     for (int64_t n : {66000, 17, 301}) {
                       in.push_back(g.randn({n}, at::kFloat));
                       in.push_back(g.randn({n}, i++ % 2 == 0 ? at::kBFloat16 : at::kFloat));
                       in.push_back(g.randn({n}, at::kFloat, 0.1));
                       in.push_back(g.randn({n}, at::kFloat, 0.1).square());
                     }
                     return in;
                   },
                   [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                     return run_adamw(ops, in, AdamWHyper{2e-3, 0.8, 0.99, 1e-6, 0.0, 1});
                   }});
}

// MoE: 13 tokens, top-3 of 5 experts with dropped slots (-1) and one expert no token picks
// (an empty group), hidden 24 / ffn 20; permute -> grouped GEMM -> unpermute, forward and backward.
void add_moe_cases(std::vector<OpCase>& cases) {
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    cases.push_back({std::string("moe_permute_gemm_unpermute_") + dt_name(dt), atol_for(dt), rtol_for(dt),
                     [dt] {
                       Rng g(21);
                       auto idx = g.randint(4, {13, 3});   // experts 0..3: expert 4 stays empty
                       idx[1][2] = -1;  // capacity drops
                       idx[7][0] = -1;
                       return std::vector<at::Tensor>{g.randn({13, 24}, dt),           // x
                                                      idx,                              // indices
                                                      g.randn({5, 20, 24}, dt, 0.2),    // w [E, f, h]
                                                      g.randn({13, 3}, at::kFloat).abs(),  // probs
                                                      g.randn({13, 24}, dt)};           // dout
                     },
                     [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                       auto p = ops.moe_permute_fwd(in[0], in[1], 5);
                       auto y = ops.grouped_gemm_fwd(p.permuted, in[2], p.tokens_per_expert);  // [m, 20]
                       // Back to h = 24 columns for the return: the first 20 plus 4 copied.
                       auto y24 = at::cat({y, y.narrow(1, 0, 4)}, 1).contiguous();
                       auto out = ops.moe_unpermute_fwd(y24, p.position, in[3]);
                       auto ub = ops.moe_unpermute_bwd(in[4], y24, p.position, in[3]);
                       auto dy = ub.dy.narrow(1, 0, 20) + at::pad(ub.dy.narrow(1, 20, 4), {0, 16});
                       auto gb = ops.grouped_gemm_bwd(dy, p.permuted, in[2], p.tokens_per_expert, {});
                       auto dx = ops.moe_permute_bwd(gb.dx, p.source, 13);
                       return NamedTensors{{"permuted", p.permuted}, {"position", p.position},
                                           {"tokens_per_expert", p.tokens_per_expert}, {"y", y},
                                           {"out", out}, {"dprobs", ub.dprobs}, {"dw", gb.dw},
                                           {"dx", dx}};
                     }});
  }
  // The grouped GEMM alone with 16-byte aligned rows (bf16 hidden 24, ffn 16): the shape CUDA
  // hands to torch's grouped GEMM kernel; groups of 5, 0 (empty), 9 and 5 rows.
  cases.push_back({"grouped_gemm_aligned_bf16", atol_for(at::kBFloat16), rtol_for(at::kBFloat16),
                   [] {
                     Rng g(22);
                     return std::vector<at::Tensor>{g.randn({19, 24}, at::kBFloat16),        // x
                                                    g.randn({4, 16, 24}, at::kBFloat16, 0.2),  // w
                                                    g.randn({19, 16}, at::kBFloat16)};       // dy
                   },
                   [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                     const at::Tensor counts = at::tensor({5, 0, 9, 5}, at::TensorOptions().dtype(at::kLong));
                     auto y = ops.grouped_gemm_fwd(in[0], in[1], counts);
                     auto gb = ops.grouped_gemm_bwd(in[2], in[0], in[1], counts, {});
                     // Each gradient alone (--delay-wgrad-compute's split; a frozen weight): the
                     // other is not computed, and the one that is equals the joint call's.
                     auto dx_only = ops.grouped_gemm_bwd(in[2], in[0], in[1], counts, {true, false});
                     auto dw_only = ops.grouped_gemm_bwd(in[2], in[0], in[1], counts, {false, true});
                     LF_CHECK(!dx_only.dw.defined() && !dw_only.dx.defined(),
                              "grouped_gemm_bwd computed a gradient it was not asked for");
                     return NamedTensors{{"y", y},           {"dx", gb.dx},           {"dw", gb.dw},
                                         {"dx_alone", dx_only.dx}, {"dw_alone", dw_only.dw}};
                   }});
}

// DSA (DeepSeek sparse attention): the indexer's top-k, its scores at the selection (forward and
// backward) and the sparse attention (forward, head-summed probabilities, backward) on one
// selection. 4 indexer heads of 16 dims, GQA 4 query / 2 kv heads (d 24, dv 16), top-8 of 24
// keys: the early queries see fewer than 8 keys (-1 slots); with sq 16 < sk 24 the causal mask is
// bottom-right aligned. Each backend selects its own keys, compared exactly (indices). fp32: 1e-5
// absolute and relative, the bound the DSA work is held to (sums of <= 24 terms).
void add_dsa_cases(std::vector<OpCase>& cases) {
  struct Shape {
    const char* name;
    int64_t sq, sk;
    at::ScalarType dt;
  };
  for (const Shape& sh : {Shape{"dsa_f32", 24, 24, at::kFloat}, Shape{"dsa_bottom_right_f32", 16, 24, at::kFloat},
                          Shape{"dsa_bf16", 24, 24, at::kBFloat16}}) {
    const bool f32 = sh.dt == at::kFloat;
    cases.push_back({sh.name, f32 ? 1e-5 : atol_for(sh.dt), f32 ? 1e-5 : rtol_for(sh.dt),
                     [sh] {
                       Rng g(31);
                       const int64_t b = 2, sq = sh.sq, sk = sh.sk;
                       return std::vector<at::Tensor>{g.randn({b, sq, 4, 16}, sh.dt),     // qi
                                                      g.randn({b, sk, 16}, sh.dt),        // ki
                                                      g.randn({b, sq, 4}, sh.dt),         // w
                                                      g.randn({b, sq, 8}, at::kFloat),    // dscores
                                                      g.randn({b, 4, sq, 24}, sh.dt),     // q
                                                      g.randn({b, 2, sk, 24}, sh.dt),     // k
                                                      g.randn({b, 2, sk, 16}, sh.dt),     // v
                                                      g.randn({b, 4, sq, 16}, sh.dt)};    // dout
                     },
                     [](const OpTable& ops, const std::vector<at::Tensor>& in) {
                       const double si = 0.25, sa = 1.0 / std::sqrt(24.0);
                       auto idx = ops.dsa_indexer_topk(in[0], in[1], in[2], si, 8);
                       auto scores = ops.dsa_indexer_scores_fwd(in[0], in[1], in[2], idx, si);
                       auto ib = ops.dsa_indexer_scores_bwd(in[3], in[0], in[1], in[2], idx, si);
                       auto a = ops.dsa_sparse_attention_fwd(in[4], in[5], in[6], idx, sa);
                       auto ab = ops.dsa_sparse_attention_bwd(in[7], in[4], in[5], in[6], idx, a.o, a.lse, sa);
                       return NamedTensors{{"indices", idx}, {"index_scores", scores}, {"dqi", ib.dq},
                                           {"dki", ib.dk}, {"dw", ib.dw}, {"o", a.o}, {"lse", a.lse},
                                           {"head_prob", a.head_prob}, {"dq", ab.dq}, {"dk", ab.dk},
                                           {"dv", ab.dv}};
                     }});
  }
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> c;
    add_norm_cases(c);
    add_rope_swiglu_ce_cases(c);
    add_sdpa_cases(c);
    add_linear_cross_entropy_cases(c);
    add_squared_norm_cases(c);
    add_adamw_cases(c);
    add_moe_cases(c);
    add_dsa_cases(c);
    return c;
  }();
  return cases;
}

Closeness compare(const at::Tensor& actual, const at::Tensor& expected, double atol,
                  double rtol) {
  Closeness r;
  if (actual.sizes() != expected.sizes() || actual.scalar_type() != expected.scalar_type()) {
    r.ok = false;
    std::ostringstream os;
    os << "shape/dtype " << actual.sizes() << " " << actual.scalar_type() << " vs expected "
       << expected.sizes() << " " << expected.scalar_type();
    r.detail = os.str();
    return r;
  }
  auto a = actual.cpu().to(at::kDouble), e = expected.cpu().to(at::kDouble);
  auto same = a.eq(e).logical_or(a.isnan().logical_and(e.isnan()));  // covers +-inf
  auto diff = (a - e).abs();
  auto close = same.logical_or(diff.le(atol + rtol * e.abs()));
  auto finite = at::isfinite(a).logical_and(at::isfinite(e));
  r.max_abs = finite.any().item<bool>() ? diff.masked_select(finite).max().item<double>() : 0.0;
  r.ok = close.all().item<bool>();
  if (!r.ok) {
    auto bad = close.logical_not().flatten().nonzero().flatten();
    const int64_t first = bad[0].item<int64_t>();
    std::ostringstream os;
    os << bad.size(0) << " of " << a.numel() << " elements differ; first at flat index " << first
       << ": got " << a.flatten()[first].item<double>() << ", expected "
       << e.flatten()[first].item<double>() << "; max |diff| " << r.max_abs;
    r.detail = os.str();
  }
  return r;
}

}  // namespace lf::testing

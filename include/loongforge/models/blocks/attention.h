// Attention blocks, tensor-parallel through parallel/tensor: self-attention (GQA with Megatron's
// fused, per-group interleaved QKV; optional QKV bias and per-head QK RMSNorm; RoPE; causal,
// bidirectional, block (packed documents) or prefix (prefix-LM) masks; a KV cache for decoding
// and ChunkPipe's prefix keys/values) and cross-attention (queries from the sequence, keys and
// values from a context: text or image features for a DiT or an action expert). Not the layer
// around them (blocks/transformer_layer.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/models/blocks/lora.h"
#include "loongforge/models/blocks/norms.h"
#include "loongforge/models/blocks/param_builder.h"
#include "loongforge/parallel/context/context_parallel.h"
#include "loongforge/parallel/pipeline/chunk_attention.h"

namespace lf::ops {
class WeightGradSlots;  // backend/functional.h
}

namespace lf::models {

// Keys and values of the tokens seen so far, per layer, for incremental decoding. k, v:
// [b, nkv / tp, t, d].
struct KvCache {
  std::vector<at::Tensor> k, v;
  std::vector<at::Tensor> index_k;  // DSA: the lightning indexer's keys [b, t, di] per layer (blocks/mla.h)
  int64_t length = 0;  // tokens cached (the position of the next token)
};

// ChunkPipe: a chunk's attention over the keys and values of the earlier chunks.
using ChunkAttention = lf::parallel::pipeline::ChunkAttention;

struct AttentionConfig {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t num_groups = 0;  // key/value heads
  int64_t head_dim = 0;
  bool qkv_bias = false;   // bias in the fused QKV projection
  bool proj_bias = false;  // bias in the output projection (added after the TP reduction)
  bool qk_norm = false;    // per-head RMSNorm of queries and keys (Qwen3)
  double norm_eps = 1e-6;
  double init_std = 0.02, out_std = 0.02;  // QKV / output projection initialisation
  bool rotary_interleaved = false;         // RoPE on pairs (tables in that layout)
};

// What every layer of one forward shares.
struct AttentionInputs {
  // RoPE tables [s, d] (every sample at the same positions) or [b, s, d] (per-sample positions);
  // undefined: no rotary embedding.
  at::Tensor cos, sin;
  // causal (bottom-right aligned), none (bidirectional) or an explicit [b|1, 1, s, t] mask
  // (block_mask / prefix_lm_mask below).
  lf::backend::AttentionMask mask = lf::backend::AttentionMask::causal();
  // Packed documents: [b, s] int64 on the CPU, contiguous runs of one id; each run attends
  // causally within itself only, computed run by run (no [s, s] mask). Undefined: one sequence.
  // Under context parallelism: the ids of the whole sequence (every CP rank's tokens, natural order).
  at::Tensor documents;
  // Context parallelism (causal attention only): the layer holds this rank's tokens in the
  // load-balanced layout (parallel/context/context_parallel.h); null: the whole sequence.
  const lf::parallel::ContextParallel* cp = nullptr;
  KvCache* cache = nullptr;         // incremental decoding
  ChunkAttention* chunk = nullptr;  // ChunkPipe
  bool selective_recompute = false; // recompute RoPE + core attention in backward
};

// RoPE on x [s, b, n, d]: one table [s, r] for every sample, or per-sample tables [b, s, r].
at::Tensor apply_rope(const lf::backend::DeviceBackend& be, const at::Tensor& x, const at::Tensor& cos,
                      const at::Tensor& sin, bool interleaved = false);
// Core attention of layer i on q [b, nq, s, d], k [b, nq|nkv, s, d], v [b, ., s, dv] with the
// KV cache (keys/values appended, the causal mask bottom-right over them) or ChunkPipe's prefix
// keys/values when given: [b, nq, s, dv]. scale: 1/sqrt(d) by default. documents (AttentionInputs::
// documents, defined): causal attention within each document run instead of `mask`. cp (on):
// causal attention over the CP group's whole sequence, q/k/v holding this rank's tokens.
at::Tensor attend(const lf::backend::DeviceBackend& be, at::Tensor q, at::Tensor k, at::Tensor v,
                  const lf::backend::AttentionMask& mask, KvCache* cache, ChunkAttention* chunk, size_t layer,
                  std::optional<double> scale = std::nullopt, const at::Tensor& documents = {},
                  const lf::parallel::ContextParallel* cp = nullptr);

// Causal attention within documents: document_ids [b, s] (int64) -> bool [b, 1, s, s], true
// where query i may see key j (j <= i and the same document).
at::Tensor block_causal_mask(const at::Tensor& document_ids);
// Prefix-LM: bidirectional within the first prefix_len[b] tokens, causal after. prefix_len:
// [b] int64 -> bool [b, 1, s, s].
at::Tensor prefix_lm_mask(const at::Tensor& prefix_len, int64_t seq);

class SelfAttention {
 public:
  SelfAttention() = default;
  // Registers, in this order: prefix.linear_qkv.weight [ng (nq/ng + 2) d, h] (+ .bias),
  // prefix.q_layernorm / k_layernorm [d], prefix.linear_proj.weight [h, nq d] (+ .bias).
  SelfAttention(ParamBuilder& b, const std::string& prefix, const AttentionConfig& c);
  // x: [s(/tp), b, h] -> the branch output [s(/tp), b, h] (before the residual add). `layer`:
  // the index into in.cache / in.chunk. lora: adapters on q/k/v/o_proj (null: none). slots:
  // gradient-accumulation fusion for linear_qkv and linear_proj (lf::ops::linear), or null.
  // pre_norm: x is the un-normed input and this norm comes first (Norm::first_linear fuses it into
  // linear_qkv where it can, unless adapters read the normed input); null: x is the input.
  // fp8: which of linear_qkv / linear_proj run in FP8 at this token count (null: neither).
  at::Tensor forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp, const at::Tensor& x,
                     const AttentionInputs& in, size_t layer, const LoraInputs* lora = nullptr,
                     const lf::ops::WeightGradSlots* slots = nullptr, const Norm* pre_norm = nullptr,
                     const lf::ops::Fp8Policy* fp8 = nullptr) const;
  const AttentionConfig& config() const { return c_; }

 private:
  AttentionConfig c_;
  at::Tensor qkv_, qkv_bias_, q_norm_, k_norm_, proj_, proj_bias_;
};

// Queries from x, keys/values from a context sequence (no RoPE). Registers
// prefix.linear_q.weight [nq d, h], prefix.linear_kv.weight [ng 2 d, hc] (per group: its key
// head, then its value head), prefix.linear_proj.weight [h, nq d] (+ biases with qkv_bias /
// proj_bias). TP splits heads like self-attention.
class CrossAttention {
 public:
  CrossAttention() = default;
  CrossAttention(ParamBuilder& b, const std::string& prefix, const AttentionConfig& c, int64_t context_size);
  // x: [s(/tp), b, h], context: [t, b, hc] (replicated) -> [s(/tp), b, h]. mask: none or an
  // explicit [b|1, 1, s, t] mask (padded context tokens).
  at::Tensor forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp, const at::Tensor& x,
                     const at::Tensor& context,
                     const lf::backend::AttentionMask& mask = lf::backend::AttentionMask::none()) const;

 private:
  AttentionConfig c_;
  at::Tensor q_, q_bias_, kv_, kv_bias_, proj_, proj_bias_;
};

}  // namespace lf::models

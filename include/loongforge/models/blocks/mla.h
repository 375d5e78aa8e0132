// Multi-latent attention (DeepSeek-V2/V3; Megatron's MLASelfAttention): queries through an
// optional low-rank bottleneck (q_lora_rank) with an RMSNorm, keys and values from one compressed
// latent (kv_lora_rank, RMSNorm) expanded per head, and a decoupled RoPE part: each query head
// has qk_pos_emb_head_dim rotary dims of its own, the keys share one rotary vector computed
// from the hidden state. Heads split over tensor parallelism (the up projections by rows, the
// output projection by columns); the down projections and latent norms are replicated and their
// gradients summed over TP. The KV cache and ChunkPipe keep the expanded keys and values as the
// GQA block does. Not the RoPE tables (blocks/rope.h: YaRN, interleaved layout).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "loongforge/backend/device_backend.h"
#include "loongforge/models/blocks/attention.h"
#include "loongforge/models/blocks/param_builder.h"

namespace lf::models {

struct MlaConfig {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;          // 0: queries straight from the hidden state (linear_q_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_head_dim = 0;          // per head, without RoPE
  int64_t qk_pos_emb_head_dim = 0;  // per head, with RoPE (the keys' is shared by the heads)
  int64_t v_head_dim = 0;
  double norm_eps = 1e-6;
  double softmax_scale = 0;         // 0: 1 / sqrt(qk_head_dim + qk_pos_emb_head_dim)
  bool rotary_interleaved = false;  // RoPE on pairs (x[2i], x[2i+1]) (DeepSeek), else halves
  double init_std = 0.02, out_std = 0.02;
};

class MlaAttention {
 public:
  MlaAttention() = default;
  // Registers, in this order: prefix.linear_q_proj.weight [nq (dq + dr), h] (q_lora_rank 0), or
  // prefix.linear_q_down_proj.weight [q_lora, h], prefix.q_layernorm.weight [q_lora],
  // prefix.linear_q_up_proj.weight [nq (dq + dr), q_lora]; then prefix.linear_kv_down_proj.weight
  // [kv_lora + dr, h], prefix.kv_layernorm.weight [kv_lora], prefix.linear_kv_up_proj.weight
  // [nq (dq + dv), kv_lora], prefix.linear_proj.weight [h, nq dv]. Per head the rows are
  // [no-RoPE dims; RoPE dims] (queries) and [key dims; value dims] (kv up projection).
  MlaAttention(ParamBuilder& b, const std::string& prefix, const MlaConfig& c);
  // x: [s(/tp), b, h] -> [s(/tp), b, h]. in.cos/in.sin: tables of qk_pos_emb_head_dim dims in the
  // layout rotary_interleaved names.
  at::Tensor forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp, const at::Tensor& x,
                     const AttentionInputs& in, size_t layer) const;
  const MlaConfig& config() const { return c_; }

 private:
  MlaConfig c_;
  at::Tensor q_, q_down_, q_norm_, q_up_, kv_down_, kv_norm_, kv_up_, proj_;
};

}  // namespace lf::models

// Multi-latent attention (DeepSeek-V2/V3; Megatron's MLASelfAttention): queries through an
// optional low-rank bottleneck (q_lora_rank) with an RMSNorm, keys and values from one compressed
// latent (kv_lora_rank, RMSNorm) expanded per head, and a decoupled RoPE part: each query head
// has qk_pos_emb_head_dim rotary dims of its own, the keys share one rotary vector computed
// from the hidden state. Heads split over tensor parallelism (the up projections by rows, the
// output projection by columns); the down projections and latent norms are replicated, the heads'
// partial gradients of the latents summed over TP where they enter the heads, so their own
// gradients are whole on every rank. The KV cache and ChunkPipe keep the expanded keys and values as the
// GQA block does. Not the RoPE tables (blocks/rope.h: YaRN, interleaved layout).
// With DSA (DeepSeek-V3.2's sparse attention, MlaConfig::dsa) a lightning indexer of its own heads
// picks each query's top-k keys and the attention runs over those only (backend/op_table.h, the
// dsa_* ops); the indexer learns from its KL loss against the attention's distribution alone (its
// inputs are detached from the main model).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "loongforge/backend/device_backend.h"
#include "loongforge/models/blocks/attention.h"
#include "loongforge/models/blocks/param_builder.h"

namespace lf::models {

// DeepSeek Sparse Attention (DeepSeek-V3.2; Megatron's dsa_indexer_* fields).
struct DsaConfig {
  bool on = false;
  int64_t n_heads = 0;     // the indexer's query heads
  int64_t head_dim = 0;    // its query/key head size (the first qk_pos_emb_head_dim dims rotate)
  int64_t topk = 0;        // keys each query attends to
  double loss_coeff = 0;   // the indexer KL loss's weight (0: no loss)
  // Warm-up stage: dense attention (every causal key selected); the KL loss over all keys trains
  // the indexer (freezing the rest of the model is not part of this switch).
  bool warmup = false;
};

class MoeStep;

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
  DsaConfig dsa;
};

class MlaAttention {
 public:
  MlaAttention() = default;
  // Registers, in this order: prefix.linear_q_proj.weight [nq (dq + dr), h] (q_lora_rank 0), or
  // prefix.linear_q_down_proj.weight [q_lora, h], prefix.q_layernorm.weight [q_lora],
  // prefix.linear_q_up_proj.weight [nq (dq + dr), q_lora]; then prefix.linear_kv_down_proj.weight
  // [kv_lora + dr, h], prefix.kv_layernorm.weight [kv_lora], prefix.linear_kv_up_proj.weight
  // [nq (dq + dv), kv_lora], prefix.linear_proj.weight [h, nq dv]. Per head the rows are
  // [no-RoPE dims; RoPE dims] (queries) and [key dims; value dims] (kv up projection). With DSA
  // then the indexer: prefix.indexer.linear_wq_b.weight [nh di, q_lora],
  // prefix.indexer.linear_wk.weight [di, h], prefix.indexer.k_norm.{weight,bias} [di] (LayerNorm),
  // prefix.indexer.linear_weights_proj.weight [nh, h]; per indexer head the rows are [RoPE dims;
  // the rest] (HF's layout; its RoPE rotates halves whatever rotary_interleaved says).
  MlaAttention(ParamBuilder& b, const std::string& prefix, const MlaConfig& c);
  // x: [s(/tp), b, h] -> [s(/tp), b, h]. in.cos/in.sin: tables of qk_pos_emb_head_dim dims in the
  // layout rotary_interleaved names.
  // step (training passes whose graph is backpropagated; may be null): where the DSA indexer loss
  // is recorded and its weight read.
  // fp8: the query/key/value projections (the down projections, linear_q_proj or
  // linear_q_up_proj, linear_kv_up_proj and the DSA indexer's three; the policy's qkv kind) and
  // linear_proj (proj) in FP8 where it chooses so at this token count. Under TP the down
  // projections' output gradients are summed over TP before their GEMMs, so FP8 quantizes the
  // whole gradient there, as one process does.
  // TP: the heads split (the up projections column-parallel, linear_proj row-parallel); the down
  // projections and the latent norms replicated, their gradients whole on every rank
  // (ParamBuilder::TpGrad::whole).
  at::Tensor forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp, const at::Tensor& x,
                     const AttentionInputs& in, size_t layer, MoeStep* step = nullptr, bool training = false,
                     const lf::ops::Fp8Policy* fp8 = nullptr) const;
  const MlaConfig& config() const { return c_; }

  // The DSA indexer alone on the hidden state xf [s, b, h] and the query latent qr [s, b, q_lora]
  // (both detached by forward): qi [b, s, nh, di] (RoPE applied), ki [b, s, di], w [b, s, nh]
  // (already times nh^-1/2), the inputs of the dsa_* ops with scale di^-1/2.
  struct IndexerOut {
    at::Tensor qi, ki, w;
    double scale = 1;
  };
  // fp8: its projections' recipe (null: the training dtype).
  IndexerOut indexer(const lf::backend::DeviceBackend& be, const at::Tensor& xf, const at::Tensor& qr,
                     const AttentionInputs& in, const lf::ops::Fp8Recipe* fp8 = nullptr) const;

  // The indexer's KL loss (times the coefficient) for one forward: indices [b, s, K] and the
  // attention's head-summed probabilities at them ([b, s, K], DsaAttentionFwd::head_prob).
  at::Tensor indexer_loss(const lf::backend::DeviceBackend& be, const IndexerOut& ix, const at::Tensor& indices,
                          const at::Tensor& head_prob) const;

 private:
  MlaConfig c_;
  at::Tensor q_, q_down_, q_norm_, q_up_, kv_down_, kv_norm_, kv_up_, proj_;
  at::Tensor idx_wq_, idx_wk_, idx_norm_w_, idx_norm_b_, idx_wproj_;  // DSA's indexer
};

}  // namespace lf::models

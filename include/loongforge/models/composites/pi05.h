// The `pi05` composite: a Pi0.5-style vision-language-action policy (Physical Intelligence's
// pi0.5 as LeRobot's PI05Policy implements it, the same function and parameter names).
//
//   prefix  = [SigLIP(image_c) -> projector for every camera c; the prompt's token embeddings]
//             (the prompt carries the task and the discretised state)
//   suffix  = action_in_proj(x_t), one token per step of the action chunk
//   layers  : the PaliGemma LM (`foundation`) runs on the prefix and the action expert
//             (`action_expert`, a smaller Gemma with adaRMSNorm on the flow-matching time) on the
//             suffix; each layer's attention is ONE attention over the concatenated queries, keys
//             and values of both (prefix bidirectional among its valid tokens, suffix attends the
//             prefix and itself, the prefix never attends the suffix)
//   output  : v_t = action_out_proj(expert's final adaRMSNorm(suffix))
//
// Training: x_t = t noise + (1 - t) actions with t ~ Beta(1.5, 1) x 0.999 + 0.001, target
// u_t = noise - actions, element-wise MSE over the real action dims (normaliser: elements).
// Sampling: Euler from t = 1 to 0 in num_inference_steps over the prefix's keys/values computed
// once (the prefix KV cache). docs/vla.md "The Pi0.5 policy".
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "loongforge/core/config/node.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/models/blocks/param_builder.h"
#include "loongforge/models/model.h"

namespace lf::ops {
enum class Fp8Gemm;
struct Fp8Recipe;
}  // namespace lf::ops

namespace lf::models {

class Registry;

// The SigLIP vision tower of PaliGemma (transformers' SiglipVisionModel without its head).
struct SiglipConfig {
  int64_t hidden_size = 1152;
  int64_t intermediate_size = 4304;
  int64_t num_hidden_layers = 27;
  int64_t num_attention_heads = 16;
  int64_t patch_size = 14;
  int64_t image_size = 224;
  double layer_norm_eps = 1e-6;
  // How the learned position embedding starts: "normal" (N(0, std) as every other matrix) or
  // "sincos2d" (the 2D sine-cosine code of big_vision's ViT: a quarter of the channels sin(x w),
  // cos(x w), sin(y w), cos(y w) of the patch's column x and row y, w = 10000^(-k / (width / 4)));
  // it stays a trained parameter either way.
  std::string position_embedding_init = "normal";

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("hidden_size", hidden_size, "Width of the vision transformer", Min{1});
    v("intermediate_size", intermediate_size, "MLP hidden size", Min{1});
    v("num_hidden_layers", num_hidden_layers, "Encoder layers", Min{1});
    v("num_attention_heads", num_attention_heads, "Attention heads (SigLIP so400m: 16)", Min{1});
    v("patch_size", patch_size, "Square patch of the patch embedding", Min{1});
    v("image_size", image_size, "Square input resolution (image_size / patch_size)^2 tokens per image", Min{1});
    v("layer_norm_eps", layer_norm_eps, "Epsilon of the LayerNorms", Min{0});
    v("position_embedding_init", position_embedding_init,
      "Start of the learned position embedding: normal (as the other weights) or sincos2d (big_vision's 2D "
      "sine-cosine code; hidden_size a multiple of 4); trained either way",
      OneOf{{"normal", "sincos2d"}});
  }
  int64_t tokens_per_image() const { return (image_size / patch_size) * (image_size / patch_size); }
  int64_t num_parameters() const;
  void validate(const lf::config::Node& tree, const std::string& prefix, lf::config::ErrorList& errors) const;
};

// The position embedding position_embedding_init "sincos2d" starts from: [tokens_per_image,
// hidden_size] float32, row r = the patch in image row r / side, column r % side.
at::Tensor sincos2d_position_embedding(const SiglipConfig& vision);

// A Gemma decoder as pi0 uses it (openpi's gemma.Config: width, depth, mlp_dim, heads, kv heads,
// head dim): RMSNorm with (1 + w), GELU-tanh gated MLP, RoPE; the action expert's norms are
// adaptive (adaRMSNorm on the time embedding, with a gate on each residual branch).
struct PiGemmaConfig {
  int64_t width = 2048;
  int64_t depth = 18;
  int64_t mlp_dim = 16384;
  int64_t num_heads = 8;
  int64_t num_kv_heads = 1;
  int64_t head_dim = 256;
  int64_t vocab_size = 257152;  // the prefix LM's token embedding; 0: none (the action expert)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("width", width, "Hidden size (gemma_2b: 2048, gemma_300m: 1024)", Min{1});
    v("depth", depth, "Layers (18 in both pi0.5 variants)", Min{1});
    v("mlp_dim", mlp_dim, "MLP hidden size (gemma_2b: 16384, gemma_300m: 4096)", Min{1});
    v("num_heads", num_heads, "Query heads (8)", Min{1});
    v("num_kv_heads", num_kv_heads, "Key/value heads (1)", Min{1});
    v("head_dim", head_dim, "Channels per head (256)", Min{2});
    v("vocab_size", vocab_size, "Token embedding rows (PaliGemma: 257152); 0: no embedding (the action expert)",
      Min{0});
    v("rms_norm_eps", rms_norm_eps, "Epsilon of the RMSNorms", Min{0});
    v("rope_theta", rope_theta, "RoPE base", Min{1});
  }
  int64_t num_parameters(bool adaptive) const;
  void validate(const lf::config::Node& tree, const std::string& prefix, lf::config::ErrorList& errors) const;
};

struct Pi05Config {
  int64_t chunk_size = 50;      // actions per chunk (openpi's action_horizon)
  int64_t max_action_dim = 32;  // actions are zero-padded to this width
  int64_t action_dim = 32;      // the robot's real action dims: the loss covers these
  int64_t num_inference_steps = 10;
  double time_sampling_beta_alpha = 1.5;
  double time_sampling_beta_beta = 1.0;
  double time_sampling_scale = 0.999;
  double time_sampling_offset = 0.001;
  double min_period = 4e-3;
  double max_period = 4.0;
  // Prompt tokens per sample on a LeRobot dataset (LeRobot's tokenizer_max_length): the
  // tokenised prompt is truncated or right-padded to it.
  int64_t tokenizer_max_length = 200;
  // --mock-data: cameras per sample and prompt tokens.
  int64_t mock_cameras = 2;
  int64_t mock_tokens = 16;
  // Co-training of the prefix LM (pi0.5 trains its VLM on text targets beside the flow-matching
  // loss): > 0 adds this weight x the cross entropy of the PaliGemma LM's next-token head (tied to
  // the token embedding) on the batch's `prompt_labels` ([b, L] token ids at prompt positions,
  // -100 elsewhere), read from the prefix's final-normed outputs. 0: off, as LeRobot's pi05 (the
  // prefix LM's last-layer queries, MLP and final norm are then untrained model state).
  double prefix_lm_loss_weight = 0;
  // Initialisation of every weight matrix of a fresh policy (biases start at 0, norms at their
  // identity): "normal" N(0, 0.02) (openpi, transformers), or "fan_in" N(0, 1 / fan_in) (LeCun
  // normal: fan_in is the matrix's input width, 3 x patch^2 for the patch embedding, the width for
  // the token embedding). Loaded weights replace either.
  std::string init_method = "normal";

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("chunk_size", chunk_size, "Actions predicted per chunk (openpi's action_horizon)", Min{1});
    v("max_action_dim", max_action_dim, "Width actions are zero-padded to", Min{1});
    v("action_dim", action_dim, "The robot's action dims (<= max_action_dim): the loss averages over these", Min{1});
    v("num_inference_steps", num_inference_steps, "Euler steps of sampling", Min{1});
    v("time_sampling_beta_alpha", time_sampling_beta_alpha, "Training time t ~ Beta(alpha, beta) x scale + offset",
      Min{0});
    v("time_sampling_beta_beta", time_sampling_beta_beta, "See time_sampling_beta_alpha", Min{0});
    v("time_sampling_scale", time_sampling_scale, "See time_sampling_beta_alpha", Min{0});
    v("time_sampling_offset", time_sampling_offset, "See time_sampling_beta_alpha", Min{0});
    v("min_period", min_period, "Shortest period of the time's sine-cosine embedding", Min{0});
    v("max_period", max_period, "Longest period of the time's sine-cosine embedding", Min{0});
    v("tokenizer_max_length", tokenizer_max_length,
      "Training on a LeRobot dataset: prompt tokens per sample (truncated or right-padded; LeRobot's "
      "tokenizer_max_length)",
      Min{1});
    v("mock_cameras", mock_cameras, "--mock-data: cameras per sample", Min{1});
    v("mock_tokens", mock_tokens, "--mock-data: prompt tokens per sample", Min{1});
    v("prefix_lm_loss_weight", prefix_lm_loss_weight,
      "> 0: add this weight x the prefix LM's cross entropy on the batch's prompt_labels (token ids at prompt "
      "positions, -100 elsewhere; loongforge-data make-demo-reach --position-queries writes them); 0: off",
      Min{0});
    v("init_method", init_method,
      "Initialisation of a fresh policy's weight matrices: normal (N(0, 0.02), as openpi) or fan_in (N(0, "
      "1/fan_in), LeCun normal)",
      OneOf{{"normal", "fan_in"}});
  }
  void validate(const lf::config::Node& tree, const std::string& prefix, lf::config::ErrorList& errors) const;
};

// One batch as LeRobot's PI05Pytorch takes it after its processor.
struct Pi05Inputs {
  at::Tensor images;     // [n_cam, b, 3, H, W] float in [-1, 1]
  at::Tensor img_masks;  // [n_cam, b] bool: the camera is present
  at::Tensor tokens;     // [b, L] int64
  at::Tensor masks;      // [b, L] bool: a real (not padding) token
  // Optional [b, L] bool, openpi's token_ar_mask: a true token starts a new attention block of the
  // prompt. Token i belongs to block cumsum(ar_mask)[i] (the images to block 0) and sees the valid
  // tokens of its own and earlier blocks, so an earlier block never sees a later one (pi0.5's
  // subtask text after the prompt; the reach demo's answers after its queries). Undefined (the
  // batch field prompt_ar_mask absent): one bidirectional prefix, as LeRobot's pi05.
  at::Tensor ar_mask;
};

// Which components are frozen (LeRobot's freeze_vision_encoder: the vision tower;
// train_expert_only: the vision tower, the projector and the PaliGemma LM).
struct Pi05Freeze {
  bool vision_encoder = false, foundation = false, action_expert = false;
};

class Pi05 : public Model {
 public:
  // Parameter groups: vision_encoder (the SigLIP tower), model (the projector and the PaliGemma LM),
  // action_expert (the expert, the action and time projections), model_state (never trained).
  Pi05(const SiglipConfig& vision, const PiGemmaConfig& vlm, const PiGemmaConfig& expert, const Pi05Config& config,
       const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
       const lf::dist::ParallelContext* parallel, Pi05Freeze freeze = {});

  const std::string& type() const override;
  std::vector<ParameterGroup> parameter_groups() const override;
  std::map<std::string, double> loss_counts(const Batch& batch) const override;
  StageOutput stage_forward(const Batch& batch, const TensorMap& input, int64_t chunk, Pass pass) override;
  std::vector<std::string> eval_metrics() const override;
  std::vector<std::string> batch_fields() const override;
  double flops_per_sample(int64_t seq_length) const override;
  void set_training(bool) override {}
  void end_step(const at::Tensor&) override { ++step_; }
  void resume_at(int64_t iteration) override { step_ = iteration; }

  // PI05Pytorch.forward: the element-wise flow-matching MSE [b, chunk, max_action_dim] fp32 for
  // actions [b, chunk, max_action_dim], noise (same shape) and time [b].
  at::Tensor losses(const Pi05Inputs& in, const at::Tensor& actions, const at::Tensor& noise,
                    const at::Tensor& time) const;
  // PI05Pytorch.sample_actions: Euler-integrated actions [b, chunk, max_action_dim] fp32 from noise,
  // over the prefix's cached keys/values. steps <= 0: num_inference_steps.
  at::Tensor sample_actions(const Pi05Inputs& in, const at::Tensor& noise, int64_t steps = 0) const;
  // The prefix LM's per-token cross entropy [b, L] fp32 of labels [b, L] (token ids; 0 where -100)
  // at the prompt's positions: the prefix (bidirectional among its valid tokens) through every
  // PaliGemma layer, the final norm, the head tied to the token embedding (as the prefix pass of
  // PaliGemmaWithExpertModel.forward, then PaliGemma's lm_head). Needs prefix_lm_loss_weight > 0.
  at::Tensor prefix_lm_losses(const Pi05Inputs& in, const at::Tensor& labels) const;
  // The prefix LM's logits [b, L, vocab_size] fp32 at the prompt's positions (the same pass and
  // head as prefix_lm_losses, no gradient): what the policy decodes before sampling actions.
  // Needs prefix_lm_loss_weight > 0 and no tensor parallelism.
  at::Tensor prompt_logits(const Pi05Inputs& in) const;

  // Every parameter and model-state tensor from full tensors by name (this rank's shard of each);
  // an lf::Error naming `source` and the tensor when one is missing, has another shape, or the
  // model has no such tensor.
  void load_full(const std::map<std::string, at::Tensor>& full, const std::string& source);
  // The batch (trainer fields) as the model's inputs.
  Pi05Inputs inputs_of(const Batch& batch) const;
  const Pi05Config& config() const { return config_; }
  const SiglipConfig& vision_config() const { return vision_; }
  const PiGemmaConfig& vlm_config() const { return vlm_; }
  const PiGemmaConfig& expert_config() const { return expert_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  // Gradient-accumulation fusion (--gradient-accumulation-fusion, the default): every linear
  // layer's backward writes its fp32 weight gradient into the trainer's buffer.
  void set_gradient_sink(const GradientSink* sink) override { sink_ = sink; }
  // FP8 (--fp8-format): each joint layer's (the prefix LM's and the action expert's) query, key,
  // value, output, gate/up and down projections follow the policy (kinds qkv, proj, fc1, fc2); the
  // first/last layers' flags count joint layers. With a KV head count TP does not divide the keys
  // and values are replicated and their output gradients summed over TP before their GEMMs, so FP8
  // quantizes the whole gradient as one process does. The SigLIP tower, the projector and the
  // action/time MLPs stay in the training dtype.
  bool set_fp8(const lf::ops::Fp8Policy* fp8) override;
  const std::vector<Parameter>& state() const { return state_; }
  static constexpr const char* kLoss = "flow matching loss";
  // Logged in training as prefix_lm_loss_weight x the mean cross entropy; in evaluation unweighted.
  static constexpr const char* kPrefixLmLoss = "prefix lm loss";

 private:
  struct Norm {
    at::Tensor weight;            // (1 + w) RMSNorm
    at::Tensor dense, dense_bias; // adaRMSNorm: [3 width, cond] -> scale, shift, gate
  };
  struct GemmaLayer {
    Norm input_norm, post_norm;
    at::Tensor q, k, v, o, gate, up, down;
    bool fp8 = false;  // set_fp8: this layer's projections follow the policy
  };
  struct VisionLayer {
    at::Tensor ln1_w, ln1_b, q, q_b, k, k_b, v, v_b, out, out_b, ln2_w, ln2_b, fc1, fc1_b, fc2, fc2_b;
  };
  struct Prefix {
    at::Tensor embs;  // [b, P, width]
    at::Tensor pad;   // [b, P] bool
    at::Tensor block; // [b, P] int64 attention block (Pi05Inputs::ar_mask); undefined: all one block
  };
  struct KV {
    at::Tensor k, v;  // [b, kv_heads, P, d] after RoPE
  };

  at::Tensor embed_images(const at::Tensor& images) const;  // [n, 3, H, W] -> [n, tokens, width]
  // skip_missing: a missing camera's image tokens are zeros, its image not run through the tower
  // (for callers that read only the valid tokens' outputs; padded rows see every key).
  Prefix embed_prefix(const Pi05Inputs& in, bool skip_missing = false) const;
  // The suffix tokens [b, chunk, expert width] and the adaRMS condition [b, expert width].
  std::pair<at::Tensor, at::Tensor> embed_suffix(const at::Tensor& x_t, const at::Tensor& time) const;
  // Norm of a stream: (normed, gate or undefined).
  std::pair<at::Tensor, at::Tensor> norm(const Norm& n, const at::Tensor& x, const at::Tensor& cond, double eps) const;
  at::Tensor mlp(const GemmaLayer& l, const at::Tensor& x) const;
  // The attention's output projection (row-parallel) of heads o [b, s, heads_local d].
  at::Tensor out_proj(const GemmaLayer& l, const at::Tensor& o) const;
  // The FP8 recipe of one of l's GEMM kinds at x's rows (null: the training dtype).
  const lf::ops::Fp8Recipe* fp8_for(const GemmaLayer& l, lf::ops::Fp8Gemm kind, const at::Tensor& x) const;
  // q [b, s, heads_local, d], k/v [b, s, kv, d] of a stream after its input norm, RoPE applied
  // (kv_only: q undefined).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv(const GemmaLayer& l, const PiGemmaConfig& c, const at::Tensor& x,
                                                     const at::Tensor& cos, const at::Tensor& sin,
                                                     bool kv_only = false) const;
  // The joint forward of prefix and suffix through every layer: the expert's final-normed suffix,
  // and with_prefix the prefix LM's final-normed prefix (else undefined).
  std::pair<at::Tensor, at::Tensor> joint_forward(const Prefix& p, const at::Tensor& suffix, const at::Tensor& cond,
                                                  bool with_prefix = false) const;
  // The flow-matching MSE (as losses) and, labels defined, the prefix LM's per-token cross entropy
  // [b, L] from the same joint forward (else undefined).
  std::pair<at::Tensor, at::Tensor> train_losses(const Pi05Inputs& in, const at::Tensor& actions,
                                                 const at::Tensor& noise, const at::Tensor& time,
                                                 const at::Tensor& labels) const;
  // Per-token cross entropy [b, L] of the head (tied to the embedding) on final-normed prompt
  // outputs [b, L, width] against labels [b, L] (-100: 0).
  at::Tensor lm_head_losses(const at::Tensor& hidden, const at::Tensor& labels) const;
  bool prefix_lm() const { return config_.prefix_lm_loss_weight > 0; }
  // The batch's prompt_labels (an error naming the key when prefix_lm_loss_weight > 0 and it lacks them).
  const at::Tensor& prompt_labels(const Batch& batch) const;
  // The prefix alone (sampling): every layer's keys/values; with `hidden` the last layer runs
  // whole and its output (before the final norm) goes there.
  std::vector<KV> prefix_cache(const Prefix& p, at::Tensor* hidden = nullptr) const;
  // One denoising step over the cache: v_t [b, chunk, max_action_dim] fp32.
  at::Tensor denoise_step(const Prefix& p, const std::vector<KV>& cache, const at::Tensor& x_t,
                          const at::Tensor& time) const;
  // One attention under an additive mask [b, 1, s, t] (built once per forward).
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) const;
  at::Tensor sample_time(const at::Tensor& sample_ids) const;

  const lf::backend::DeviceBackend& backend_;
  const lf::dist::ParallelContext* parallel_;
  lf::parallel::TensorParallel tp_;
  // Training: the linear layers' weight gradients go into the trainer's buffer (null: autograd).
  const GradientSink* sink_ = nullptr;
  const lf::ops::Fp8Policy* fp8_ = nullptr;  // set_fp8 (null: no FP8)
  Pi05Freeze freeze_;
  SiglipConfig vision_;
  PiGemmaConfig vlm_, expert_;
  Pi05Config config_;
  uint64_t seed_;
  int64_t step_ = 0;
  // Cameras and prompt tokens of the last batch stage_forward saw (flops_per_sample); 0: none yet.
  int64_t seen_cameras_ = 0, seen_prompt_ = 0;

  at::Tensor patch_w_, patch_b_, pos_emb_, post_ln_w_, post_ln_b_, proj_w_, proj_b_;
  std::vector<VisionLayer> vision_layers_;
  at::Tensor embed_;
  at::Tensor lm_norm_;  // the prefix LM's final (1 + w) RMSNorm weight
  std::vector<GemmaLayer> vlm_layers_, expert_layers_;
  Norm expert_final_;
  at::Tensor unit_weight_;  // fp32 ones [expert width]: the adaptive norms' RMSNorm weight (no gradient)
  at::Tensor action_in_w_, action_in_b_, action_out_w_, action_out_b_, time_in_w_, time_in_b_, time_out_w_,
      time_out_b_;
  std::vector<Parameter> params_, state_;
  std::vector<Parameter> vision_params_, vlm_params_, expert_params_;
};

// The parameter records of a pi05 model (LeRobot's names without the policy's "model." prefix;
// full shapes and TP shardings at `tp` ranks: keys/values whose head count tp does not divide are
// replicated), in the model's order, nothing allocated; `state` the records of
// the tensors kept as model state (the prefix LM's final norm and its last layer's query, output
// and MLP weights, which pi0.5 never reads, unless config.prefix_lm_loss_weight > 0 trains them).
struct Pi05Record {
  std::string name;
  std::vector<int64_t> shape;
  lf::parallel::Sharding sharding;
  bool state = false;
};
std::vector<Pi05Record> pi05_parameter_records(const SiglipConfig& vision, const PiGemmaConfig& vlm,
                                               const PiGemmaConfig& expert, const Pi05Config& config, int tp = 1);

void register_pi05(Registry& r);

}  // namespace lf::models

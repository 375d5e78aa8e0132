// The `groot` composite: a GR00T-style vision-language-action policy (NVIDIA's GR00T N1.7 as
// LeRobot 0.6 implements it in lerobot.policies.groot.groot_n1_7, the same function and parameter
// names).
//
//   backbone : a Qwen3-VL (composites/qwen3_vl.h) cut after `select_layer` decoder layers; its
//              features are the last kept layer's output before any final norm, [b, s, width]
//   features : vlln (LayerNorm) -> vl_self_attention (LayerNorm transformer blocks)
//   state    : state_encoder, a two-layer MLP with one weight set per embodiment (embodiment_id)
//   actions  : action_encoder(x_t, t) (per-embodiment linears, sine-cosine time) + position table
//   DiT      : blocks over [state token, action tokens] with AdaLN on the discretised time;
//              even blocks cross-attend the features (AlternateVLDiT: alternately the text and
//              the image tokens), odd blocks self-attend (interleave_self_attention)
//   output   : action_decoder (per-embodiment MLP) on the action tokens = the velocity
//
// Training: t = (1 - Beta(1.5, 1)) x 0.999, x_t = (1 - t) noise + t actions, target
// actions - noise, the time given to the networks as floor(t x 1000); loss = sum of the masked
// squared error / (number of unmasked elements). Sampling: Euler from t = 0 to 1 in
// num_inference_timesteps steps. docs/vla.md "The GR00T policy".
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/core/config/node.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/models/composites/qwen3_vl.h"
#include "loongforge/models/model.h"

namespace lf::models {

// GR00T N1.7's action-head fields (GR00TN17Config), diffusion_model_cfg / vl_self_attention_cfg
// flattened into dit_* / vl_*.
struct GrootConfig {
  int64_t select_layer = 16;  // backbone decoder layers kept (its features are the last one's output)
  int64_t hidden_size = 1024;
  int64_t input_embedding_dim = 1536;
  int64_t max_state_dim = 132;
  int64_t max_action_dim = 132;
  int64_t action_horizon = 40;
  int64_t state_history_length = 1;
  int64_t max_num_embodiments = 32;
  int64_t max_seq_len = 1024;
  bool add_pos_embed = true;
  bool use_vlln = true;
  bool use_alternate_vl_dit = true;
  int64_t attend_text_every_n_blocks = 2;
  int64_t dit_num_layers = 32;
  int64_t dit_num_attention_heads = 32;
  int64_t dit_attention_head_dim = 48;
  int64_t dit_output_dim = 1024;
  bool dit_interleave_self_attention = true;
  double dit_dropout = 0.2;
  bool dit_final_dropout = true;
  int64_t vl_num_layers = 4;
  int64_t vl_num_attention_heads = 32;
  int64_t vl_attention_head_dim = 64;
  double vl_dropout = 0.2;
  bool vl_final_dropout = true;
  int64_t num_inference_timesteps = 4;
  int64_t num_timestep_buckets = 1000;
  double noise_beta_alpha = 1.5;
  double noise_beta_beta = 1.0;
  double noise_s = 0.999;
  double state_dropout_prob = 0.2;
  int64_t action_dim = 132;  // the robot's action dims (<= max_action_dim) the loss covers in VLA stores
  int64_t image_size = 32;   // the square images of the data (VLA stores, --mock-data)
  // --mock-data: text tokens per sample.
  int64_t mock_tokens = 8;

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("select_layer", select_layer, "Backbone decoder layers kept; the features are the last one's output", Min{1});
    v("hidden_size", hidden_size, "Width of the state encoder's and action decoder's hidden layer", Min{1});
    v("input_embedding_dim", input_embedding_dim, "Width of the state/action tokens (= dit heads x head dim)", Min{1});
    v("max_state_dim", max_state_dim, "States are zero-padded to this width", Min{1});
    v("max_action_dim", max_action_dim, "Actions are zero-padded to this width", Min{1});
    v("action_horizon", action_horizon, "Actions predicted per chunk", Min{1});
    v("state_history_length", state_history_length, "States per sample (the encoder reads them concatenated)",
      Min{1});
    v("max_num_embodiments", max_num_embodiments, "Weight sets of the per-embodiment encoders and decoder", Min{1});
    v("max_seq_len", max_seq_len, "Rows of the action position table", Min{1});
    v("add_pos_embed", add_pos_embed, "Add a learned position table to the action tokens");
    v("use_vlln", use_vlln, "LayerNorm on the backbone features");
    v("use_alternate_vl_dit", use_alternate_vl_dit,
      "Cross-attention blocks alternate between the text and the image tokens (GR00T N1.7); false: all tokens");
    v("attend_text_every_n_blocks", attend_text_every_n_blocks,
      "AlternateVLDiT: cross-attention block i reads the text when i % (2 n) == 0, else the image", Min{1});
    v("dit_num_layers", dit_num_layers, "DiT blocks", Min{1});
    v("dit_num_attention_heads", dit_num_attention_heads, "DiT attention heads", Min{1});
    v("dit_attention_head_dim", dit_attention_head_dim, "DiT channels per head", Min{1});
    v("dit_output_dim", dit_output_dim, "DiT output width (= hidden_size: the action decoder reads it)", Min{1});
    v("dit_interleave_self_attention", dit_interleave_self_attention,
      "Odd DiT blocks self-attend; false: every block cross-attends");
    v("dit_dropout", dit_dropout, "Dropout of the DiT's attention and MLP outputs (training only)", Min{0}, Max{1});
    v("dit_final_dropout", dit_final_dropout, "Also drop the attention output and the MLP's output");
    v("vl_num_layers", vl_num_layers, "Self-attention blocks on the backbone features (0: none)", Min{0});
    v("vl_num_attention_heads", vl_num_attention_heads, "Their heads (heads x head dim = the backbone width)", Min{1});
    v("vl_attention_head_dim", vl_attention_head_dim, "Their channels per head", Min{1});
    v("vl_dropout", vl_dropout, "Their dropout (training only)", Min{0}, Max{1});
    v("vl_final_dropout", vl_final_dropout, "Also drop their attention and MLP outputs");
    v("num_inference_timesteps", num_inference_timesteps, "Euler steps of sampling", Min{1});
    v("num_timestep_buckets", num_timestep_buckets, "The time reaches the networks as floor(t x buckets)", Min{1});
    v("noise_beta_alpha", noise_beta_alpha, "Training time t = (1 - Beta(alpha, beta)) x noise_s", Min{0});
    v("noise_beta_beta", noise_beta_beta, "See noise_beta_alpha", Min{0});
    v("noise_s", noise_s, "See noise_beta_alpha", Min{0}, Max{1});
    v("state_dropout_prob", state_dropout_prob, "Probability a sample's state token is zeroed (training only)",
      Min{0}, Max{1});
    v("action_dim", action_dim,
      "The robot's action dims (<= max_action_dim): the loss covers these on VLA stores and --mock-data", Min{1});
    v("image_size", image_size,
      "Side in pixels of the data's square images (a multiple of patch_size x spatial_merge_size)", Min{1});
    v("mock_tokens", mock_tokens, "--mock-data: text tokens per sample", Min{1});
  }
  int64_t dit_dim() const { return dit_num_attention_heads * dit_attention_head_dim; }
  int64_t vl_dim() const { return vl_num_attention_heads * vl_attention_head_dim; }
  // Every shape rule between these fields and the backbone's width; errors name prefix + key.
  void validate(int64_t backbone_width, int64_t backbone_layers, const std::string& prefix,
                lf::config::ErrorList& errors) const;
};

// The composite's own fields in YAML: the action head's and the backbone's placeholder token ids.
struct GrootOwnConfig {
  GrootConfig head;
  Qwen3VlConfig ids;

  template <class V>
  void visit(V& v) {
    head.visit(v);
    ids.visit(v);
  }
};

// The backbone: Qwen3-VL's foundation (cut to select_layer layers), vision tower and token ids.
struct GrootBackbone {
  DecoderConfig foundation;
  Qwen3VisionConfig vision;
  Qwen3VlConfig ids;
};

// One batch as GR00TN17.forward takes it after LeRobot's processor.
struct GrootInputs {
  at::Tensor input_ids;       // [b, s] int64 (image placeholders among the text)
  at::Tensor attention_mask;  // [b, s]: must be all ones (prompts of one length; see docs/vla.md)
  at::Tensor pixel_values;    // [patches, C T P P] the batch's images, Qwen3-VL patch rows
  at::Tensor image_grid_thw;  // [images, 3] int64
  at::Tensor state;           // [b, state_history_length, max_state_dim]
  at::Tensor embodiment_id;   // [b] int64 < max_num_embodiments
};

// Which parts train (GR00T's tune_visual, tune_llm; the action head always trains).
struct GrootFreeze {
  bool vision_encoder = true, foundation = true;
};

class Groot : public Model {
 public:
  // Parameter groups: vision_encoder (the backbone's tower), foundation (its decoder layers and
  // token embedding), action_head, model_state (the backbone's final norm and LM head, never read).
  Groot(const GrootBackbone& backbone, const GrootConfig& config, const lf::backend::DeviceBackend& backend,
        uint64_t seed, at::ScalarType dtype, const lf::dist::ParallelContext* parallel, GrootFreeze freeze = {});
  ~Groot() override;

  const std::string& type() const override;
  std::vector<ParameterGroup> parameter_groups() const override;
  std::map<std::string, double> loss_counts(const Batch& batch) const override;
  StageOutput stage_forward(const Batch& batch, const TensorMap& input, int64_t chunk, Pass pass) override;
  std::vector<std::string> eval_metrics() const override { return {kLoss}; }
  std::vector<std::string> batch_fields() const override;
  double flops_per_sample(int64_t seq_length) const override;
  void set_training(bool training) override { training_ = training; }
  // FP8 (--fp8-format): the action head's transformer blocks (the VL self-attention's, then the
  // DiT's; the first/last layers' flags count them in that order) run q/k/v, the output projection
  // and the feed-forward's two linears under the policy (kinds qkv, proj, fc1, fc2; a cross
  // attention's k/v at the backbone features' rows). The backbone (frozen in GR00T's recipe), the
  // embodiment-specific MLPs and the AdaLayerNorm / timestep linears stay in the training dtype.
  bool set_fp8(const lf::ops::Fp8Policy* fp8) override;
  void end_step(const at::Tensor&) override {
    ++step_;
    dropout_calls_ = 0;  // the dropout streams restart each step (keyed by the step): exact resume
  }
  void resume_at(int64_t iteration) override {
    step_ = iteration;
    dropout_calls_ = 0;
  }

  // GR00TN17ActionHead.forward's action_loss: (pred - (actions - noise))^2 x action_mask,
  // [b, horizon, max_action_dim] fp32, for actions / action_mask / noise of that shape and time t
  // [b] in [0, 1) (continuous; discretised inside as GR00T does). The loss is its sum over
  // action_mask's sum (+ 1e-6).
  at::Tensor losses(const GrootInputs& in, const at::Tensor& actions, const at::Tensor& action_mask,
                    const at::Tensor& noise, const at::Tensor& time) const;
  // GR00TN17.get_action: Euler-integrated actions [b, horizon, max_action_dim] fp32 from noise
  // (never with dropout, as GR00T samples in eval mode).
  at::Tensor sample_actions(const GrootInputs& in, const at::Tensor& noise, int64_t steps = 0) const;

  // Every tensor by GR00T's names (NVIDIA's checkpoint layout: backbone.model.*, action_head.*),
  // full; an lf::Error naming `source` and the tensor when one is missing, has another shape, or
  // the model has no such tensor.
  void load_full(const std::map<std::string, at::Tensor>& full, const std::string& source);
  // The batch (trainer fields) as the model's inputs: GR00T's own fields, or a VLA store's (images,
  // prompt_tokens, state: vla_inputs).
  GrootInputs inputs_of(const Batch& batch) const;
  // A VLA store's sample (the pi05 batch layout) as GR00T's inputs: images [b, cams, 3, S, S] in
  // [-1, 1] become Qwen3-VL patch rows (mean = std = 0.5: the same values), each camera's
  // placeholders in front of the prompt's tokens (pads included: every prompt has the store's
  // length), state [b, history, dims] zero-padded to max_state_dim, embodiment 0. Errors name
  // what does not fit (image side, a prompt id at a placeholder id, state width).
  GrootInputs vla_inputs(const at::Tensor& images, const at::Tensor& prompt_tokens, const at::Tensor& state) const;
  // action_mask of a batch: its own, or the first action_dim of max_action_dim dims.
  at::Tensor action_mask_of(const Batch& batch) const;
  // Every parameter from full tensors by LoongForge name (a groot checkpoint's); an lf::Error naming
  // `source` and the tensor when one is missing or has another shape.
  void load_checkpoint_tensors(const std::map<std::string, at::Tensor>& full, const std::string& source);
  const GrootConfig& config() const { return config_; }
  const Qwen3Vl& backbone() const { return *backbone_; }
  static constexpr const char* kLoss = "flow matching loss";

 private:
  struct Attn {
    at::Tensor q, q_b, k, k_b, v, v_b, o, o_b;
  };
  struct Block {
    at::Tensor ada_w, ada_b;      // DiT: AdaLayerNorm's linear [2 dim, dim]
    at::Tensor n1_w, n1_b;        // VL self-attention: LayerNorm 1
    at::Tensor n3_w, n3_b;        // VL self-attention: LayerNorm 3 (DiT: no affine)
    Attn attn;
    at::Tensor ff1, ff1_b, ff2, ff2_b;
    bool cross = false;
    bool fp8 = false;  // set_fp8: this block's linears follow the policy
  };
  struct PerEmbodiment {
    at::Tensor w, b;  // [E, in, out], [E, out]
  };
  struct Features {
    at::Tensor embs;                   // [b, s, width] after vlln and the VL self-attention
    at::Tensor text_mask, image_mask;  // [b, s] bool
    at::Tensor state;                  // [b, 1, input_embedding_dim]
  };

  Features encode(const GrootInputs& in) const;
  at::Tensor linear(const PerEmbodiment& l, const at::Tensor& x, const at::Tensor& ids) const;
  at::Tensor block(const Block& blk, const at::Tensor& x, const at::Tensor& context, const at::Tensor& mask,
                   const at::Tensor& temb, int64_t heads, double dropout, bool final_dropout) const;
  // The velocity [b, horizon, max_action_dim] fp32 of x_t at discretised times t [b] (int64).
  at::Tensor velocity(const Features& f, const at::Tensor& x_t, const at::Tensor& t, const at::Tensor& ids) const;
  at::Tensor drop(const at::Tensor& x, double p) const;
  at::Tensor sample_time(const at::Tensor& sample_ids) const;

  const lf::backend::DeviceBackend& backend_;
  const lf::dist::ParallelContext* parallel_;
  const lf::ops::Fp8Policy* fp8_ = nullptr;  // set_fp8 (null: no FP8)
  GrootBackbone backbone_config_;
  GrootConfig config_;
  uint64_t seed_;
  int64_t step_ = 0;
  mutable bool training_ = true;  // sample_actions turns it off for its call (no dropout when sampling)
  mutable uint64_t dropout_calls_ = 0;
  std::unique_ptr<Qwen3Vl> backbone_;

  at::Tensor vlln_w_, vlln_b_, pos_emb_, t1_w_, t1_b_, t2_w_, t2_b_, out1_w_, out1_b_, out2_w_, out2_b_;
  std::vector<Block> vl_blocks_, dit_blocks_;
  PerEmbodiment state1_, state2_, act1_, act2_, act3_, dec1_, dec2_;
  std::vector<Parameter> head_params_;
  std::vector<std::pair<std::string, at::Tensor>> head_named_;  // GR00T name -> tensor
};

// The action head's parameter records (GR00T names under "action_head.", full shapes), in the
// model's order, nothing allocated.
struct GrootRecord {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<GrootRecord> groot_head_records(const GrootConfig& config, int64_t backbone_width);

void register_groot(Registry& r);


}  // namespace lf::models

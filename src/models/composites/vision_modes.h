// How a VLM's vision tower (TP 1) encodes a micro-batch's media under the job's layout; shared by
// the Qwen-VL composites. The tower's context (the plan's vision layout): its share axis cp the
// ranks that see the same micro-batch (a foundation TP x CP group of the first stage; with
// --enable-full-hetero-dp the TP x PP x CP ranks of one DP index, the first stage's first), its DP
// the foundation's. Modes:
//   plain                        every share rank encodes every medium; the TP replicas' gradients
//                                are scaled 1 / replicas (the trainer sums over the share axis);
//   --enable-encoder-hetero-dp   medium k is encoded by share rank k mod shares, the features
//                                all-gathered (variable sizes) and put back in media order;
//   --use-vit-dp-balance         the media of the DP group moved by cost before the tower, the
//                                features sent home after it (vision_balance.h);
//   --enable-full-hetero-dp      the whole step's media encoded in begin_step over every stage
//                                (vision_spread.h), the tower's backward in end_backward.
// The tower is a function of rows + grids of several media -> [features, width]; the width may pack
// several outputs side by side (Qwen3-VL: the merged features and its DeepStack rows).
// Internal to src/models/composites.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "loongforge/data/batch.h"
#include "loongforge/parallel/sharding.h"

namespace lf::dist {
class ParallelContext;
}

namespace lf::models {

struct SpreadEncoding;

struct VisionTower {
  std::function<at::Tensor(const at::Tensor& rows, const at::Tensor& grids)> encode;
  // The tower's parameters: a rank that encodes no medium while others do ties an empty [0, width]
  // block to them (zero gradients, not none), so that its backward joins the exchanges.
  const std::vector<lf::parallel::Parameter>* params = nullptr;
  int64_t width = 0;                // the encode function's output width
  at::TensorOptions pixel_options;  // the tower's dtype and device
  int64_t patch_dim = 0;
  int64_t merge = 2;  // spatial_merge_size: t h w / merge^2 features per medium
};

class VisionModes {
 public:
  // context: the tower's (null: one process); foundation_cp: the foundation's CP size (its CP ranks
  // each backpropagate their tokens' part, which the share-axis sum adds up unscaled).
  VisionModes(const lf::dist::ParallelContext* context, int64_t foundation_cp, VisionTower tower);
  ~VisionModes();

  void set_encoder_data_parallel(bool on) { encoder_data_parallel_ = on; }
  void set_balance(bool on) { balance_ = on; }
  void set_full_hetero_dp(int first_stage_ranks) { spread_first_stage_ranks_ = first_stage_ranks; }
  bool full_hetero_dp() const { return spread_first_stage_ranks_ > 0; }

  // One micro-batch's media: pixels [patches, patch_dim] (images then videos; undefined: none),
  // grids [n, 3] CPU int64; key: the micro-batch's tokens (found among the step's under
  // --enable-full-hetero-dp). Returns the features [sum features, width] in media order; with no
  // media, undefined, or under --use-vit-dp-balance a [0, width] tensor the caller must tie into its
  // output (x + f.sum() * 0) so that the exchange's backward runs on this rank too.
  at::Tensor encode(const at::Tensor& key, const at::Tensor& pixels, const at::Tensor& grids) const;

  // --enable-full-hetero-dp (a no-op otherwise): the step's micro-batches; `fields` the (pixel rows,
  // grid) field pairs of each medium kind in the order encode() takes them (images, then videos);
  // the keys are the micro-batches' tokens.
  void begin_step(const std::vector<lf::data::Batch>& micro_batches,
                  const std::vector<std::pair<std::string, std::string>>& fields);
  // scale: 1 / the foundation's TP size.
  void end_backward(double scale);

 private:
  at::Tensor empty_features() const;  // the tied [0, width] block

  const lf::dist::ParallelContext* context_;
  int64_t foundation_cp_;
  VisionTower tower_;
  bool encoder_data_parallel_ = false, balance_ = false;
  int spread_first_stage_ranks_ = 0;
  mutable bool balance_reported_ = false;
  bool spread_reported_ = false;
  std::unique_ptr<SpreadEncoding> spread_;
  std::map<const void*, size_t> spread_micro_batch_;
};

}  // namespace lf::models

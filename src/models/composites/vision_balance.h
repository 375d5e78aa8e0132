// --use-vit-dp-balance: a vision tower's media spread over its data-parallel group by cost before
// the tower runs, and the features sent home after it (LoongForge's ViT DP balancing). The
// placement is lf::data::plan_image_balance (cost len^2 per medium, len its patch count); every
// rank of the group computes it from the all-gathered grids, so all agree. Differentiable: the
// features' gradients travel back to the rank that encoded them, whose tower backward adds them
// to its parameters' gradients; the DP reduction then sums the same terms as without balancing.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

#include "loongforge/backend/communicator.h"

namespace lf::models {

struct VisionBalanceArgs {
  // This rank's media: patch rows [sum t*h*w, patch_dim] already in the tower's dtype and device
  // (undefined or empty when the rank has none) and their grids [n, 3] (CPU int64, may be undefined).
  at::Tensor pixels, grids;
  at::TensorOptions pixel_options;  // dtype and device of the rows (used when this rank has none)
  int64_t patch_dim = 0;
  int64_t merge = 2;  // spatial_merge_size: a medium of t*h*w patches gives t*h*w / merge^2 features
  // The tower on rows + grids (several media at once) -> [features, width].
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> encode;
  // A [0, width] tensor tied to the tower's parameters (zero gradients), for a rank that encodes
  // nothing: its backward must still take part in the exchange of gradients.
  std::function<at::Tensor()> empty_features;
};

struct VisionBalanceResult {
  // This rank's media's features [sum t*h*w / merge^2, width], in media order; [0, width] tied to
  // the exchange when this rank has no media but others moved theirs (add it to the output so its
  // backward runs); undefined when nothing was exchanged and this rank has no media.
  at::Tensor features;
  bool exchanged = false;  // the plan moved media (false: each rank encoded its own)
  std::string report;      // when exchanged: media, ranks, max/mean cost before and after, media moved
};

VisionBalanceResult encode_balanced(lf::backend::Communicator& dp, const VisionBalanceArgs& args);

}  // namespace lf::models

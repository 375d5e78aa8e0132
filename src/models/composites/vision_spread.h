// --enable-full-hetero-dp: a vision tower with a replica on every rank of a foundation DP group
// (its TP x PP x CP ranks, the tower's share group) encodes a whole training step's media before
// the pipeline schedule runs: the media of all micro-batches are scattered over the group by cost
// (longest first onto the least loaded rank, cost patches^2), each rank encodes its share in one
// tower call, and one uneven all-to-all sends every rank's features to the group's first-stage
// ranks, the only ones that splice them. Those ranks read them through a leaf tensor, so each
// micro-batch's backward stops there (the schedule never waits on ranks of other stages); after the
// step's last backward, every rank of the group runs the all-to-all's backward with the leaf's
// accumulated gradient, which sends each medium's gradient to the rank that encoded it and runs the
// tower's backward there (finish_spread_encoding). Internal to src/models/composites.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loongforge/backend/communicator.h"

namespace lf::models {

struct SpreadEncodingArgs {
  // Per micro-batch: its media's patch rows [sum t*h*w, patch_dim] (images then videos, in order;
  // undefined when it has none) and grids [n, 3] (CPU int64). The same on every rank of the group.
  std::vector<at::Tensor> pixels, grids;
  at::TensorOptions pixel_options;  // the tower's dtype and device
  int64_t merge = 2;                // spatial_merge_size: t*h*w / merge^2 features per medium
  // Ranks 0 .. first_stage_ranks - 1 of the group are the first pipeline stage's.
  int first_stage_ranks = 1;
  // The tower on rows + grids of several media -> [features, width].
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> encode;
  // A [0, width] tensor tied to the tower's parameters, for a rank given no medium.
  std::function<at::Tensor()> empty_features;
};

struct SpreadEncoding {
  bool active = false;  // the step had media
  at::Tensor received;  // the all-to-all's output: every medium's features on a first-stage rank, [0, width] elsewhere
  at::Tensor leaf;      // first-stage ranks: `received` detached (requires grad when the tower trains)
  // First-stage ranks: per micro-batch, its media's (row in leaf, rows), in media order.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> places;
  std::string report;   // media, ranks, the largest and mean rank cost

  // Micro-batch m's features [sum of its media's features, width] (first-stage ranks), read
  // through the leaf.
  at::Tensor features(size_t m) const;
};

// Collective over `group` (the tower's share group).
SpreadEncoding spread_encoding(lf::backend::Communicator& group, const SpreadEncodingArgs& args);
// Collective: the tower's backward for the step. scale multiplies the leaf's gradient (1 / the
// foundation's TP size: its TP ranks each hold the same whole gradient); a no-op when the step had
// no media or the tower does not train.
void finish_spread_encoding(SpreadEncoding& s, double scale);

}  // namespace lf::models

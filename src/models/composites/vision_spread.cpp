// --enable-full-hetero-dp (vision_spread.h).
#include "vision_spread.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <numeric>

#include "loongforge/core/error.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {

at::Tensor SpreadEncoding::features(size_t m) const {
  LF_CHECK(m < places.size(), "--enable-full-hetero-dp: micro-batch ", m, " of a step of ", places.size());
  std::vector<at::Tensor> parts;
  for (const auto& [row, rows] : places[m]) parts.push_back(leaf.narrow(0, row, rows));
  return parts.size() == 1 ? parts[0] : at::cat(parts);
}

SpreadEncoding spread_encoding(lf::backend::Communicator& group, const SpreadEncodingArgs& a) {
  const int ranks = group.size(), me = group.rank();
  LF_CHECK(a.pixels.size() == a.grids.size(), "--enable-full-hetero-dp: ", a.pixels.size(), " pixel blocks for ",
           a.grids.size(), " grid blocks");
  LF_CHECK(a.first_stage_ranks >= 1 && a.first_stage_ranks <= ranks, "--enable-full-hetero-dp: ",
           a.first_stage_ranks, " first-stage ranks in a group of ", ranks);
  // Every medium of the step: (micro-batch, index, first patch row, patches, grid row).
  struct Medium {
    size_t m;
    int64_t k, row, patches;
    at::Tensor grid;
  };
  std::vector<Medium> media;
  for (size_t m = 0; m < a.grids.size(); ++m) {
    if (!a.grids[m].defined()) continue;
    const at::Tensor g = a.grids[m].to(at::kCPU, at::kLong).contiguous();
    int64_t row = 0;
    for (int64_t k = 0; k < g.size(0); ++k) {
      const int64_t patches = g[k][0].item<int64_t>() * g[k][1].item<int64_t>() * g[k][2].item<int64_t>();
      media.push_back({m, k, row, patches, g.narrow(0, k, 1)});
      row += patches;
    }
    LF_CHECK(a.pixels[m].defined() && a.pixels[m].size(0) == row, "--enable-full-hetero-dp: micro-batch ", m,
             "'s grids make ", row, " patch rows, its pixels hold ",
             a.pixels[m].defined() ? a.pixels[m].size(0) : int64_t{0});
  }
  SpreadEncoding out;
  out.places.resize(a.grids.size());
  if (media.empty()) return out;
  out.active = true;
  // Longest first onto the least loaded rank (ties: the earlier medium, the lower rank): the same
  // placement on every rank.
  std::vector<size_t> order(media.size());
  std::iota(order.begin(), order.end(), size_t{0});
  const auto cost = [&](size_t i) { return static_cast<double>(media[i].patches) * static_cast<double>(media[i].patches); };
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return cost(x) > cost(y); });
  std::vector<int> owner(media.size(), 0);
  std::vector<double> load(static_cast<size_t>(ranks), 0.0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[size_t(r)] += cost(i);
  }
  // This rank's media in step order, encoded in one call.
  std::vector<at::Tensor> rows, grids;
  std::vector<int64_t> features_of(static_cast<size_t>(ranks), 0);  // each rank's feature rows
  const int64_t per_feature = a.merge * a.merge;
  for (size_t i = 0; i < media.size(); ++i) {
    features_of[size_t(owner[i])] += media[i].patches / per_feature;
    if (owner[i] != me) continue;
    rows.push_back(a.pixels[media[i].m].narrow(0, media[i].row, media[i].patches));
    grids.push_back(media[i].grid);
  }
  const at::Tensor mine =
      rows.empty() ? a.empty_features() : a.encode(at::cat(rows).to(a.pixel_options), at::cat(grids));
  // To every first-stage rank a copy of this rank's block; a first-stage rank receives every
  // rank's block, in rank order. Autograd sums the copies' gradients into `mine`.
  const bool first = me < a.first_stage_ranks;
  std::vector<int64_t> send(static_cast<size_t>(ranks), 0), recv(static_cast<size_t>(ranks), 0);
  std::vector<at::Tensor> copies;
  for (int r = 0; r < a.first_stage_ranks; ++r) {
    send[size_t(r)] = mine.size(0);
    copies.push_back(mine);
  }
  if (first)
    for (int r = 0; r < ranks; ++r) recv[size_t(r)] = features_of[size_t(r)];
  out.received = lf::parallel::all_to_all_rows(at::cat(copies), group, recv, send);
  double most = 0, total = 0;
  for (double l : load) most = std::max(most, l), total += l;
  out.report = lf::str(media.size(), " media over ", ranks, " ranks, max/mean cost ",
                       total > 0 ? most / (total / ranks) : 1.0);
  if (!first) return out;
  out.leaf = out.received.detach();
  if (out.received.requires_grad()) out.leaf.requires_grad_(true);
  // Where each medium's features sit: the blocks in rank order, each in step order.
  std::vector<int64_t> block_at(static_cast<size_t>(ranks) + 1, 0), within(static_cast<size_t>(ranks), 0);
  for (int r = 0; r < ranks; ++r) block_at[size_t(r) + 1] = block_at[size_t(r)] + features_of[size_t(r)];
  for (size_t i = 0; i < media.size(); ++i) {
    const int r = owner[i];
    const int64_t n = media[i].patches / per_feature;
    out.places[media[i].m].push_back({block_at[size_t(r)] + within[size_t(r)], n});
    within[size_t(r)] += n;
  }
  return out;
}

void finish_spread_encoding(SpreadEncoding& s, double scale) {
  if (!s.active || !s.received.requires_grad()) {
    s = SpreadEncoding();
    return;
  }
  at::Tensor grad;
  if (s.leaf.defined() && s.leaf.grad().defined())
    grad = s.leaf.grad() * scale;
  else
    grad = at::zeros_like(s.received);  // not a first-stage rank (or no micro-batch reached the leaf)
  s.received.backward(grad);
  s = SpreadEncoding();
}

}  // namespace lf::models

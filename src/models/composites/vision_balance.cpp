// --use-vit-dp-balance (vision_balance.h).
#include "vision_balance.h"

#include <ATen/Functions.h>

#include <array>
#include <vector>

#include "loongforge/core/error.h"
#include "loongforge/data/dp_balance.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {

VisionBalanceResult encode_balanced(lf::backend::Communicator& dp, const VisionBalanceArgs& a) {
  namespace comm = lf::parallel::comm;
  const int ranks = dp.size(), me = dp.rank();
  const int64_t n = a.grids.defined() ? a.grids.size(0) : 0;
  const auto index_options = at::TensorOptions().dtype(at::kLong).device(a.pixel_options.device());
  VisionBalanceResult out;
  // Every rank's media count, then every rank's grids (padded to the largest count).
  const at::Tensor counts = comm::all_gather(at::full({1}, n, index_options), dp, 0).cpu();
  std::vector<int64_t> count(static_cast<size_t>(ranks));
  int64_t most = 0, total = 0;
  for (int r = 0; r < ranks; ++r) {
    count[size_t(r)] = counts[r].item<int64_t>();
    most = std::max(most, count[size_t(r)]);
    total += count[size_t(r)];
  }
  if (total == 0) return out;
  at::Tensor padded = at::zeros({most, 3}, at::kLong);
  if (n > 0) padded.narrow(0, 0, n).copy_(a.grids.to(at::kCPU, at::kLong));
  const at::Tensor all = comm::all_gather(padded.to(a.pixel_options.device()), dp, 0).cpu().contiguous();
  const auto g = all.accessor<int64_t, 2>();
  std::vector<std::vector<int64_t>> patches(static_cast<size_t>(ranks));
  std::vector<std::vector<std::array<int64_t, 3>>> grid(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    for (int64_t k = 0; k < count[size_t(r)]; ++k) {
      const int64_t i = r * most + k;
      patches[size_t(r)].push_back(g[i][0] * g[i][1] * g[i][2]);
      grid[size_t(r)].push_back({g[i][0], g[i][1], g[i][2]});
    }
  const lf::data::ImageBalancePlan plan = lf::data::plan_image_balance(patches, ranks);
  if (plan.skipped) {  // every rank encodes its own media, no exchange (all ranks know it)
    if (n > 0) out.features = a.encode(a.pixels, a.grids);
    return out;
  }
  const int64_t per_feature = a.merge * a.merge;
  const auto& mine = patches[size_t(me)];
  std::vector<int64_t> row_at(static_cast<size_t>(n + 1), 0);
  for (int64_t k = 0; k < n; ++k) row_at[size_t(k + 1)] = row_at[size_t(k)] + mine[size_t(k)];
  // Pixels out: to encoder rank dst the media send[me][dst], in that order.
  std::vector<int64_t> send_rows(size_t(ranks), 0), recv_rows(size_t(ranks), 0);
  std::vector<at::Tensor> outgoing;
  for (int dst = 0; dst < ranks; ++dst)
    for (int64_t k : plan.send[size_t(me)][size_t(dst)]) {
      outgoing.push_back(a.pixels.narrow(0, row_at[size_t(k)], mine[size_t(k)]));
      send_rows[size_t(dst)] += mine[size_t(k)];
    }
  // In: from each src rank the media send[src][me], src in rank order.
  std::vector<int64_t> received_grids;
  int64_t received = 0;
  for (int src = 0; src < ranks; ++src)
    for (int64_t k : plan.send[size_t(src)][size_t(me)]) {
      recv_rows[size_t(src)] += patches[size_t(src)][size_t(k)];
      for (int64_t v : grid[size_t(src)][size_t(k)]) received_grids.push_back(v);
      ++received;
    }
  const at::Tensor send_buffer =
      outgoing.empty() ? at::empty({0, a.patch_dim}, a.pixel_options) : at::cat(outgoing).contiguous();
  const at::Tensor rows = comm::all_to_all_rows(send_buffer, dp, recv_rows, send_rows);
  const at::Tensor encoded =
      received > 0 ? a.encode(rows, at::tensor(received_grids, at::kLong).view({received, 3})) : a.empty_features();
  // Features home: the block received from src goes back to src; this rank gets its media's
  // features by encoder rank, each block in send[me][dst] order.
  std::vector<int64_t> back_send(size_t(ranks), 0), back_recv(size_t(ranks), 0), feature_at(size_t(n), 0);
  for (int r = 0; r < ranks; ++r) back_send[size_t(r)] = recv_rows[size_t(r)] / per_feature;
  int64_t offset = 0;
  for (int dst = 0; dst < ranks; ++dst)
    for (int64_t k : plan.send[size_t(me)][size_t(dst)]) {
      feature_at[size_t(k)] = offset;
      offset += mine[size_t(k)] / per_feature;
      back_recv[size_t(dst)] += mine[size_t(k)] / per_feature;
    }
  const at::Tensor home = lf::parallel::all_to_all_rows(encoded, dp, back_recv, back_send);
  if (n == 0) {
    out.features = home;  // [0, width], still in the graph
  } else {
    std::vector<at::Tensor> ordered;
    for (int64_t k = 0; k < n; ++k) ordered.push_back(home.narrow(0, feature_at[size_t(k)], mine[size_t(k)] / per_feature));
    out.features = at::cat(ordered);
  }
  out.exchanged = true;
  out.report = lf::str(total, " media over ", ranks, " ranks, max/mean cost ", plan.stats.naive_max_over_mean, " -> ",
                       plan.stats.balanced_max_over_mean, ", ", plan.stats.moved_samples, " encoded away from their rank");
  return out;
}

}  // namespace lf::models

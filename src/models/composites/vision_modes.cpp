// The vision tower's encoding modes (vision_modes.h).
#include "vision_modes.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/parallel/tensor/mappings.h"
#include "vision_balance.h"
#include "vision_spread.h"

namespace lf::models {

VisionModes::VisionModes(const lf::dist::ParallelContext* context, int64_t foundation_cp, VisionTower tower)
    : context_(context), foundation_cp_(foundation_cp), tower_(std::move(tower)) {}

VisionModes::~VisionModes() = default;

at::Tensor VisionModes::empty_features() const {
  LF_CHECK(tower_.params && !tower_.params->empty(), "vision modes: the tower's parameters are not set");
  at::Tensor tie = at::zeros({}, tower_.pixel_options);
  for (const auto& p : *tower_.params) tie = tie + p.tensor.sum() * 0.0;
  return at::zeros({0, tower_.width}, tie.options()) + tie;
}

at::Tensor VisionModes::encode(const at::Tensor& key, const at::Tensor& pixels, const at::Tensor& grids) const {
  const bool any = pixels.defined() && grids.defined() && grids.size(0) > 0;
  if (spread_) {  // --enable-full-hetero-dp: this step's micro-batch, encoded in begin_step
    const auto it = spread_micro_batch_.find(key.unsafeGetTensorImpl());
    if (it != spread_micro_batch_.end()) return any ? spread_->features(it->second) : at::Tensor();
  }
  const bool balance = balance_ && context_ && context_->dp_size() > 1;
  if (!any && !balance) return {};
  const int64_t shares = context_ ? context_->cp_size() : 1;
  const at::Tensor rows = any ? pixels.to(tower_.pixel_options) : at::Tensor();
  at::Tensor encoded;
  if (balance) {
    VisionBalanceArgs args;
    args.pixel_options = tower_.pixel_options;
    if (any) args.pixels = rows, args.grids = grids;
    args.patch_dim = tower_.patch_dim;
    args.merge = tower_.merge;
    args.encode = tower_.encode;
    args.empty_features = [this] { return empty_features(); };
    VisionBalanceResult r = encode_balanced(context_->dp(), args);
    if (r.exchanged && !balance_reported_) {
      balance_reported_ = true;
      if (context_->dp_rank() == 0 && context_->cp_rank() == 0)
        LF_INFO("--use-vit-dp-balance: first exchange: ", r.report);
    }
    if (!any) return r.features;  // [0, width] tied to the exchange, or undefined
    encoded = r.features;
  } else if (encoder_data_parallel_ && shares > 1) {
    // Medium k is encoded by share rank k mod shares; the gathered features come in rank order and
    // are put back in media order. Each medium's gradient reaches the tower once: no scaling.
    const int64_t me = context_->cp_rank(), media = grids.size(0), per_feature = tower_.merge * tower_.merge;
    const at::Tensor g = grids.to(at::kCPU, at::kLong).contiguous();
    std::vector<int64_t> row_at(static_cast<size_t>(media + 1), 0), feature_rows(static_cast<size_t>(media), 0);
    for (int64_t k = 0; k < media; ++k) {
      const int64_t patches = g[k][0].item<int64_t>() * g[k][1].item<int64_t>() * g[k][2].item<int64_t>();
      row_at[size_t(k + 1)] = row_at[size_t(k)] + patches;
      feature_rows[size_t(k)] = patches / per_feature;
    }
    std::vector<at::Tensor> my_rows, my_grids;
    for (int64_t k = me; k < media; k += shares) {
      my_rows.push_back(rows.narrow(0, row_at[size_t(k)], row_at[size_t(k + 1)] - row_at[size_t(k)]));
      my_grids.push_back(g.narrow(0, k, 1));
    }
    const at::Tensor mine = my_rows.empty() ? empty_features() : tower_.encode(at::cat(my_rows), at::cat(my_grids));
    const at::Tensor gathered = lf::parallel::gather_rows_from_shares(mine, context_->cp());
    std::vector<int64_t> block_at(static_cast<size_t>(shares + 1), 0);  // where each rank's block starts
    for (int64_t r = 0; r < shares; ++r) {
      int64_t n = 0;
      for (int64_t k = r; k < media; k += shares) n += feature_rows[size_t(k)];
      block_at[size_t(r + 1)] = block_at[size_t(r)] + n;
    }
    std::vector<int64_t> within(static_cast<size_t>(shares), 0);
    std::vector<at::Tensor> ordered;
    for (int64_t k = 0; k < media; ++k) {
      const int64_t r = k % shares;
      ordered.push_back(gathered.narrow(0, block_at[size_t(r)] + within[size_t(r)], feature_rows[size_t(k)]));
      within[size_t(r)] += feature_rows[size_t(k)];
    }
    return at::cat(ordered);
  } else {
    encoded = tower_.encode(rows, grids);
  }
  // Every rank of a foundation TP x CP group encodes the same media (balanced over DP or not). The
  // TP ranks receive the same whole gradient, the CP ranks each their tokens' part; the trainer sums
  // the tower's gradients over its share axis and DP, so each TP replica contributes 1 / tp.
  const int64_t replicas = shares / foundation_cp_;
  if (replicas > 1 && encoded.requires_grad())
    encoded.register_hook([replicas](const at::Tensor& grad) { return grad / static_cast<double>(replicas); });
  return encoded;
}

void VisionModes::begin_step(const std::vector<lf::data::Batch>& micro_batches,
                             const std::vector<std::pair<std::string, std::string>>& fields) {
  spread_.reset();
  spread_micro_batch_.clear();
  if (spread_first_stage_ranks_ == 0) return;
  LF_CHECK(context_ != nullptr, "--enable-full-hetero-dp: this rank holds no vision tower context");
  SpreadEncodingArgs a;
  std::vector<at::Tensor> keys;
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const auto& b = micro_batches[m];
    std::vector<at::Tensor> rows, grids;
    for (const auto& [rows_field, grid_field] : fields) {
      const at::Tensor* r = b.find(rows_field);
      if (!r) continue;
      const at::Tensor* g = b.find(grid_field);
      LF_CHECK(g && g->dim() == 2 && g->size(1) == 3, "micro-batch ", m, ": ", rows_field, " come with ", grid_field,
               " [num, 3]");
      rows.push_back(*r);
      grids.push_back(g->to(at::kCPU, at::kLong));
    }
    a.pixels.push_back(rows.empty() ? at::Tensor() : rows.size() == 1 ? rows[0] : at::cat(rows));
    a.grids.push_back(grids.empty() ? at::Tensor() : at::cat(grids));
    keys.push_back(b.at("tokens"));
  }
  a.pixel_options = tower_.pixel_options;
  a.merge = tower_.merge;
  a.first_stage_ranks = spread_first_stage_ranks_;
  a.encode = tower_.encode;
  a.empty_features = [this] { return empty_features(); };
  for (size_t m = 0; m < keys.size(); ++m) spread_micro_batch_[keys[m].unsafeGetTensorImpl()] = m;
  spread_ = std::make_unique<SpreadEncoding>(spread_encoding(context_->cp(), a));
  if (spread_->active && !spread_reported_) {
    spread_reported_ = true;
    if (context_->dp_rank() == 0 && context_->cp_rank() == 0)
      LF_INFO("--enable-full-hetero-dp: the first step's media: ", spread_->report);
  }
}

void VisionModes::end_backward(double scale) {
  if (!spread_) return;
  finish_spread_encoding(*spread_, scale);
  spread_.reset();
  spread_micro_batch_.clear();
}

}  // namespace lf::models

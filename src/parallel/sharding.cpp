#include "loongforge/parallel/sharding.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include "loongforge/core/error.h"

namespace lf::parallel {
namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
}  // namespace

void Sharding::check(const std::vector<int64_t>& full, int size, const std::string& what) const {
  LF_CHECK(size >= 1 && blocks >= 1 && outer >= 1, what, ": bad split (", blocks, " blocks over ", size, " ranks, ",
           outer, " parts)");
  if (outer > 1) {
    LF_CHECK(dim >= 1 && size % outer == 0 && !full.empty() && full[0] % outer == 0, what, ": shape ",
             shape_str(full), " does not cut into ", outer, " parts along dim 0 each split along dim ", dim,
             " over ", size, " / ", outer, " ranks",
             lf::hint("choose an expert-parallel size dividing the number of experts and a world that holds it"));
    return within_part().check(part_shape(full), size / static_cast<int>(outer), what);
  }
  if (dim < 0) return;
  LF_CHECK(dim < static_cast<int64_t>(full.size()), what, ": split dim ", dim, " of a tensor of shape ",
           shape_str(full));
  const int64_t n = full[static_cast<size_t>(dim)];
  LF_CHECK(n % (blocks * size) == 0, what, ": dim ", dim, " of shape ", shape_str(full), " does not split into ",
           blocks, " block(s) x ", size, " tensor-parallel ranks",
           lf::hint("choose a tensor-parallel size that divides the model's heads, groups, FFN and "
                    "(padded) vocabulary sizes"));
}

Sharding Sharding::within_part() const { return {dim, blocks, vocab, 1}; }

std::vector<int64_t> Sharding::part_shape(std::vector<int64_t> full) const {
  if (!full.empty()) full[0] /= outer;
  return full;
}

std::vector<int64_t> Sharding::shard_shape(std::vector<int64_t> s, int size) const {
  if (outer > 1) return within_part().shard_shape(part_shape(std::move(s)), size / static_cast<int>(outer));
  if (dim >= 0 && dim < static_cast<int64_t>(s.size())) s[static_cast<size_t>(dim)] /= size;
  return s;
}

std::vector<int64_t> Sharding::full_shape(std::vector<int64_t> s, int size) const {
  if (outer > 1) {
    s = within_part().full_shape(std::move(s), size / static_cast<int>(outer));
    if (!s.empty()) s[0] *= outer;
    return s;
  }
  if (dim >= 0 && dim < static_cast<int64_t>(s.size())) s[static_cast<size_t>(dim)] *= size;
  return s;
}

std::vector<int64_t> Sharding::offsets(const std::vector<int64_t>& full, int rank, int size) const {
  if (outer > 1) {
    const int inner = size / static_cast<int>(outer);
    auto o = within_part().offsets(part_shape(full), rank % inner, inner);
    o[0] += (rank / inner) * (full[0] / outer);
    return o;
  }
  std::vector<int64_t> o(full.size(), 0);
  if (dim >= 0 && dim < static_cast<int64_t>(full.size()))
    o[static_cast<size_t>(dim)] = rank * (full[static_cast<size_t>(dim)] / blocks / size);
  return o;
}

at::Tensor Sharding::shard(const at::Tensor& full, int rank, int size) const {
  if (outer > 1) {
    check(full.sizes().vec(), size, "sharding a tensor");
    const int inner = size / static_cast<int>(outer);
    const int64_t n = full.size(0) / outer;
    return within_part().shard(full.narrow(0, (rank / inner) * n, n), rank % inner, inner);
  }
  if (dim < 0 || size == 1) return full.contiguous();
  const int64_t d = dim;
  check(full.sizes().vec(), size, "sharding a tensor");
  auto part = [&](const at::Tensor& t) {
    const int64_t n = t.size(d) / size;
    return t.narrow(d, rank * n, n);
  };
  if (blocks == 1) return part(full).contiguous();
  std::vector<at::Tensor> pieces;
  for (const auto& block : full.chunk(blocks, d)) pieces.push_back(part(block));
  return at::cat(pieces, d).contiguous();
}

at::Tensor Sharding::unshard(const std::vector<at::Tensor>& shards) const {
  LF_CHECK(!shards.empty(), "unshard: no shards");
  if (outer > 1) {
    const int64_t n = static_cast<int64_t>(shards.size());
    LF_CHECK(n % outer == 0, "unshard: ", n, " shards do not form ", outer, " parts");
    const int64_t inner = n / outer;
    std::vector<at::Tensor> parts;
    for (int64_t p = 0; p < outer; ++p)
      parts.push_back(within_part().unshard({shards.begin() + p * inner, shards.begin() + (p + 1) * inner}));
    return at::cat(parts, 0);
  }
  if (dim < 0 || shards.size() == 1) return shards.front();
  if (blocks == 1) return at::cat(shards, dim);
  // Each shard is [block0_r; block1_r; ...]: regroup block by block.
  std::vector<std::vector<at::Tensor>> by_block(static_cast<size_t>(blocks));
  for (const auto& s : shards) {
    auto parts = s.chunk(blocks, dim);
    for (int64_t b = 0; b < blocks; ++b) by_block[static_cast<size_t>(b)].push_back(parts[static_cast<size_t>(b)]);
  }
  std::vector<at::Tensor> out;
  for (auto& b : by_block) out.push_back(at::cat(b, dim));
  return at::cat(out, dim);
}

at::Tensor Sharding::gather(const at::Tensor& shard, lf::backend::Communicator& tp) const {
  if (dim < 0 || tp.size() == 1) return shard;
  at::NoGradGuard no_grad;
  if (outer > 1) {  // every rank's shard whole, then regrouped
    at::Tensor local = shard.detach().contiguous().view({1, -1});
    at::Tensor out = at::empty({tp.size(), local.size(1)}, local.options());
    tp.all_gather(out, local);
    std::vector<at::Tensor> shards;
    for (int r = 0; r < tp.size(); ++r) shards.push_back(out[r].view(shard.sizes()));
    return unshard(shards).contiguous();
  }
  // all_gather concatenates along dim 0: bring the split dim there and back.
  at::Tensor local = shard.detach().movedim(dim, 0).contiguous();
  auto sizes = local.sizes().vec();
  sizes[0] *= tp.size();
  at::Tensor out = at::empty(sizes, local.options());
  tp.all_gather(out, local);
  at::Tensor cat = out.movedim(0, dim);
  if (blocks == 1) return cat.contiguous();
  return unshard(cat.chunk(tp.size(), dim)).contiguous();
}

}  // namespace lf::parallel

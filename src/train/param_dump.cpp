#include "loongforge/train/param_dump.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/parallel/sharding.h"

namespace lf::train {

std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters(
    const std::vector<lf::parallel::Parameter>& params, lf::backend::Communicator* tp) {
  at::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> full;
  for (const auto& p : params) {
    if (p.tied_copy) continue;  // the first pipeline stage's embedding (same values)
    at::Tensor t = p.is_split() ? p.sharding.gather(p.tensor, *tp) : p.tensor.detach();
    full.emplace_back(p.name, t.to(at::kCPU, at::kFloat).contiguous());
  }
  return full;
}

std::vector<std::pair<std::string, at::Tensor>> gather_pipeline_parameters(
    std::vector<std::pair<std::string, at::Tensor>> stage_params, const lf::dist::ParallelContext& ctx) {
  if (ctx.pp_size() == 1) return stage_params;
  auto& pp = ctx.pp();
  // Per tensor: [name length, dtype, ndim, dims...] then the name's bytes, then the data.
  constexpr int kCount = 310, kHeader = 311, kName = 312, kData = 313;
  constexpr int64_t kMaxDims = 8;
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  if (pp.rank() != 0) {
    at::Tensor count = at::full({1}, static_cast<int64_t>(stage_params.size()), i64);
    pp.send(count, 0, kCount);
    for (auto& [name, t] : stage_params) {
      LF_CHECK(t.dim() <= kMaxDims, "parameter ", name, " has ", t.dim(), " dimensions");
      std::vector<int64_t> h(3 + kMaxDims, 0);
      h[0] = static_cast<int64_t>(name.size());
      h[1] = static_cast<int64_t>(t.scalar_type());
      h[2] = t.dim();
      for (int64_t d = 0; d < t.dim(); ++d) h[static_cast<size_t>(3 + d)] = t.size(d);
      pp.send(at::tensor(h, i64), 0, kHeader);
      at::Tensor bytes = at::empty({static_cast<int64_t>(name.size())}, at::kByte);
      std::memcpy(bytes.data_ptr(), name.data(), name.size());
      pp.send(bytes, 0, kName);
      pp.send(t.contiguous(), 0, kData);
    }
    return {};
  }
  for (int k = 1; k < pp.size(); ++k) {
    at::Tensor count = at::empty({1}, i64);
    pp.recv(count, k, kCount);
    for (int64_t i = 0; i < count.item<int64_t>(); ++i) {
      at::Tensor h = at::empty({3 + kMaxDims}, i64);
      pp.recv(h, k, kHeader);
      const int64_t* v = h.data_ptr<int64_t>();
      at::Tensor bytes = at::empty({v[0]}, at::kByte);
      pp.recv(bytes, k, kName);
      std::vector<int64_t> sizes(v + 3, v + 3 + v[2]);
      at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(v[1])));
      pp.recv(t, k, kData);
      stage_params.emplace_back(std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(v[0])), t);
    }
  }
  return stage_params;
}

std::vector<std::pair<std::string, at::Tensor>> gather_full_groups(const std::vector<lf::models::ParameterGroup>& groups) {
  std::vector<std::pair<std::string, at::Tensor>> full;
  for (const auto& g : groups) {
    lf::backend::Communicator* tp = g.context && g.context->tp_size() > 1 ? &g.context->tp() : nullptr;
    auto part = gather_full_parameters(g.params, tp);
    full.insert(full.end(), part.begin(), part.end());
  }
  return full;
}

void dump_parameters(const std::string& path, const std::vector<lf::models::ParameterGroup>& groups,
                     const lf::dist::ParallelContext& ctx) {
  auto full = gather_full_groups(groups);
  if (ctx.tp_rank() != 0 || ctx.dp_rank() != 0 || ctx.cp_rank() != 0) return;
  const std::string file = ctx.pp_size() > 1 ? path + ".pp" + std::to_string(ctx.pp_rank()) : path;
  // safetensors: u64 little-endian header length, JSON header, raw little-endian data.
  std::ostringstream header;
  header << "{";
  int64_t offset = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    const auto& [name, t] = full[i];
    const int64_t bytes = t.numel() * 4;
    header << (i ? "," : "") << "\"" << name << "\":{\"dtype\":\"F32\",\"shape\":[";
    for (int64_t d = 0; d < t.dim(); ++d) header << (d ? "," : "") << t.size(d);
    header << "],\"data_offsets\":[" << offset << "," << offset + bytes << "]}";
    offset += bytes;
  }
  header << "}";
  std::string h = header.str();
  while (h.size() % 8) h += ' ';
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  LF_CHECK(out.good(), "cannot write the parameter dump ", file,
           lf::hint("check that LOONGFORGE_DUMP_PARAMS names a writable path"));
  const uint64_t n = h.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
  out.write(reinterpret_cast<const char*>(len), 8);
  out << h;
  for (const auto& [name, t] : full)
    out.write(static_cast<const char*>(t.data_ptr()), t.numel() * 4);
  LF_CHECK(out.good(), "writing the parameter dump ", file, " failed");
}

}  // namespace lf::train

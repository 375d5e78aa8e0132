#include "loongforge/train/param_dump.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <fstream>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/parallel/tensor/layers.h"

namespace lf::train {

std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters(
    const std::vector<lf::models::NamedParameter>& params, const lf::dist::ParallelContext& ctx) {
  at::NoGradGuard no_grad;
  const bool tp = ctx.tp_size() > 1;
  std::vector<std::pair<std::string, at::Tensor>> full;
  for (const auto& p : params) {
    if (p.tied_copy) continue;  // the first pipeline stage's embedding (same values)
    at::Tensor t = p.tensor.detach().to(at::kCPU, at::kFloat);
    if (tp && p.partition_dim >= 0) {
      // all_gather concatenates along dim 0: bring the partition dim there and back.
      at::Tensor local = p.tensor.detach().movedim(p.partition_dim, 0).contiguous();
      auto sizes = local.sizes().vec();
      sizes[0] *= ctx.tp_size();
      at::Tensor out = at::empty(sizes, local.options());
      ctx.tp().all_gather(out, local);
      t = out.movedim(0, p.partition_dim).to(at::kCPU, at::kFloat);
      if (p.partition_blocks > 1)  // ranks hold [gate_r; up_r] (models/decoder.h) -> [gate; up]
        t = lf::parallel::unshard_stacked(t.chunk(ctx.tp_size(), 0), p.partition_blocks);
    }
    full.emplace_back(p.name, t.contiguous());
  }
  return full;
}

void dump_parameters(const std::string& path, const std::vector<lf::models::NamedParameter>& params,
                     const lf::dist::ParallelContext& ctx) {
  const auto full = gather_full_parameters(params, ctx);
  if (ctx.tp_rank() != 0 || ctx.dp_rank() != 0) return;
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

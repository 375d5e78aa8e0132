#include "loongforge/data/latent_store.h"

#include <ATen/Functions.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"

namespace lf::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr const char* kFormat = "loongforge-latents";
constexpr const char* kIndex = "latents.json";

std::string shard_name(size_t k) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05zu.safetensors", k);
  return buf;
}

at::Tensor f32(const at::Tensor& t) { return t.detach().to(at::kCPU, at::kFloat).contiguous(); }
}  // namespace

LatentStoreWriter::LatentStoreWriter(std::string dir, std::string vae, std::string text_encoder, int64_t shard_bytes)
    : dir_(std::move(dir)), vae_(std::move(vae)), text_encoder_(std::move(text_encoder)), shard_bytes_(shard_bytes) {
  LF_CHECK(!fs::exists(fs::path(dir_) / kIndex), dir_, " already holds a latent store",
           lf::hint("write to a new directory (or remove the old store first)"));
  fs::create_directories(dir_);
}

LatentStoreWriter::~LatentStoreWriter() = default;

void LatentStoreWriter::add(const LatentSample& s) {
  LF_CHECK(!finished_, "latent store ", dir_, ": add() after finish()");
  LF_CHECK(s.latents.defined() && s.latents.dim() == 4, "latent store ", dir_, ": sample ", count_,
           " latents must be [channels, frames, height, width], got ",
           s.latents.defined() ? s.latents.sizes() : at::IntArrayRef{});
  LF_CHECK(s.text.defined() && s.text.dim() == 2, "latent store ", dir_, ": sample ", count_,
           " text embeddings must be [tokens, dim]");
  LF_CHECK(!s.image.defined() || s.image.dim() == 2, "latent store ", dir_, ": sample ", count_,
           " image embeddings must be [tokens, dim]");
  const int64_t image_dim = s.image.defined() ? s.image.size(1) : 0;
  if (count_ == 0) {
    info_.latent_channels = s.latents.size(0);
    info_.text_dim = s.text.size(1);
    info_.image_dim = image_dim;
  }
  LF_CHECK(s.latents.size(0) == info_.latent_channels && s.text.size(1) == info_.text_dim && image_dim == info_.image_dim,
           "latent store ", dir_, ": sample ", count_, " has ", s.latents.size(0), " latent channels, text width ",
           s.text.size(1), ", image width ", image_dim, "; the first sample had ", info_.latent_channels, ", ",
           info_.text_dim, ", ", info_.image_dim, lf::hint("a store holds one latent space and one text encoder's embeddings"));
  LatentSample copy{f32(s.latents), f32(s.text), s.image.defined() ? f32(s.image) : at::Tensor(), s.caption};
  pending_bytes_ += 4 * (copy.latents.numel() + copy.text.numel() + (copy.image.defined() ? copy.image.numel() : 0));
  pending_.emplace_back(count_++, std::move(copy));
  if (pending_bytes_ >= shard_bytes_) flush();
}

void LatentStoreWriter::flush() {
  if (pending_.empty()) return;
  lf::safetensors::Writer w;
  for (const auto& [i, s] : pending_) {
    const std::string k = std::to_string(i);
    w.add(k + ".latents", lf::safetensors::DType::F32, s.latents.sizes().vec(), s.latents.data_ptr());
    w.add(k + ".text", lf::safetensors::DType::F32, s.text.sizes().vec(), s.text.data_ptr());
    if (s.image.defined()) w.add(k + ".image", lf::safetensors::DType::F32, s.image.sizes().vec(), s.image.data_ptr());
    if (!s.caption.empty()) w.set_metadata(k + ".caption", s.caption);
  }
  const std::string file = shard_name(shards_.size());
  w.write((fs::path(dir_) / file).string());
  shards_.push_back({file, {pending_.front().first, static_cast<int64_t>(pending_.size())}});
  pending_.clear();
  pending_bytes_ = 0;
}

int64_t LatentStoreWriter::finish() {
  LF_CHECK(!finished_, "latent store ", dir_, ": finish() twice");
  LF_CHECK(count_ > 0, "latent store ", dir_, ": no samples", lf::hint("check the manifest"));
  flush();
  json shards = json::array();
  for (const auto& [file, range] : shards_) shards.push_back({{"file", file}, {"first", range.first}, {"count", range.second}});
  json index = {{"format", kFormat},          {"version", 1},
                {"samples", count_},          {"latent_channels", info_.latent_channels},
                {"text_dim", info_.text_dim}, {"image_dim", info_.image_dim},
                {"vae", vae_},                {"text_encoder", text_encoder_},
                {"shards", shards}};
  const fs::path tmp = fs::path(dir_) / (std::string(kIndex) + ".tmp");
  {
    std::ofstream out(tmp);
    out << index.dump(2) << "\n";
    LF_CHECK(out.good(), "cannot write ", tmp.string());
  }
  fs::rename(tmp, fs::path(dir_) / kIndex);  // the store exists once its index does
  finished_ = true;
  return count_;
}

struct LatentStore::Shard {
  Shard(std::string p, int64_t f, int64_t c)
      : path(std::move(p)), first(f), count(c), reader(lf::safetensors::Reader::open(path)) {}
  std::string path;
  int64_t first = 0, count = 0;
  lf::safetensors::Reader reader;
};

LatentStore::LatentStore(const std::string& dir) : dir_(dir) {
  const fs::path index = fs::path(dir) / kIndex;
  LF_CHECK(fs::exists(index), dir, " holds no latent store (no ", kIndex, ")",
           lf::hint("make one with loongforge-data diffusion --manifest FILE --out DIR (docs/data.md)"));
  json j;
  try {
    std::ifstream in(index);
    j = json::parse(in);
    LF_CHECK(j.value("format", "") == kFormat, index.string(), ": not a ", kFormat, " index");
    info_.samples = j.at("samples").get<int64_t>();
    info_.latent_channels = j.at("latent_channels").get<int64_t>();
    info_.text_dim = j.at("text_dim").get<int64_t>();
    info_.image_dim = j.value("image_dim", int64_t{0});
    info_.vae = j.value("vae", "");
    info_.text_encoder = j.value("text_encoder", "");
    int64_t next = 0;
    for (const auto& s : j.at("shards")) {
      const std::string path = (fs::path(dir) / s.at("file").get<std::string>()).string();
      const int64_t first = s.at("first").get<int64_t>(), count = s.at("count").get<int64_t>();
      LF_CHECK(first == next && count > 0, index.string(), ": shard ", path, " does not continue the samples (first ",
               first, ", expected ", next, ")");
      next += count;
      LF_CHECK(fs::exists(path), index.string(), " names ", path, ", which does not exist",
               lf::hint("the store is incomplete: copy every shard-*.safetensors file"));
      shards_.push_back(std::make_unique<Shard>(path, first, count));
    }
    LF_CHECK(next == info_.samples, index.string(), ": the shards hold ", next, " samples, the index says ",
             info_.samples);
  } catch (const json::exception& e) {
    LF_FAIL(index.string(), " is malformed: ", e.what());
  }
}

LatentStore::~LatentStore() = default;

LatentSample LatentStore::get(int64_t i) const {
  LF_CHECK(i >= 0 && i < info_.samples, "latent store ", dir_, ": sample ", i, " outside [0, ", info_.samples, ")");
  size_t lo = 0, hi = shards_.size();
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    if (shards_[mid]->first <= i) lo = mid; else hi = mid;
  }
  const Shard& s = *shards_[lo];
  const std::string k = std::to_string(i);
  auto read = [&](const std::string& name, bool required) -> at::Tensor {
    const auto* t = s.reader.find(name);
    if (!t) {
      LF_CHECK(!required, s.path, " lacks tensor '", name, "'");
      return {};
    }
    LF_CHECK(t->dtype == lf::safetensors::DType::F32, s.path, ": tensor '", name, "' is not F32");
    at::Tensor out = at::empty(t->shape, at::kFloat);
    std::memcpy(out.data_ptr(), s.reader.data(*t), static_cast<size_t>(t->end - t->begin));
    return out;
  };
  LatentSample out;
  out.latents = read(k + ".latents", true);
  out.text = read(k + ".text", true);
  out.image = read(k + ".image", info_.image_dim > 0);
  const auto& meta = s.reader.metadata();
  if (auto it = meta.find(k + ".caption"); it != meta.end()) out.caption = it->second;
  return out;
}

}  // namespace lf::data

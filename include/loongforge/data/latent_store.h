// The store diffusion models train on: per sample its latents (what the VAE made of a clip or an
// image), its text embeddings (what the text encoder made of its caption) and optionally image
// embeddings (I2V), all computed once, offline, by `loongforge-data diffusion` (docs/data.md
// "Diffusion latents"), so the trainer runs neither the VAE nor the text encoder. Layout of DIR:
//   latents.json                  {"format": "loongforge-latents", "version": 1, "samples": N,
//                                  "latent_channels": C, "text_dim": D, "image_dim": I (0: none),
//                                  "vae": ..., "text_encoder": ..., "shards": [{"file", "first",
//                                  "count"}]}
//   shard-NNNNN.safetensors       tensors "<i>.latents" [C, F, H, W], "<i>.text" [L, D],
//                                 "<i>.image" [Li, I] (F32), caption in metadata "<i>.caption"
// Samples are read by memory-mapping their shard (random access, nothing parsed twice).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lf::data {

struct LatentSample {
  at::Tensor latents;  // [C, F, H, W] fp32
  at::Tensor text;     // [L, D] fp32
  at::Tensor image;    // [Li, I] fp32 or undefined
  std::string caption;
};

struct LatentStoreInfo {
  int64_t samples = 0, latent_channels = 0, text_dim = 0, image_dim = 0;
  std::string vae, text_encoder;  // how the store was made ("identity (pixels in [-1, 1])", "table ...")
};

class LatentStoreWriter {
 public:
  // Creates DIR (it must not hold a store already). vae / text_encoder: recorded in latents.json.
  LatentStoreWriter(std::string dir, std::string vae, std::string text_encoder,
                    int64_t shard_bytes = 256ll << 20);
  ~LatentStoreWriter();
  // Every sample's channels, text width and image width must equal the first one's.
  void add(const LatentSample& sample);
  // Writes the last shard and latents.json; returns the count.
  int64_t finish();

 private:
  void flush();
  std::string dir_, vae_, text_encoder_;
  int64_t shard_bytes_, pending_bytes_ = 0, count_ = 0, shard_first_ = 0;
  LatentStoreInfo info_;
  std::vector<std::pair<int64_t, LatentSample>> pending_;
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> shards_;
  bool finished_ = false;
};

class LatentStore {
 public:
  // Throws naming the file when latents.json or a shard is missing or malformed.
  explicit LatentStore(const std::string& dir);
  ~LatentStore();
  const LatentStoreInfo& info() const { return info_; }
  int64_t size() const { return info_.samples; }
  // Sample i (copies out of the mapping); throws naming the shard when a tensor is missing.
  LatentSample get(int64_t i) const;
  const std::string& dir() const { return dir_; }

 private:
  struct Shard;
  std::string dir_;
  LatentStoreInfo info_;
  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace lf::data

// loongforge-generate's sampling mode for a Wan diffusion transformer (a diffusers
// WanTransformer3DModel directory or a native flow_matching checkpoint, optionally its EMA
// weights): Euler flow-matching sampling with classifier-free guidance (models/flow_sampler.h,
// diffusers' FlowMatchEulerDiscreteScheduler) from seeded noise, conditioned on a prompt encoded
// by a word table (data/text_table.h, the small demos) or on text embeddings computed offline (a
// UMT5 encoder's, safetensors), optionally with a clean first latent frame kept fixed (Wan 2.2
// TI2V), or with Wan 2.2 A14B's two noise experts joined at a boundary timestep. Writes the latents; with 3 latent channels (the demo's pixel latent
// space, values in [-1, 1]) also every frame as PNG and each sample as an animated GIF.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lf::tools::generate {

struct SampleOptions {
  std::string load;
  int64_t iteration = -1;
  bool use_ema = false;
  std::string prompt, negative_prompt, text_table;  // --prompt with --text-table
  std::string text_embeddings;                      // or --text-embeddings (prompt [, negative_prompt])
  std::string latent_shape;                         // "F,H,W"
  std::string first_frame;                          // --first-frame: Wan 2.2 TI2V's clean first latent frame
  std::string load_low_noise;                       // Wan 2.2 A14B: the low-noise expert
  double boundary_ratio = -1;                       // its boundary (x num_train_timesteps); < 0: none
  double guidance_scale_low = -1;                   // its guidance; < 0: guidance_scale
  int64_t num_inference_steps = 50;
  double guidance_scale = 5.0;
  double sample_shift = 5.0;
  uint64_t seed = 1234;
  int64_t num_samples = 1;
  std::string output_dir;
  double fps = 8;
  bool bf16 = false;
};

// The initial noise of `seed`: torch.randn(shape, generator=torch.Generator().manual_seed(seed)),
// float32 on the CPU (LibTorch's CPU generator, the same stream Python's draws), as diffusers'
// pipelines draw their latents from a CPU generator.
at::Tensor sample_noise(const std::vector<int64_t>& shape, uint64_t seed);

// A latent frame of the pixel latent space [3, h, w] (values in [-1, 1]) -> 8-bit RGB rows, channels
// last: round((v + 1) / 2 x 255) clamped to [0, 255].
std::vector<uint8_t> latent_frame_to_rgb(const at::Tensor& frame);

// Loads the model, checks the flags (errors name the flag and the file), samples and writes
// output_dir/latents.safetensors (tensor latents [K, C, F, H, W], float32) and, with 3 channels,
// output_dir/sample_<k>/frame_<ff>.png and output_dir/sample_<k>.gif.
int run_sample(const SampleOptions& o);

}  // namespace lf::tools::generate

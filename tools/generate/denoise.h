// loongforge-generate --denoise-inputs: one forward of a Wan diffusion transformer (a diffusers
// WanTransformer3DModel directory or a native flow_matching checkpoint) on given tensors, as
// diffusers' WanTransformer3DModel takes them, its prediction written to a safetensors file. A
// model-only entry for parity and debugging; not a sampler.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "loongforge/models/foundations/wan.h"

namespace lf::tools::generate {

struct DenoiseOptions {
  std::string load;         // diffusers directory or checkpoint directory
  int64_t iteration = -1;   // of a checkpoint; -1: the latest
  std::string inputs;       // --denoise-inputs
  std::string prediction;   // --dump-prediction
  bool bf16 = false;
};

// What to do with a Wan model in loongforge-generate (the hint of the errors that meet one).
inline constexpr const char* kDenoiseHint =
    "a Wan diffusion transformer runs one forward: --denoise-inputs FILE.safetensors (hidden_states, timestep, "
    "encoder_hidden_states[, encoder_hidden_states_image]) --dump-prediction OUT.safetensors";

// True when `dir` is a diffusers WanTransformer3DModel directory or a checkpoint (its `iteration`)
// of a flow_matching model. Reads config.json / config.yaml only.
bool is_wan_model(const std::string& dir, int64_t iteration);

// A Wan model's configuration and full weights (float32), and what it is (for messages).
struct WanModel {
  lf::models::WanConfig config;
  std::map<std::string, at::Tensor> tensors;
  std::string what;
};
// Reads a diffusers WanTransformer3DModel directory or a flow_matching checkpoint (`iteration`; ema:
// the EMA weights it keeps). Errors name `mode` (the flag that wants a Wan model), the directory,
// and --use-ema where ema is asked of a diffusers directory or of a checkpoint that keeps none.
WanModel load_wan(const std::string& dir, int64_t iteration, const std::string& mode, bool ema);

// The DiT of `m` with its weights (m.tensors moved in and cleared), in eval mode, on `backend`
// (bf16: its parameters in bf16).
std::unique_ptr<lf::models::WanDit> build_wan_dit(WanModel& m, const lf::backend::DeviceBackend& backend, bool bf16);

// Loads the model, reads and checks the inputs (errors name the tensor and the file), runs the
// forward without gradients and writes tensor `prediction` (float32, [b, out_channels, f, h, w]).
int run_denoise(const DenoiseOptions& o);

}  // namespace lf::tools::generate

// Sampling from a flow-matching (rectified-flow) model such as the `wan` foundation: the Euler
// sampler of diffusers' FlowMatchEulerDiscreteScheduler with classifier-free guidance, as diffusers'
// Wan pipelines run it. The schedule is the scheduler's (num_train_timesteps N, shift S,
// set_timesteps(steps)) value for value: sigma_max and sigma_min are the training grid's shifted
// ends (1 and shift(1 / N), fp32), `steps` timesteps linspace(N sigma_max, N sigma_min) (fp64) whose
// sigmas t / N are shifted again (S s / (1 + (S - 1) s), fp64, then fp32), timesteps N sigma (fp32),
// and a final sigma 0. Step i: the model's velocity v at timestep timesteps[i] (v = v_uncond + g
// (v_cond - v_uncond); one conditional pass when g == 1 or no negative text is given), then
// x <- x + (sigma_{i+1} - sigma_i) v; with two noise experts (Wan 2.2 A14B) the low-noise one below
// the boundary timestep. Optional first-frame conditioning (Wan 2.2 TI2V, diffusers'
// expand_timesteps): a clean first latent frame replaces the first frame of the model's input at
// every step, its tokens at timestep 0, and of the result.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "loongforge/models/foundations/wan.h"

namespace lf::models {

struct FlowEulerSchedule {
  std::vector<float> sigmas;     // steps + 1, the last 0
  std::vector<float> timesteps;  // steps: num_train_timesteps x sigmas[i]
};

// FlowMatchEulerDiscreteScheduler(num_train_timesteps, shift).set_timesteps(steps)'s sigmas and
// timesteps (no dynamic shifting, no Karras / exponential / beta sigmas).
FlowEulerSchedule flow_euler_schedule(int64_t steps, double shift, int64_t num_train_timesteps = 1000);

// The model's velocity prediction for one input (WanInputs: latents [b, c, f, h, w], timestep [b] or
// [b, tokens], text [b, l, d], image).
using FlowVelocity = std::function<at::Tensor(const WanInputs&)>;

struct FlowSamplerOptions {
  int64_t num_inference_steps = 50;
  double guidance_scale = 5.0;
  double shift = 5.0;
  int64_t num_train_timesteps = 1000;
  // Wan 2.2 TI2V: the clean first latent frame [b, c, 1, h, w] (undefined: off). Needs a temporal
  // patch size of 1 (the first frame's tokens are the first patch frame's).
  at::Tensor first_frame;
  // Wan 2.2 A14B's two noise experts (diffusers' WanPipeline with boundary_ratio): at the steps whose
  // timestep is below boundary_timestep (boundary ratio x num_train_timesteps, compared in fp32) the
  // low-noise expert predicts, with guidance_scale_low (< 0: guidance_scale). Unset: one model.
  FlowVelocity low_noise;
  double boundary_timestep = 0;
  double guidance_scale_low = -1;
  // Called after every step (i from 0, of steps); for progress.
  std::function<void(int64_t i, int64_t steps)> on_step;
};

// Euler sampling from `noise` [b, c, f, h, w] (the latents at sigma 1): the latents at sigma 0,
// float32, on noise's device. text / negative_text [b, l, d] (negative undefined: no guidance,
// one pass per step); image: I2V image embeddings passed with both, or undefined. patch_size: the
// model's (t, h, w), for the per-token timesteps of first-frame conditioning.
at::Tensor flow_euler_sample(const FlowVelocity& model, const at::Tensor& noise, const at::Tensor& text,
                             const at::Tensor& negative_text, const at::Tensor& image,
                             const std::vector<int64_t>& patch_size, const FlowSamplerOptions& o);
// The same with a WanDit (no gradients; its prediction cast to float32).
at::Tensor flow_euler_sample(const WanDit& dit, const at::Tensor& noise, const at::Tensor& text,
                             const at::Tensor& negative_text, const at::Tensor& image, const FlowSamplerOptions& o);

}  // namespace lf::models

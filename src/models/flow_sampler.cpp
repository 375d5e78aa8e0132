#include "loongforge/models/flow_sampler.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include "loongforge/core/error.h"

namespace lf::models {

FlowEulerSchedule flow_euler_schedule(int64_t steps, double shift, int64_t num_train_timesteps) {
  LF_CHECK(steps >= 1, "flow_euler_schedule: steps must be >= 1, got ", steps);
  LF_CHECK(shift > 0, "flow_euler_schedule: shift must be > 0, got ", shift);
  LF_CHECK(num_train_timesteps >= 1, "flow_euler_schedule: num_train_timesteps must be >= 1");
  // The scheduler's training grid, in fp32 as torch computes it: its ends sigma_max (k = N) and
  // sigma_min (k = 1) of shift s / (1 + (shift - 1) s), s = k / N.
  const auto train_sigma = [&](int64_t k) {
    const float s = static_cast<float>(k) / static_cast<float>(num_train_timesteps);
    const float a = static_cast<float>(shift) * s;
    const float c = 1.0f + static_cast<float>(shift - 1.0) * s;
    return a / c;
  };
  const double n = static_cast<double>(num_train_timesteps);
  const double start = static_cast<double>(train_sigma(num_train_timesteps)) * n;
  const double stop = static_cast<double>(train_sigma(1)) * n;
  // numpy.linspace(start, stop, steps) (fp64), then sigmas t / N shifted again (fp64), to fp32.
  FlowEulerSchedule out;
  const double step = steps > 1 ? (stop - start) / static_cast<double>(steps - 1) : 0.0;
  for (int64_t i = 0; i < steps; ++i) {
    const double t = (steps > 1 && i == steps - 1) ? stop : static_cast<double>(i) * step + start;
    const double s = t / n;
    const float sigma = static_cast<float>(shift * s / (1.0 + (shift - 1.0) * s));
    out.sigmas.push_back(sigma);
    out.timesteps.push_back(sigma * static_cast<float>(num_train_timesteps));
  }
  out.sigmas.push_back(0.0f);
  return out;
}

at::Tensor flow_euler_sample(const FlowVelocity& model, const at::Tensor& noise, const at::Tensor& text,
                             const at::Tensor& negative_text, const at::Tensor& image,
                             const std::vector<int64_t>& patch_size, const FlowSamplerOptions& o) {
  LF_CHECK(noise.defined() && noise.dim() == 5, "flow_euler_sample: noise must be [b, c, f, h, w]");
  const int64_t b = noise.size(0);
  LF_CHECK(text.defined() && text.dim() == 3 && text.size(0) == b, "flow_euler_sample: text must be [", b,
           ", l, d], got ", text.defined() ? text.sizes() : at::IntArrayRef{});
  if (negative_text.defined())
    LF_CHECK(negative_text.dim() == 3 && negative_text.size(0) == b && negative_text.size(2) == text.size(2),
             "flow_euler_sample: negative text must be [", b, ", l, ", text.size(2), "], got ", negative_text.sizes());
  const auto sched = flow_euler_schedule(o.num_inference_steps, o.shift, o.num_train_timesteps);
  at::Tensor x = noise.to(at::kFloat).clone();
  const auto fopts = x.options();

  // First-frame conditioning: the model's input keeps the clean frame, its tokens at timestep 0.
  at::Tensor first, token_mask;
  if (o.first_frame.defined()) {
    LF_CHECK(patch_size.size() == 3 && patch_size[0] == 1,
             "flow_euler_sample: first-frame conditioning needs a temporal patch size of 1");
    first = o.first_frame.to(fopts);
    LF_CHECK(first.dim() == 5 && first.size(0) == b && first.size(1) == x.size(1) && first.size(2) == 1 &&
                 first.size(3) == x.size(3) && first.size(4) == x.size(4),
             "flow_euler_sample: the first frame must be [", b, ", ", x.size(1), ", 1, ", x.size(3), ", ", x.size(4),
             "], got ", first.sizes());
    const int64_t per_frame = (x.size(3) / patch_size[1]) * (x.size(4) / patch_size[2]);
    token_mask = at::ones({x.size(2) * per_frame}, fopts);
    token_mask.narrow(0, 0, per_frame).zero_();
  }
  at::NoGradGuard no_grad;
  for (int64_t i = 0; i < o.num_inference_steps; ++i) {
    const float t = sched.timesteps[static_cast<size_t>(i)];
    WanInputs in;
    in.image = image;
    if (first.defined()) {
      in.latents = at::cat({first, x.narrow(2, 1, x.size(2) - 1)}, 2);
      in.timestep = (token_mask * t).unsqueeze(0).expand({b, token_mask.size(0)});
    } else {
      in.latents = x;
      in.timestep = at::full({b}, t, fopts);
    }
    // diffusers: `t >= boundary_timestep` (a float32 tensor against a Python float, compared in fp32).
    const bool low = o.low_noise && !(t >= static_cast<float>(o.boundary_timestep));
    const FlowVelocity& current = low ? o.low_noise : model;
    const double g = low && o.guidance_scale_low >= 0 ? o.guidance_scale_low : o.guidance_scale;
    in.text = text;
    at::Tensor v = current(in).to(at::kFloat);
    if (negative_text.defined() && g != 1.0) {
      in.text = negative_text;
      const at::Tensor vu = current(in).to(at::kFloat);
      v = vu + g * (v - vu);
    }
    const float dt = sched.sigmas[static_cast<size_t>(i) + 1] - sched.sigmas[static_cast<size_t>(i)];
    x = x + dt * v;
    if (o.on_step) o.on_step(i, o.num_inference_steps);
  }
  if (first.defined()) x = at::cat({first, x.narrow(2, 1, x.size(2) - 1)}, 2);
  return x;
}

at::Tensor flow_euler_sample(const WanDit& dit, const at::Tensor& noise, const at::Tensor& text,
                             const at::Tensor& negative_text, const at::Tensor& image, const FlowSamplerOptions& o) {
  const auto& c = dit.config();
  LF_CHECK(noise.dim() == 5 && noise.size(1) == c.in_channels, "flow_euler_sample: noise must be [b, ", c.in_channels,
           " (in_channels), f, h, w], got ", noise.sizes());
  LF_CHECK(c.out_dim() == c.in_channels, "flow_euler_sample: the model predicts ", c.out_dim(),
           " channels for ", c.in_channels, " input channels; Euler sampling needs the same number");
  return flow_euler_sample([&](const WanInputs& in) { return dit.forward(in); }, noise, text, negative_text, image,
                           c.patch_size, o);
}

}  // namespace lf::models

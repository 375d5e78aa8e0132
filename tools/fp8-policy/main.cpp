// loongforge-fp8-policy: the adaptive FP8 benchmark. For a transformer layer's four linear layers
// (linear_qkv, linear_proj, linear_fc1, linear_fc2, as one TP rank holds them) it times forward +
// backward in the training dtype (lf::ops::linear) and in FP8 (lf::ops::fp8_linear, the recipe
// given) at each token count, on the device backend training would use (LOONGFORGE_DEVICE), and
// writes the policy file loongforge-train --fp8-policy reads: per GEMM kind, FP8 where it was the
// faster. The measurements go into the file and to stdout.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "loongforge/backend/fp8.h"
#include "loongforge/backend/fp8_delayed.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"

namespace {

struct Shape {
  lf::ops::Fp8Gemm gemm;
  int64_t in, out;
};

// Median milliseconds of `iters` calls of fn after `warmup` untimed ones.
template <class F>
double median_ms(const lf::backend::DeviceBackend& be, int warmup, int iters, F fn) {
  for (int i = 0; i < warmup; ++i) fn();
  be.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    be.synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loongforge-fp8-policy: time each linear layer in FP8 and in the training dtype, write the "
               "adaptive FP8 policy (loongforge-train --fp8-policy)"};
  int64_t hidden = 0, ffn = 0, heads = 0, groups = 0, kv_channels = 0, tp = 1;
  bool swiglu = false;
  std::vector<int64_t> tokens{512, 2048, 8192};
  std::string dtype = "bf16", format = "hybrid", recipe = "tensorwise", out;
  int margin = 0, iters = 5, warmup = 2;
  app.add_option("--hidden-size", hidden, "model hidden size")->required()->check(CLI::PositiveNumber);
  app.add_option("--ffn-hidden-size", ffn, "MLP hidden size")->required()->check(CLI::PositiveNumber);
  app.add_option("--num-attention-heads", heads, "attention heads")->required()->check(CLI::PositiveNumber);
  app.add_option("--num-query-groups", groups, "key/value heads (default: the attention heads)")
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-channels", kv_channels, "head size (default: hidden / heads)")->check(CLI::PositiveNumber);
  app.add_flag("--swiglu", swiglu, "the MLP is SwiGLU (linear_fc1 twice as wide)");
  app.add_option("--tensor-model-parallel-size", tp, "TP size: the shapes are one rank's")->check(CLI::PositiveNumber);
  app.add_option("--tokens", tokens, "GEMM rows to time (this rank's tokens per micro-batch), comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--dtype", dtype, "training dtype the FP8 GEMMs compete with")->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--fp8-format", format, "as loongforge-train's")->check(CLI::IsMember({"e4m3", "hybrid"}));
  app.add_option("--fp8-recipe", recipe, "as loongforge-train's")->check(CLI::IsMember({"tensorwise", "blockwise", "delayed", "mxfp8"}));
  app.add_option("--fp8-margin", margin, "as loongforge-train's")->check(CLI::Range(0, 16));
  app.add_option("--iters", iters, "timed calls per measurement (the median is kept)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed calls first")->check(CLI::NonNegativeNumber);
  app.add_option("--out", out, "the policy file to write")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (groups == 0) groups = heads;
    if (kv_channels == 0) {
      LF_CHECK(hidden % heads == 0, "--hidden-size ", hidden, " is not a multiple of --num-attention-heads ", heads,
               lf::hint("give --kv-channels"));
      kv_channels = hidden / heads;
    }
    LF_CHECK(heads % groups == 0, "--num-attention-heads ", heads, " is not a multiple of --num-query-groups ", groups);
    LF_CHECK(groups % tp == 0 && ffn % tp == 0, "--tensor-model-parallel-size ", tp,
             " does not divide --num-query-groups ", groups, " and --ffn-hidden-size ", ffn);
    const auto& be = lf::backend::select_backend();
    const auto r = lf::ops::Fp8Recipe::from_names(format, recipe, margin);
    const int64_t q_width = heads * kv_channels / tp;
    const std::vector<Shape> shapes{
        {lf::ops::Fp8Gemm::qkv, hidden, (heads + 2 * groups) * kv_channels / tp},
        {lf::ops::Fp8Gemm::proj, q_width, hidden},
        {lf::ops::Fp8Gemm::fc1, hidden, (swiglu ? 2 : 1) * ffn / tp},
        {lf::ops::Fp8Gemm::fc2, ffn / tp, hidden},
    };
    const auto opts = at::TensorOptions().dtype(dtype == "bf16" ? at::kBFloat16 : at::kFloat).device(be.device());
    std::vector<lf::ops::Fp8Policy::Measurement> measured;
    std::printf("%-5s %8s %8s %12s %12s %8s\n", "gemm", "tokens", "in x out", dtype == "bf16" ? "bf16 ms" : "fp32 ms",
                "fp8 ms", "choice");
    at::manual_seed(1);
    for (const Shape& s : shapes)
      for (int64_t t : tokens) {
        auto x = at::randn({t, s.in}, opts).requires_grad_(true);
        auto w = (at::randn({s.out, s.in}, opts) * 0.02).detach().requires_grad_(true);
        auto dy = at::randn({t, s.out}, opts);
        // Delayed scaling: w's scales and history, as a training run keeps them (the cost per GEMM
        // is the quantization with a known scale and the recorded amax; the per-step update is not timed).
        lf::ops::Fp8Recipe rw = r;
        std::optional<lf::ops::Fp8DelayedScaling> delayed;
        if (r.scaling == lf::ops::Fp8Scaling::delayed) {
          delayed.emplace(r);
          delayed->add_group({{"w", w}}, {});
          rw.delayed = &*delayed;
        }
        auto step = [&](bool fp8) {
          x.mutable_grad() = at::Tensor();
          w.mutable_grad() = at::Tensor();
          auto y = fp8 ? lf::ops::fp8_linear(x, w, {}, rw, nullptr, nullptr) : lf::ops::linear(x, w, {}, nullptr);
          y.backward(dy);
        };
        const double base = median_ms(be, warmup, iters, [&] { step(false); });
        const double f8 = median_ms(be, warmup, iters, [&] { step(true); });
        measured.push_back({s.gemm, t, base, f8});
        std::printf("%-5s %8lld %4lldx%-4lld %12.3f %12.3f %8s\n", lf::ops::to_string(s.gemm),
                    static_cast<long long>(t), static_cast<long long>(s.in), static_cast<long long>(s.out), base, f8,
                    f8 < base ? "fp8" : dtype.c_str());
      }
    const auto policy = lf::ops::Fp8Policy::from_measurements(r, measured);
    const std::string on = be.name() + ", " + std::to_string(at::get_num_threads()) + " threads, " + dtype +
                           ", tp " + std::to_string(tp);
    policy.write(out, on, measured);
    std::cout << "wrote " << out << ": " << policy.describe() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "loongforge-fp8-policy: " << e.what() << "\n";
    return 1;
  }
}

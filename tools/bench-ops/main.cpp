// loongforge-bench-ops: the ops the CUDA module has kernels for (on the CPU: the CPU backend's
// path for each, its own fused kernel or the reference) against the reference's ATen composition
// of the same op, on the same device, in the same process: median milliseconds per call of each (the two alternate call by call, so drift
// hits both), the speed-up, and where the backend reports memory, the peak each call adds. Shapes
// come from a preset: tiny (the ctest smoke run), small (the CPU default) or 8b (Llama-3-8B's
// hidden size, heads, FFN and vocabulary at 4096 tokens; DeepSeek-V3.2's indexer heads; what
// tools/gpu-check runs on a GPU). Numbers, not a test: the op harness checks the values.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/backend/reference_ops.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"

namespace {

using lf::backend::OpTable;

struct Shape {
  int64_t tokens, hidden, ffn, vocab, heads, kv_heads, head_dim;
  int64_t experts, topk, moe_hidden;
  int64_t dsa_seq, dsa_heads, dsa_dim, dsa_topk;
  int64_t adamw_numel;
};

Shape preset(const std::string& name) {
  if (name == "tiny") return {64, 64, 96, 512, 4, 2, 16, 4, 2, 64, 64, 4, 32, 16, 100'000};
  if (name == "small") return {2048, 512, 1408, 16384, 8, 4, 64, 8, 2, 512, 512, 8, 64, 64, 10'000'000};
  if (name == "8b") return {4096, 4096, 14336, 128256, 32, 8, 128, 64, 8, 2048, 4096, 64, 128, 2048, 218'112'000};
  LF_FAIL("--shape must be tiny, small or 8b, got '", name, "'");
}

struct Bench {
  std::string name;
  std::function<void(const OpTable&)> run;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<Bench> make_benches(const Shape& s, at::ScalarType dt, const c10::Device& dev) {
  const auto o = at::TensorOptions().dtype(dt).device(dev);
  const auto f32 = o.dtype(at::kFloat), i64 = o.dtype(at::kLong);
  std::vector<Bench> b;
  {
    auto x = at::randn({s.tokens, s.hidden}, o), w = at::rand({s.hidden}, o) + 0.5, dy = at::randn_like(x);
    b.push_back({"rms_norm fwd+bwd", [=](const OpTable& ops) {
                   auto f = ops.rms_norm_fwd(x, w, 1e-5);
                   ops.rms_norm_bwd(dy, x, w, f.rstd);
                 }});
  }
  {
    auto q = at::randn({s.tokens, 1, s.heads, s.head_dim}, o);
    auto ang = at::arange(s.tokens, f32).unsqueeze(1) * at::rand({s.head_dim}, f32);
    auto cos = ang.cos().to(dt), sin = ang.sin().to(dt);
    b.push_back({"rope fwd+bwd (q)", [=](const OpTable& ops) {
                   auto y = ops.rope_fwd(q, cos, sin, false);
                   ops.rope_bwd(y, cos, sin, false);
                 }});
  }
  {
    auto gu = at::randn({s.tokens, 2 * s.ffn}, o), dy = at::randn({s.tokens, s.ffn}, o);
    b.push_back({"swiglu fwd+bwd", [=](const OpTable& ops) {
                   ops.swiglu_fwd(gu);
                   ops.swiglu_bwd(dy, gu);
                 }});
  }
  {
    auto x = at::randn({s.tokens, s.hidden}, o), w = at::randn({s.vocab, s.hidden}, o) * 0.02;
    auto target = at::randint(s.vocab, {s.tokens}, i64), weight = at::ones({s.tokens}, f32);
    b.push_back({"linear_cross_entropy (vocab " + std::to_string(s.vocab) + ")", [=](const OpTable& ops) {
                   ops.linear_cross_entropy(x, w, target, weight, -100, {}, 0);
                 }});
    // As training calls it with gradient-accumulation fusion: dw added into the fp32 gradient slot.
    auto slot = at::zeros({s.vocab, s.hidden}, f32);
    b.push_back({"linear_cross_entropy into the grad slot", [=](const OpTable& ops) {
                   lf::backend::GradInto into{slot, 1.0, /*accumulate=*/true};
                   ops.linear_cross_entropy(x, w, target, weight, -100, {}, 0, into);
                 }});
  }
  {
    // A layer's worth of parameters in 16 tensors, fp32 main grads, as the trainer passes them.
    std::vector<at::Tensor> p, g, m, v;
    for (int i = 0; i < 16; ++i) {
      const int64_t n = s.adamw_numel / 16;
      p.push_back(at::randn({n}, f32));
      g.push_back(at::randn({n}, f32));
      m.push_back(at::zeros({n}, f32));
      v.push_back(at::zeros({n}, f32));
    }
    const std::string count = s.adamw_numel >= 1'000'000 ? std::to_string(s.adamw_numel / 1'000'000) + "M"
                                                         : std::to_string(s.adamw_numel / 1000) + "K";
    b.push_back({"adamw_step (" + count + " params)", [=](const OpTable& ops) {
                   lf::backend::AdamWHyper hp;
                   hp.step = 3;
                   hp.grad_scale = 0.5;
                   ops.adamw_step(p, g, m, v, hp);
                 }});
    b.push_back({"squared_norm (same grads)", [=](const OpTable& ops) { ops.squared_norm(g); }});
  }
  {
    auto x = at::randn({s.tokens, s.hidden}, o);
    auto idx = at::randint(s.experts, {s.tokens, s.topk}, i64);
    auto probs = at::rand({s.tokens, s.topk}, f32).softmax(1).to(dt);
    const lf::backend::ReferenceOps ref;
    auto perm = ref.moe_permute_fwd(x, idx, s.experts);
    auto y = at::randn_like(perm.permuted), dout = at::randn_like(x);
    b.push_back({"moe unpermute fwd+bwd, permute bwd (top-" + std::to_string(s.topk) + ")",
                 [=](const OpTable& ops) {
                   ops.moe_unpermute_fwd(y, perm.position, probs);
                   auto u = ops.moe_unpermute_bwd(dout, y, perm.position, probs);
                   ops.moe_permute_bwd(u.dy, perm.source, s.tokens);
                 }});
    const int64_t e = std::min<int64_t>(s.experts, 8), rows = s.tokens * 2;
    auto gx = at::randn({rows, s.hidden}, o), gw = at::randn({e, 2 * s.moe_hidden, s.hidden}, o) * 0.02;
    auto gdy = at::randn({rows, 2 * s.moe_hidden}, o);
    auto counts = at::full({e}, rows / e, at::TensorOptions().dtype(at::kLong));
    b.push_back({"grouped_gemm fwd+bwd (" + std::to_string(e) + " experts)", [=](const OpTable& ops) {
                   ops.grouped_gemm_fwd(gx, gw, counts);
                   ops.grouped_gemm_bwd(gdy, gx, gw, counts, {});
                 }});
  }
  {
    auto qi = at::randn({1, s.dsa_seq, s.dsa_heads, s.dsa_dim}, o), ki = at::randn({1, s.dsa_seq, s.dsa_dim}, o);
    auto w = at::rand({1, s.dsa_seq, s.dsa_heads}, o);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.dsa_dim));
    b.push_back({"dsa indexer top-k + scores (seq " + std::to_string(s.dsa_seq) + ")", [=](const OpTable& ops) {
                   auto top = ops.dsa_indexer_topk(qi, ki, w, scale, s.dsa_topk);
                   ops.dsa_indexer_scores_fwd(qi, ki, w, top, scale);
                 }});
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loongforge-bench-ops: the backend's ops against the reference's ATen composition"};
  std::string device = "cpu", shape_name = "small", dtype_name = "bf16", json_path, only;
  int iters = 5, warmup = 1;
  app.add_option("--device", device, "cpu or cuda (the backend under test)")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--shape", shape_name, "tiny, small or 8b")->check(CLI::IsMember({"tiny", "small", "8b"}));
  app.add_option("--dtype", dtype_name, "bf16 or fp32 activations and weights")->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--iters", iters, "timed calls of each side")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed calls of each side first")->check(CLI::NonNegativeNumber);
  app.add_option("--only", only, "run only the ops whose name contains this");
  app.add_option("--json", json_path, "also write the rows here");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto& be = lf::backend::backend_by_name(device);
    const c10::Device dev = be.device();
    const auto dt = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
    at::manual_seed(0);
    const auto benches = make_benches(preset(shape_name), dt, dev);
    const lf::backend::ReferenceOps reference;
    const bool mem = be.memory_stats().supported;
    std::printf("# loongforge-bench-ops: %s, shape %s, %s, %d iterations (median ms per call)\n\n", device.c_str(),
                shape_name.c_str(), dtype_name.c_str(), iters);
    std::printf("| op | %s ms | reference ms | speed-up |%s\n|---|---|---|---|%s\n", device.c_str(),
                mem ? " peak MiB | reference peak MiB |" : "", mem ? "---|---|" : "");
    nlohmann::json rows = nlohmann::json::array();
    int ran = 0;
    for (const auto& bench : benches) {
      if (!only.empty() && bench.name.find(only) == std::string::npos) continue;
      ++ran;
      auto time_once = [&](const OpTable& ops) {
        be.synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        bench.run(ops);
        be.synchronize();
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      };
      auto peak_once = [&](const OpTable& ops) {
        be.synchronize();
        const int64_t before = be.memory_stats().allocated_bytes;
        be.reset_peak_memory();
        bench.run(ops);
        be.synchronize();
        return static_cast<double>(be.memory_stats().peak_allocated_bytes - before) / (1 << 20);
      };
      for (int i = 0; i < warmup; ++i) {
        time_once(be.ops());
        time_once(reference);
      }
      std::vector<double> mine, ref;
      for (int i = 0; i < iters; ++i) {
        mine.push_back(time_once(be.ops()));
        ref.push_back(time_once(reference));
      }
      const double a = median(mine), r = median(ref);
      nlohmann::json row{{"op", bench.name}, {"ms", a}, {"reference_ms", r}, {"speedup", r / a}};
      std::printf("| %s | %.3f | %.3f | %.2fx |", bench.name.c_str(), a, r, r / a);
      if (mem) {
        const double pm = peak_once(be.ops()), pr = peak_once(reference);
        row["peak_mib"] = pm;
        row["reference_peak_mib"] = pr;
        std::printf(" %.1f | %.1f |", pm, pr);
      }
      std::printf("\n");
      std::fflush(stdout);
      rows.push_back(row);
    }
    LF_CHECK(ran > 0, "--only '", only, "' matches no op", lf::hint("run without --only to see the op names"));
    if (!json_path.empty()) {
      std::ofstream f(json_path);
      LF_CHECK(f.good(), "cannot write --json ", json_path);
      f << nlohmann::json{{"device", device}, {"shape", shape_name}, {"dtype", dtype_name}, {"rows", rows}}.dump(2)
        << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loongforge-bench-ops: %s\n", e.what());
    return 1;
  }
}

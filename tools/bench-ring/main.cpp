// loongforge-bench-ring: what ring attention's overlap hides (tools/bench --cp-ring-overlap). Run
// under loongforge-run with one process per context-parallel rank; each rank times the ring's
// forward + backward over random q, k, v (its share of one sequence) in two modes, alternating:
// transfers waited for before each block's computation (serial) and the next block's transfer in
// flight while this one is computed (overlapped, what training uses). The ring's own timers
// (parallel/context RingStats) give the time spent waiting: in the serial mode that is the whole
// key/value communication, in the overlapped mode the part left exposed. Rank 0 prints both, the
// ring's time per call, the hidden fraction 1 - exposed / serial (all transfers, and the key/value
// blocks alone) and the wall time the overlap saved. Numbers, not a test.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/launch_env.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/dist/rendezvous.h"
#include "loongforge/parallel/context/context_parallel.h"

int main(int argc, char** argv) {
  CLI::App app{"loongforge-bench-ring: the communication ring attention hides (run under loongforge-run)"};
  int64_t seq = 8192, heads = 8, kv_heads = 2, dim = 64, batch = 1;
  int iters = 4, warmup = 1;
  app.add_option("--seq-length", seq, "whole sequence length (split over the ranks)");
  app.add_option("--heads", heads, "query heads");
  app.add_option("--kv-heads", kv_heads, "key/value heads");
  app.add_option("--head-dim", dim, "head size");
  app.add_option("--batch", batch, "samples");
  app.add_option("--iters", iters, "timed forward+backward calls per mode");
  app.add_option("--warmup", warmup, "untimed calls first");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto env = lf::dist::detect_launch_env();
    LF_CHECK(env.world_size > 1, "loongforge-bench-ring needs 2 or more processes",
             lf::hint("run it as loongforge-run --standalone --nproc-per-node 2 loongforge-bench-ring ..."));
    lf::dist::Rendezvous rendezvous(env, std::chrono::seconds(120));
    lf::dist::ParallelSizes sizes;
    sizes.cp = env.world_size;
    lf::dist::ParallelLayout layout(env.world_size, sizes);
    lf::dist::ParallelContextOptions options;
    options.kinds = {lf::dist::GroupKind::world, lf::dist::GroupKind::cp};
    lf::dist::ParallelContext ctx(rendezvous, layout, options);
    const auto& be = lf::backend::cpu_backend();
    const int n = ctx.cp_size();
    LF_CHECK(seq % (2 * n) == 0, "--seq-length ", seq, " must be a multiple of ", 2 * n);
    at::manual_seed(1 + ctx.cp_rank());
    const int64_t local = seq / n;
    auto q = at::randn({batch, heads, local, dim}).requires_grad_(true);
    auto k = at::randn({batch, kv_heads, local, dim}).requires_grad_(true);
    auto v = at::randn({batch, kv_heads, local, dim}).requires_grad_(true);
    auto dout = at::randn({batch, heads, local, dim});
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    lf::parallel::RingStats stats[2];
    double wall[2] = {0, 0};
    auto call = [&](bool overlap, lf::parallel::RingStats* s) {
      lf::parallel::ContextParallel cp{.group = &ctx.cp(), .comm = lf::parallel::CpCommType::p2p, .overlap = overlap, .stats = s};
      auto o = lf::parallel::context_parallel_attention(be, cp, q, k, v, {}, scale, {});
      o.backward(dout);
    };
    for (int i = 0; i < warmup; ++i) call(true, nullptr), call(false, nullptr);
    for (int i = 0; i < iters; ++i)
      for (int mode = 0; mode < 2; ++mode) {
        ctx.cp().barrier();
        const auto t0 = std::chrono::steady_clock::now();
        call(mode == 1, &stats[mode]);
        wall[mode] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    if (ctx.cp_rank() == 0) {
      const double per = 1000.0 / iters;
      std::printf("ring attention, cp %d, %lld tokens (%lld per rank), %lld heads (%lld kv) x %lld, batch %lld, "
                  "%d iterations per mode\n",
                  n, static_cast<long long>(seq), static_cast<long long>(local), static_cast<long long>(heads),
                  static_cast<long long>(kv_heads), static_cast<long long>(dim), static_cast<long long>(batch), iters);
      const char* names[2] = {"serial", "overlapped"};
      for (int m = 0; m < 2; ++m)
        std::printf("  %-11s fwd+bwd %8.1f ms | waiting for k/v blocks %7.1f ms | for k/v gradients %7.1f ms\n",
                    names[m], wall[m] * per, stats[m].kv_wait_seconds * per, stats[m].dkv_wait_seconds * per);
      const double comm = stats[0].kv_wait_seconds + stats[0].dkv_wait_seconds;  // serial: all of it waited for
      const double exposed = stats[1].kv_wait_seconds + stats[1].dkv_wait_seconds;
      std::printf("  ring communication %.1f ms per call (%.1f%% of the serial call); overlapped, %.1f ms of it is "
                  "still waited for: %.1f%% hidden (k/v blocks %.1f%%); wall time saved %.1f ms = %.1f%% of the "
                  "communication\n",
                  comm * per, wall[0] > 0 ? 100 * comm / wall[0] : 0.0, exposed * per,
                  comm > 0 ? 100 * (1 - exposed / comm) : 0.0,
                  stats[0].kv_wait_seconds > 0 ? 100 * (1 - stats[1].kv_wait_seconds / stats[0].kv_wait_seconds) : 0.0,
                  (wall[0] - wall[1]) * per, comm > 0 ? 100 * (wall[0] - wall[1]) / comm : 0.0);
    }
    ctx.world().barrier();
  } catch (const std::exception& e) {
    std::cerr << "loongforge-bench-ring: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

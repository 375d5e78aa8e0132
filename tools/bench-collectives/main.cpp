// loongforge-bench-collectives: what a collective of one host's ranks costs over Gloo's loopback
// sockets and over shared memory (backend/shm_communicator.h) at several slot sizes. Run under
// loongforge-run with one process per rank (tools/bench --collectives does); every rank times
// all_reduce, reduce_scatter and all_gather of --numel fp32 elements (default: llama_10m's
// gradient, 40 MB) and an all_to_all of the same buffer (equal splits: MoE's token dispatch), each
// call after a barrier, the transports in alternating rounds so that the machine's drift hits them
// alike; rank 0 prints the best and median milliseconds per call. Numbers, not a test
// (tests/dist/test_shm_collectives.cpp checks the values).
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/backend/shm_communicator.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/launch_env.h"
#include "loongforge/dist/rendezvous.h"

namespace {

using lf::backend::Communicator;

struct Transport {
  std::string name;
  std::unique_ptr<Communicator> comm;
  std::vector<double> ms[4];  // all_reduce, reduce_scatter, all_gather, all_to_all
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loongforge-bench-collectives: Gloo against shared memory (run under loongforge-run)"};
  int64_t numel = 10'000'000;
  int iters = 10;
  std::vector<int64_t> slot_kib{256, 1024, 4096};
  app.add_option("--numel", numel, "fp32 elements per call (all_reduce; reduce_scatter's input)")
      ->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "timed calls per op and transport")->check(CLI::PositiveNumber);
  app.add_option("--slot-kib", slot_kib, "shared-memory slot sizes to compare, KiB")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    const auto env = lf::dist::detect_launch_env();
    LF_CHECK(env.world_size > 1, "loongforge-bench-collectives needs 2 or more processes",
             lf::hint("run it as loongforge-run --standalone --nproc-per-node 2 "
                      "loongforge-bench-collectives ..."));
    lf::dist::Rendezvous rendezvous(env, std::chrono::seconds(120));
    const int n = env.world_size;
    numel = (numel + n - 1) / n * n;
    auto spec_for = [&](const std::string& name) {
      lf::backend::CommunicatorSpec spec;
      spec.name = name;
      for (int r = 0; r < n; ++r) spec.ranks.push_back(r);
      spec.group_rank = spec.global_rank = env.rank;
      spec.store = c10::make_intrusive<c10d::PrefixStore>("bench/" + name, rendezvous.store());
      return spec;
    };
    LF_CHECK(lf::backend::shm_collectives_enabled(), "LOONGFORGE_SHM_COLLECTIVES=0: no shared memory to compare",
             lf::hint("unset LOONGFORGE_SHM_COLLECTIVES"));
    std::vector<Transport> transports;
    transports.push_back({"gloo", lf::backend::make_gloo_communicator(spec_for("gloo")), {}});
    for (int64_t kib : slot_kib) {
      const auto spec = spec_for("shm" + std::to_string(kib));
      auto comm = lf::backend::with_shared_memory(lf::backend::make_gloo_communicator(spec), spec,
                                                  {.slot_bytes = kib * 1024});
      LF_CHECK(lf::backend::uses_shared_memory(*comm), "shared memory is not available here",
               lf::hint("see the log line above for why"));
      transports.push_back({lf::str("shm, ", kib, " KiB slots"), std::move(comm), {}});
    }
    at::Tensor grad = at::randn({numel});
    at::Tensor shard = at::empty({numel / n});
    at::Tensor gathered = at::empty({numel});
    at::Tensor exchanged = at::empty({numel});
    for (int it = -1; it < iters; ++it)  // -1: warm-up (first touch of every page)
      for (auto& t : transports)
        for (int op = 0; op < 4; ++op) {
          t.comm->barrier();
          const auto t0 = std::chrono::steady_clock::now();
          if (op == 0) t.comm->all_reduce(grad);
          else if (op == 1) t.comm->reduce_scatter(shard, grad);
          else if (op == 2) t.comm->all_gather(gathered, shard);
          else t.comm->all_to_all(exchanged, grad, {}, {});
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          if (it >= 0) t.ms[op].push_back(ms);
          grad.mul_(0.5);  // keep the values finite
        }
    if (env.rank == 0) {
      std::printf("collectives of %d ranks, %lld fp32 elements (%.1f MB), %d calls each; "
                  "best / median ms per call\n",
                  n, static_cast<long long>(numel), numel * 4 / 1e6, iters);
      std::printf("  %-22s %17s %17s %17s %17s\n", "transport", "all_reduce", "reduce_scatter",
                  "all_gather", "all_to_all");
      for (auto& t : transports) {
        std::printf("  %-22s", t.name.c_str());
        for (auto& v : t.ms)
          std::printf("   %6.2f / %6.2f", *std::min_element(v.begin(), v.end()), median(v));
        std::printf("\n");
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "loongforge-bench-collectives: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

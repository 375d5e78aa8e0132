// Two ranks run every collective through a backend's communicator and check hand-computed
// results: the XPU plugin's communicator (the reference plugin's store-based one, or the plugin
// tools/xpu-compat names; through the C ABI and the
// loader's adapter) and, as a control running the same body, the CPU backend's Gloo one.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>

#include "loongforge/backend/registry.h"
#include "multiprocess.h"
#include "plugin_under_test.h"

namespace lf::testing {
namespace {

using backend::ReduceOp;

at::Tensor f32(std::vector<float> v) { return at::tensor(v, at::kFloat); }

void expect_values(const at::Tensor& t, const std::vector<float>& want, const char* what) {
  auto got = t.to(at::kFloat).contiguous();
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_FLOAT_EQ(got[i].item<float>(), want[i]) << what << " [" << i << "], rank "
                                                   << worker_rank();
}

void run_collectives(const std::string& device) {
  const int rank = worker_rank();
  ASSERT_EQ(worker_world_size(), 2);
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(std::atoi(std::getenv("MASTER_PORT")));
  so.isServer = rank == 0;
  so.numWorkers = 2;
  so.timeout = std::chrono::seconds(60);
  auto tcp = c10::make_intrusive<c10d::TCPStore>(std::getenv("MASTER_ADDR"), so);

  std::unique_ptr<backend::DeviceBackend> xpu;
  const backend::DeviceBackend* be = &backend::cpu_backend();
  if (device == "xpu") {
    xpu = backend::load_xpu_plugin(xpu_plugin_under_test());
    be = xpu.get();
  }
  backend::CommunicatorSpec spec;
  spec.name = "world";
  spec.ranks = {0, 1};
  spec.group_rank = rank;
  spec.global_rank = rank;
  spec.timeout = std::chrono::seconds(60);
  spec.store = c10::make_intrusive<c10d::PrefixStore>("backend-test/world", tcp);
  auto comm = be->communicator_factory()(spec);
  ASSERT_EQ(comm->size(), 2);
  ASSERT_EQ(comm->rank(), rank);

  const float r = static_cast<float>(rank);
  {  // [r+1, 2(r+1)] summed over ranks 0, 1 = [3, 6]
    auto t = f32({r + 1, 2 * (r + 1)});
    comm->all_reduce(t, ReduceOp::sum);
    expect_values(t, {3, 6}, "all_reduce sum");
    auto a = f32({r + 1, 2 * (r + 1)});
    comm->all_reduce(a, ReduceOp::avg);
    expect_values(a, {1.5, 3}, "all_reduce avg");
    auto m = f32({r, -r});
    comm->all_reduce(m, ReduceOp::max);
    expect_values(m, {1, 0}, "all_reduce max");
    auto bf = at::full({3}, 0.5 + rank, at::kBFloat16);
    comm->all_reduce(bf, ReduceOp::sum);
    expect_values(bf, {2, 2, 2}, "all_reduce bf16");
  }
  {  // gather [10r, 10r+1] -> [0, 1, 10, 11]
    auto out = at::empty({4}, at::kFloat);
    comm->all_gather(out, f32({10 * r, 10 * r + 1}));
    expect_values(out, {0, 1, 10, 11}, "all_gather");
  }
  {  // input arange(4) + 10r; rank k gets rows [2k, 2k+2) summed over ranks
    auto out = at::empty({2}, at::kFloat);
    comm->reduce_scatter(out, at::arange(4, at::kFloat) + 10 * r, ReduceOp::sum);
    expect_values(out, rank == 0 ? std::vector<float>{10, 12} : std::vector<float>{14, 16},
                  "reduce_scatter");
  }
  {
    auto t = at::full({3}, r, at::kFloat);
    comm->broadcast(t, /*root=*/1);
    expect_values(t, {1, 1, 1}, "broadcast from 1");
  }
  {  // uneven: rank 0 sends rows {0} to 0 and {1, 2} to 1; rank 1 sends {0, 1} to 0, {2} to 1
    auto in = at::arange(3, at::kFloat) + 100 * r;
    std::vector<int64_t> in_splits = rank == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 1};
    std::vector<int64_t> out_splits = rank == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 1};
    auto out = at::empty({3}, at::kFloat);
    comm->all_to_all(out, in, out_splits, in_splits);
    expect_values(out, rank == 0 ? std::vector<float>{0, 100, 101} : std::vector<float>{1, 2, 102},
                  "all_to_all uneven");
  }
  {  // 0 -> 1 then 1 -> 0, two messages on one tag arrive in order
    if (rank == 0) {
      comm->send(f32({7, 8, 9}), 1, /*tag=*/3);
      comm->send(f32({1, 2, 3}), 1, /*tag=*/3);
      auto back = at::empty({1}, at::kFloat);
      comm->recv(back, 1, 4);
      expect_values(back, {42}, "recv from 1");
    } else {
      auto a = at::empty({3}, at::kFloat), b = at::empty({3}, at::kFloat);
      comm->recv(a, 0, 3);
      comm->recv(b, 0, 3);
      expect_values(a, {7, 8, 9}, "first message");
      expect_values(b, {1, 2, 3}, "second message");
      comm->send(f32({42}), 0, 4);
    }
  }
  comm->barrier();
  comm.reset();
  // Rank 0 serves the store: it leaves only after the other rank's last store request.
  if (rank == 0) tcp->wait({"backend-test/exit/1"});
  else tcp->set("backend-test/exit/1", std::vector<uint8_t>{1});
}

LF_WORKER_CASE(backend_collectives) { run_collectives(worker_args().at(0)); }

TEST(PluginCommunicator, TwoRanksOnTheXpuPlugin) {  // the reference, or tools/xpu-compat's plugin
  SpawnOptions opt;
  opt.world_size = 2;
  opt.args = {"xpu"};
  expect_all_ok(run_workers("backend_collectives", opt));
}

TEST(PluginCommunicator, SameBodyOnTheCpuBackendsGloo) {
  SpawnOptions opt;
  opt.world_size = 2;
  opt.args = {"cpu"};
  expect_all_ok(run_workers("backend_collectives", opt));
}

}  // namespace
}  // namespace lf::testing

// What goes wrong, and what the user reads: a peer that skips a collective (timeout), a peer that
// dies, a rendezvous with nobody listening, bad arguments. Plus spdlog logging from a process that
// also runs c10d collectives (LibTorch bundles fmt 12, spdlog uses Debian's fmt: both must work).
#include <ATen/Functions.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "loongforge/backend/c10d_communicator.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/dist/rendezvous.h"
#include "multiprocess.h"

namespace lf::dist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// 2 ranks, one dp group [0, 1] with a 2 s timeout. Rank 1 skips the all_reduce but stays alive.
LF_WORKER_CASE(skip_collective) {
  Rendezvous rdzv(detect_launch_env(), std::chrono::seconds(30));
  ParallelContext ctx(rdzv, ParallelLayout(2, {}),
                      {.timeout = std::chrono::seconds(2), .kinds = {GroupKind::dp}});
  if (rdzv.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    return;
  }
  at::Tensor t = at::ones({4}, at::kFloat);
  auto start = Clock::now();
  try {
    ctx.dp().all_reduce(t);
    ADD_FAILURE() << "all_reduce returned although rank 1 never joined";
  } catch (const lf::Error& e) {
    std::printf("ERROR after %.1f s: %s\n", seconds_since(start), e.what());
    EXPECT_LT(seconds_since(start), 20.0);
  }
}

TEST(DistFailures, SkippedCollectiveTimesOutNamingOpGroupAndRanks) {
  auto res = lf::testing::run_workers("skip_collective",
                                      {.world_size = 2, .timeout = std::chrono::seconds(60)});
  lf::testing::expect_all_ok(res);
  const std::string& out = res[0].output;
  EXPECT_NE(out.find("all_reduce on group 'dp' (ranks [0, 1], this rank's index 0) failed"),
            std::string::npos) << out;
  EXPECT_NE(out.find("HINT: a peer of this group may have died or skipped this operation"),
            std::string::npos) << out;
  EXPECT_NE(out.find("--distributed-timeout-minutes"), std::string::npos) << out;
  // The group is on one host, so the op ran over shared memory; it names whom it waited for.
  EXPECT_NE(out.find("timed out after 2 s in shared memory waiting for global rank(s) [1]"),
            std::string::npos) << out;
}

// Rank 1 dies right after the group is built; rank 0's collective must fail, not hang.
LF_WORKER_CASE(dead_peer) {
  Rendezvous rdzv(detect_launch_env(), std::chrono::seconds(30));
  ParallelContext ctx(rdzv, ParallelLayout(2, {}),
                      {.timeout = std::chrono::seconds(20), .kinds = {GroupKind::world}});
  ctx.world().barrier();
  if (rdzv.rank() == 1) _exit(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  at::Tensor t = at::ones({1024}, at::kFloat);
  try {
    ctx.world().all_reduce(t);
    ctx.world().all_reduce(t);
    ADD_FAILURE() << "all_reduce succeeded with a dead peer";
  } catch (const lf::Error& e) {
    std::printf("ERROR: %s\n", e.what());
  }
}

TEST(DistFailures, DeadPeerIsAnErrorNamingTheGroup) {
  auto res = lf::testing::run_workers("dead_peer",
                                      {.world_size = 2, .timeout = std::chrono::seconds(60)});
  lf::testing::expect_all_ok(res);
  EXPECT_NE(res[0].output.find("all_reduce on group 'world' (ranks [0, 1], this rank's index 0) "
                               "failed"),
            std::string::npos) << res[0].output;
  // Over shared memory the dead peer is noticed by its pid, long before the 20 s timeout.
  EXPECT_NE(res[0].output.find("group rank 1 (global rank 1, pid "), std::string::npos)
      << res[0].output;
  EXPECT_NE(res[0].output.find(") has exited"), std::string::npos) << res[0].output;
}

TEST(DistFailures, RendezvousWithoutRankZeroNamesAddressRankAndTimeout) {
  LaunchEnv env;
  env.rank = 1;
  env.world_size = 2;
  env.source = "torchrun";
  env.master_addr = "127.0.0.1";
  env.master_port = lf::testing::free_port();
  auto start = Clock::now();
  try {
    Rendezvous r(env, std::chrono::milliseconds(1500));
    FAIL() << "connected to a store nobody hosts";
  } catch (const lf::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rank 1 of 2 (torchrun) connecting to the TCPStore at MASTER_ADDR:MASTER_PORT"
                     " = 127.0.0.1:" + std::to_string(env.master_port)),
              std::string::npos) << m;
    EXPECT_NE(m.find("1500 ms"), std::string::npos) << m;
    EXPECT_NE(m.find("HINT: is rank 0 running"), std::string::npos) << m;
  }
  EXPECT_LT(seconds_since(start), 30.0);
}

// A single process: the in-memory store and size-1 Gloo groups; argument checks.
// The listening sockets on `port` in /proc/net/tcp and tcp6: their local addresses (hex, as the
// kernel prints them).
std::vector<std::string> listeners(int port) {
  char hex[8];
  std::snprintf(hex, sizeof(hex), "%04X", port);
  std::vector<std::string> out;
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string slot, local, remote, state;
      ls >> slot >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (state == "0A" && colon != std::string::npos && local.substr(colon + 1) == hex) out.push_back(local.substr(0, colon));
    }
  }
  return out;
}

// Rank 0 hosts the TCPStore on the address it was given only: for a one-node job on 127.0.0.1
// its socket is bound to loopback (0100007F), never to every interface (00000000, or :: in tcp6).
LF_WORKER_CASE(store_binds_master_addr) {
  const auto env = detect_launch_env();
  Rendezvous r(env, std::chrono::seconds(30));
  if (env.rank == 0) {
    const auto addrs = listeners(env.master_port);
    ASSERT_FALSE(addrs.empty()) << "no listening socket on port " << env.master_port;
    for (const auto& a : addrs) EXPECT_TRUE(a == "0100007F" || a == "00000000000000000000000001000000") << a;
  }
  r.store()->set("checked" + std::to_string(env.rank), std::vector<uint8_t>{1});
  r.store()->wait({"checked0", "checked1"});
}

TEST(Rendezvous, StoreListensOnlyOnMasterAddr) {
  lf::testing::expect_all_ok(lf::testing::run_workers("store_binds_master_addr", {.world_size = 2}));
}

TEST(DistFailures, ArgumentErrorsNameOpAndGroup) {
  Rendezvous rdzv(LaunchEnv{}, std::chrono::seconds(10));
  ParallelContext ctx(rdzv, ParallelLayout(1, {}), {.kinds = {GroupKind::world}});
  at::Tensor out = at::empty({3}, at::kFloat);
  try {
    ctx.world().all_gather(out, at::ones({2}, at::kFloat));
    FAIL() << "bad all_gather shapes accepted";
  } catch (const lf::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("all_gather on group 'world' (ranks [0], this rank's index 0): output [3]"),
              std::string::npos) << m;
  }
  at::Tensor t = at::ones({2}, at::kFloat);
  EXPECT_THROW(ctx.world().send(t, 0), lf::Error);
  EXPECT_THROW(ctx.world().broadcast(t, 1), lf::Error);
  EXPECT_THROW(ctx.world().all_to_all(t, t, {1, 1}, {2}), lf::Error);
  // Size 1 still computes: avg of one value is the value.
  t = at::full({2}, 5.0, at::kFloat);
  ctx.world().all_reduce(t, backend::ReduceOp::avg);
  EXPECT_EQ(t[1].item<float>(), 5.0f);
  EXPECT_THROW(ctx.embedding(), lf::Error);  // not created
}

// spdlog (through lf::log) and Gloo collectives in one process, every rank logging to its file.
LF_WORKER_CASE(log_and_collect) {
  const char* dir = std::getenv("LF_TEST_LOG_DIR");
  ASSERT_NE(dir, nullptr);
  LaunchEnv env = detect_launch_env();
  lf::log::Options o;
  o.rank = env.rank;
  o.world_size = env.world_size;
  o.terminal = env.rank == 0;
  o.file = std::string(dir) + "/rank" + std::to_string(env.rank) + ".log";
  lf::log::init(o);
  Rendezvous rdzv(env, std::chrono::seconds(30));
  ParallelContext ctx(rdzv, ParallelLayout(env.world_size, {}), {.kinds = {GroupKind::world}});
  for (int step = 0; step < 3; ++step) {
    at::Tensor t = at::full({1}, env.rank + 1.0 + step, at::kFloat);
    ctx.world().all_reduce(t);
    LF_INFO("step ", step, " all_reduce gave ", t.item<float>());
  }
  lf::log::flush();
}

TEST(DistLogging, SpdlogAndC10dInOneBinary) {
  std::string dir = lf::testing::make_temp_dir("dist-log");
  auto res = lf::testing::run_workers(
      "log_and_collect",
      {.world_size = 2, .timeout = std::chrono::seconds(60), .env = {{"LF_TEST_LOG_DIR", dir}}});
  lf::testing::expect_all_ok(res);
  for (int r = 0; r < 2; ++r) {
    std::ifstream f(dir + "/rank" + std::to_string(r) + ".log");
    std::stringstream ss;
    ss << f.rdbuf();
    std::string log = ss.str();
    // Sums over ranks 0, 1 of rank + 1 + step: 3, 5, 7.
    for (auto [step, sum] : {std::pair{0, 3}, std::pair{1, 5}, std::pair{2, 7}})
      EXPECT_NE(log.find("[rank " + std::to_string(r) + "] step " + std::to_string(step) +
                         " all_reduce gave " + std::to_string(sum)),
                std::string::npos) << "rank " << r << " log:\n" << log;
  }
}

}  // namespace
}  // namespace lf::dist

// One real multi-process job per launcher convention: each worker sees only that convention's
// variables (it rewrites the torchrun variables run_workers gave it), detects its rank, meets the
// others through the TCPStore and all-reduces. Plus a job started by the real `torchrun
// --no-python`, whose agent hosts the store.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "loongforge/backend/communicator.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/dist/rendezvous.h"
#include "multiprocess.h"

namespace lf::dist {
namespace {

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

void set(const char* k, const std::string& v) { setenv(k, v.c_str(), 1); }

// Rewrites run_workers' torchrun variables into the convention named by LF_TEST_CONVENTION.
void emulate(const std::string& convention) {
  const std::string rank = getenv_str("RANK"), world = getenv_str("WORLD_SIZE");
  if (convention == "torchrun" || convention == "torchrun-real") return;
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"})
    unsetenv(v);
  if (convention == "slurm") {
    // One node "localhost" running all tasks; master address from the step's node list.
    unsetenv("MASTER_ADDR");
    set("SLURM_PROCID", rank);
    set("SLURM_NTASKS", world);
    set("SLURM_LOCALID", rank);
    set("SLURM_NODEID", "0");
    set("SLURM_TASKS_PER_NODE", world + "(x1)");
    set("SLURM_STEP_NODELIST", "localhost");
    set("SLURM_JOB_ID", "4242");
  } else if (convention == "openmpi") {
    set("OMPI_COMM_WORLD_RANK", rank);
    set("OMPI_COMM_WORLD_SIZE", world);
    set("OMPI_COMM_WORLD_LOCAL_RANK", rank);
    set("OMPI_COMM_WORLD_LOCAL_SIZE", world);
  } else {
    FAIL() << "unknown convention " << convention;
  }
}

LF_WORKER_CASE(launch_convention) {
  const std::string convention = getenv_str("LF_TEST_CONVENTION");
  emulate(convention);
  LaunchEnv env = detect_launch_env();
  EXPECT_EQ(env.source, convention == "torchrun-real" ? "torchrun" : convention);
  EXPECT_EQ(env.agent_store, convention == "torchrun-real");
  Rendezvous rdzv(env, std::chrono::seconds(60));
  ParallelContext ctx(rdzv, ParallelLayout(env.world_size, {}), {.kinds = {GroupKind::world}});
  at::Tensor t = at::full({1}, env.rank + 1.0, at::kFloat);
  ctx.world().all_reduce(t);
  const double want = env.world_size * (env.world_size + 1) / 2.0;
  EXPECT_EQ(t.item<float>(), want);
  std::printf("convention %s rank %d of %d local %d/%d master %s sum %g\n", convention.c_str(),
              env.rank, env.world_size, env.local_rank, env.local_world_size,
              env.master_addr.c_str(), t.item<float>());
}

void run_convention(const std::string& convention, int world) {
  auto res = lf::testing::run_workers(
      "launch_convention", {.world_size = world, .timeout = std::chrono::seconds(60),
                            .env = {{"LF_TEST_CONVENTION", convention}}});
  lf::testing::expect_all_ok(res);
  // 1 + 2 + 3 = 6 for three ranks.
  EXPECT_NE(res[2].output.find("convention " + convention + " rank 2 of 3 local 2/3"),
            std::string::npos) << res[2].output;
  EXPECT_NE(res[2].output.find("sum 6"), std::string::npos) << res[2].output;
  // Slurm found the master in SLURM_STEP_NODELIST; the others in MASTER_ADDR.
  std::string master = convention == "slurm" ? "localhost" : "127.0.0.1";
  EXPECT_NE(res[2].output.find("master " + master + " sum"), std::string::npos) << res[2].output;
}

TEST(DistLaunch, TorchrunVariables) { run_convention("torchrun", 3); }
TEST(DistLaunch, SlurmVariables) { run_convention("slurm", 3); }
TEST(DistLaunch, OpenMpiVariables) { run_convention("openmpi", 3); }

TEST(DistLaunch, RealTorchrunNoPython) {
  std::string torchrun = lf::testing::source_dir() + "/.venv/bin/torchrun";
  if (!std::filesystem::exists(torchrun)) GTEST_SKIP() << "no " << torchrun;
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  auto res = lf::testing::run_command(
      {torchrun, "--no-python", "--nnodes=1", "--nproc-per-node=3", "--master-addr=127.0.0.1",
       "--master-port=" + std::to_string(lf::testing::free_port()), self},
      {{"LF_TEST_WORKER", "launch_convention"}, {"LF_TEST_CONVENTION", "torchrun-real"},
       {"OMP_NUM_THREADS", "1"}},
      std::chrono::seconds(120));
  EXPECT_TRUE(res.ok()) << res.output;
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(res.output.find("convention torchrun-real rank " + std::to_string(r) +
                              " of 3 local " + std::to_string(r) + "/3 master 127.0.0.1 sum 6"),
              std::string::npos) << res.output;
}

}  // namespace
}  // namespace lf::dist

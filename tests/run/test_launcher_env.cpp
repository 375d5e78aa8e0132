// Process tests of loongforge-run on the success path: the environment each worker sees, the
// per-rank log files, what reaches the terminal, and two launchers forming one world.
#include <gtest/gtest.h>

#include "launcher_harness.h"

namespace lf::run::testing {
namespace {

TEST(Launcher, FourLocalWorkersGetTorchrunEnvironment) {
  std::string dir = lf::testing::make_temp_dir("run-env");
  int port = lf::testing::free_port();
  auto r = lf::testing::run_command(
      launch_argv({"--nproc-per-node", "4", "--master-port", std::to_string(port), "--log-dir", dir}, {"env"}),
      {}, 30s);
  ASSERT_TRUE(r.ok()) << describe(r);
  for (int rank = 0; rank < 4; ++rank) {
    auto env = parse_env(read_file(dir + "/rank" + std::to_string(rank) + ".log"));
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], std::to_string(port));
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(env["LOONGFORGE_RESTART_COUNT"], "0");
    EXPECT_EQ(env["LOONGFORGE_LOG_ALL_RANKS"], "1");
    if (!std::getenv("OMP_NUM_THREADS")) {
      EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
    }
  }
  if (!std::getenv("OMP_NUM_THREADS")) {
    EXPECT_NE(r.output.find("setting OMP_NUM_THREADS=1"), std::string::npos) << r.output;
  }
}

TEST(Launcher, LogFilesHoldBothStreamsAndOnlyRankZeroReachesTheTerminal) {
  std::string dir = lf::testing::make_temp_dir("run-logs");
  auto r = lf::testing::run_command(launch_argv({"--nproc-per-node", "2", "--log-dir", dir + "/logs"}, {"env"}), {}, 30s);
  ASSERT_TRUE(r.ok()) << describe(r);
  for (int rank = 0; rank < 2; ++rank) {
    std::string log = read_file(dir + "/logs/rank" + std::to_string(rank) + ".log");
    EXPECT_NE(log.find("\nRANK=" + std::to_string(rank) + "\n"), std::string::npos) << log;
    EXPECT_NE(log.find("stderr line from rank " + std::to_string(rank) + "\n"), std::string::npos) << log;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/logs/rank2.log"));
  // Rank 0 is printed unprefixed; rank 1 stays in its file.
  EXPECT_NE(r.output.find("stderr line from rank 0\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nRANK=0\n"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("from rank 1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("RANK=1\n"), std::string::npos) << r.output;
}

TEST(Launcher, TerminalRanksAllPrefixesEachLineWithItsRank) {
  auto r = lf::testing::run_command(launch_argv({"--nproc-per-node", "2", "--terminal-ranks", "all"}, {"env"}), {}, 30s);
  ASSERT_TRUE(r.ok()) << describe(r);
  EXPECT_NE(r.output.find("[rank 0] stderr line from rank 0\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] stderr line from rank 1\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] RANK=1\n"), std::string::npos) << r.output;
}

TEST(Launcher, TwoLaunchersFormOneWorldOverLoopback) {
  std::string dir = lf::testing::make_temp_dir("run-2nodes");
  std::string port = std::to_string(lf::testing::free_port());
  auto node = [&](int k) {
    return launch_async(launch_argv({"--nnodes", "2", "--node-rank", std::to_string(k), "--nproc-per-node", "2",
                                     "--master-addr", "127.0.0.1", "--master-port", port, "--log-dir",
                                     dir + "/node" + std::to_string(k)},
                                    {"rendezvous"}),
                        dir);
  };
  // Node 1 first: its ranks must wait for rank 0, as they would on a real cluster.
  auto n1 = node(1);
  auto n0 = node(0);
  auto r0 = n0.get(), r1 = n1.get();
  ASSERT_TRUE(r0.ok()) << describe(r0);
  ASSERT_TRUE(r1.ok()) << describe(r1);
  struct Expect {
    int node, rank, local;
  };
  for (Expect e : {Expect{0, 0, 0}, Expect{0, 1, 1}, Expect{1, 2, 0}, Expect{1, 3, 1}}) {
    std::string log = read_file(dir + "/node" + std::to_string(e.node) + "/rank" + std::to_string(e.rank) + ".log");
    std::string want = "RANK=" + std::to_string(e.rank) + " GROUP_RANK=" + std::to_string(e.node) +
                       " LOCAL_RANK=" + std::to_string(e.local) + " WORLD_SIZE=4\n";
    EXPECT_EQ(log.rfind(want, 0), 0u) << "node " << e.node << " rank " << e.rank << ":\n" << log;
  }
  EXPECT_NE(read_file(dir + "/node0/rank0.log").find("world formed: 0,1,2,3\n"), std::string::npos);
  EXPECT_NE(read_file(dir + "/node1/rank3.log").find("joined a world of 4\n"), std::string::npos);
  // Each node keeps only its own ranks' files.
  EXPECT_FALSE(std::filesystem::exists(dir + "/node0/rank2.log"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/node1/rank0.log"));
}

TEST(Launcher, BadFlagsExitTwoNamingTheFlag) {
  struct Case {
    std::vector<std::string> argv;
    std::string message;  // what follows "loongforge-run: error: "
  };
  std::vector<Case> cases = {
      {launch_argv({"--nproc-per-node", "0"}, {"env"}), "--nproc-per-node 0"},
      {launch_argv({"--nnodes", "2", "--node-rank", "5"}, {"env"}), "--node-rank 5"},
      {launch_argv({"--master-port", "123456"}, {"env"}), "--master-port 123456"},
      {launch_argv({"--frobnicate"}, {"env"}), "unknown flag --frobnicate"},
      {{launcher_path(), "--nproc-per-node", "2"}, "missing the worker command"},
  };
  for (const auto& c : cases) {
    auto r = lf::testing::run_command(c.argv, {}, 30s);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_NE(r.output.find("loongforge-run: error: " + c.message), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("HINT: "), std::string::npos) << r.output;
  }
  auto help = lf::testing::run_command({launcher_path(), "--help"}, {}, 30s);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--max-restarts"), std::string::npos) << help.output;
}

}  // namespace
}  // namespace lf::run::testing

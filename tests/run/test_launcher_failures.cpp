// Process tests of loongforge-run's supervision: a failed or killed worker stops the group and
// is reported; signals to the launcher reach the workers; restarts; no orphan on any path.
#include <gtest/gtest.h>

#include "launcher_harness.h"

namespace lf::run::testing {
namespace {

using Clock = std::chrono::steady_clock;

void expect_all_gone(const std::map<int, WorkerPids>& pids) {
  for (const auto& [rank, p] : pids) EXPECT_FALSE(process_alive(p.pid)) << "rank " << rank << " pid " << p.pid << " survived";
}

// The "Done means" test of the launcher issue.
TEST(LauncherFailure, SigkillOfOneWorkerEndsTheOthersAndNamesTheRank) {
  std::string dir = lf::testing::make_temp_dir("run-sigkill");
  auto run = launch_async(launch_argv({"--nproc-per-node", "3", "--log-dir", dir + "/logs"}, {"sleep"}), dir);
  auto pids = wait_for_pid_files(dir, 3);
  ASSERT_EQ(pids.size(), 3u) << "workers did not start";
  ASSERT_EQ(kill(pids[1].pid, SIGKILL), 0);
  auto killed_at = Clock::now();
  ASSERT_EQ(run.wait_for(10s), std::future_status::ready) << "launcher still running 10 s after the SIGKILL";
  auto r = run.get();
  EXPECT_LT(Clock::now() - killed_at, 10s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << describe(r);
  std::string named = "loongforge-run: rank 1 (local 1, pid " + std::to_string(pids[1].pid) +
                      ") was killed by signal SIGKILL (9)";
  EXPECT_NE(r.output.find(named), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] ready rank 1"), std::string::npos) << "log tail missing:\n" << r.output;
  EXPECT_NE(r.output.find("stopping the other 2 workers"), std::string::npos) << r.output;
  expect_all_gone(pids);
}

TEST(LauncherFailure, NonZeroExitStopsTheOthersAndShowsTheLogTail) {
  std::string dir = lf::testing::make_temp_dir("run-exit3");
  // A grace period far beyond the wait below: only a prompt SIGTERM to the others passes.
  auto run = launch_async(
      launch_argv({"--nproc-per-node", "3", "--grace-period", "60", "--log-dir", dir + "/logs"}, {"fail-rank", "1", "3"}),
      dir);
  ASSERT_EQ(run.wait_for(20s), std::future_status::ready);
  auto r = run.get();
  auto pids = wait_for_pid_files(dir, 3, 0s);
  ASSERT_EQ(pids.size(), 3u) << describe(r);
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_NE(r.output.find("loongforge-run: rank 1 (local 1, pid " + std::to_string(pids[1].pid) + ") exited with code 3"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(full log: " + dir + "/logs/rank1.log)"), std::string::npos) << r.output;
  // The tail is the last 30 lines: "line 11" .. "line 40".
  EXPECT_NE(r.output.find("[rank 1] line 11\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] line 40\n"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[rank 1] line 10\n"), std::string::npos) << r.output;
  EXPECT_NE(read_file(dir + "/logs/rank1.log").find("line 1\nline 2\n"), std::string::npos);
  expect_all_gone(pids);
}

TEST(LauncherFailure, CrashBySignalIsReportedWithItsName) {
  auto r = lf::testing::run_command(launch_argv({}, {"signal", std::to_string(SIGSEGV)}), {}, 30s);
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV) << describe(r);
  EXPECT_NE(r.output.find(") was killed by signal SIGSEGV (11)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 wrote no output"), std::string::npos) << r.output;
}

TEST(LauncherFailure, SigtermToTheLauncherStopsEveryWorker) {
  std::string dir = lf::testing::make_temp_dir("run-sigterm");
  auto run = launch_async(launch_argv({"--nproc-per-node", "2"}, {"sleep"}), dir);
  auto pids = wait_for_pid_files(dir, 2);
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(pids[0].launcher, pids[1].launcher);
  auto t0 = Clock::now();
  ASSERT_EQ(kill(pids[0].launcher, SIGTERM), 0);
  ASSERT_EQ(run.wait_for(10s), std::future_status::ready);
  auto r = run.get();
  // Well inside the default 30 s grace period: the workers got SIGTERM, not a late SIGKILL.
  EXPECT_LT(Clock::now() - t0, 4s);
  EXPECT_EQ(r.exit_code, 143) << describe(r);
  EXPECT_NE(r.output.find("loongforge-run: received SIGTERM, forwarding it to 2 workers (SIGKILL after 30 s)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("was killed by signal"), std::string::npos) << "a requested stop is no failure:\n" << r.output;
  expect_all_gone(pids);
}

TEST(LauncherFailure, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  std::string dir = lf::testing::make_temp_dir("run-grace");
  auto run = launch_async(launch_argv({"--nproc-per-node", "2", "--grace-period", "0.3"}, {"sleep-ignore-term"}), dir);
  auto pids = wait_for_pid_files(dir, 2);
  ASSERT_EQ(pids.size(), 2u);
  auto t0 = Clock::now();
  ASSERT_EQ(kill(pids[0].launcher, SIGTERM), 0);
  ASSERT_EQ(run.wait_for(10s), std::future_status::ready);
  auto r = run.get();
  auto took = Clock::now() - t0;
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << describe(r);
  EXPECT_GE(took, 300ms);  // the workers got their grace period
  EXPECT_LT(took, 5s);
  EXPECT_NE(r.output.find("2 workers still running after the 0.3 s grace period; sending SIGKILL"), std::string::npos)
      << r.output;
  expect_all_gone(pids);
}

// As torchrun: the workers get the signal the launcher got (Ctrl-C gives them SIGINT), and
// --signals-to-handle adds SIGUSR1 (Slurm's preemption warning) to the signals forwarded.
TEST(LauncherFailure, TheLauncherForwardsTheSignalItReceived) {
  for (const auto& [sig, extra] : std::vector<std::pair<int, std::vector<std::string>>>{
           {SIGINT, {}}, {SIGQUIT, {}}, {SIGUSR1, {"--signals-to-handle", "SIGTERM,SIGUSR1"}}}) {
    std::string dir = lf::testing::make_temp_dir("run-forward");
    std::vector<std::string> flags{"--nproc-per-node", "2", "--log-dir", dir + "/logs"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    auto run = launch_async(launch_argv(flags, {"sleep-report-signal"}), dir);
    auto pids = wait_for_pid_files(dir, 2);
    ASSERT_EQ(pids.size(), 2u);
    ASSERT_EQ(kill(pids[0].launcher, sig), 0);
    ASSERT_EQ(run.wait_for(10s), std::future_status::ready);
    auto r = run.get();
    EXPECT_EQ(r.exit_code, 128 + sig) << describe(r);
    for (int rank = 0; rank < 2; ++rank)
      EXPECT_NE(read_file(dir + "/logs/rank" + std::to_string(rank) + ".log").find("got signal " + std::to_string(sig)),
                std::string::npos)
          << "signal " << sig << " rank " << rank << "\n" << r.output;
    expect_all_gone(pids);
  }
}

TEST(LauncherFailure, WorkersDieWhenTheLauncherIsSigkilled) {
  std::string dir = lf::testing::make_temp_dir("run-orphans");
  auto run = launch_async(launch_argv({"--nproc-per-node", "2"}, {"sleep"}), dir);
  auto pids = wait_for_pid_files(dir, 2);
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(kill(pids[0].launcher, SIGKILL), 0);
  auto r = run.get();
  EXPECT_EQ(r.signal, SIGKILL) << describe(r);
  // PR_SET_PDEATHSIG: the kernel kills them, no launcher code runs.
  for (const auto& [rank, p] : pids) EXPECT_TRUE(wait_gone(p.pid, 5000ms)) << "rank " << rank << " orphaned";
}

TEST(LauncherFailure, MaxRestartsRestartsTheGroupWithTheNextRestartCount) {
  std::string dir = lf::testing::make_temp_dir("run-restart");
  auto r = lf::testing::run_command(
      launch_argv({"--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", dir}, {"fail-first", "5"}), {}, 30s);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.output.find(") exited with code 5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("loongforge-run: restarting the worker group: restart 1 of 1 (--max-restarts)"),
            std::string::npos)
      << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    std::string log = read_file(dir + "/rank" + std::to_string(rank) + ".log");
    auto sep = log.find("==== loongforge-run: restart 1 of 1 ====\n");
    ASSERT_NE(sep, std::string::npos) << log;
    auto env = parse_env(log.substr(sep));
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOONGFORGE_RESTART_COUNT"], "1");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "1");
    EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "1");
  }
}

TEST(LauncherFailure, ExhaustedRestartsReturnTheWorkersCode) {
  auto r = lf::testing::run_command(launch_argv({"--max-restarts", "2"}, {"exit", "4"}), {}, 30s);
  EXPECT_EQ(r.exit_code, 4) << describe(r);
  EXPECT_NE(r.output.find("restart 2 of 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("giving up after 2 restarts (--max-restarts 2)"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace lf::run::testing

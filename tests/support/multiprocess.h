// Multi-process tests: a test body runs a named worker case in N fresh processes (this test
// binary re-executed), each with the torchrun environment of one rank, and inspects their exit
// status and output. Not a launcher for users; see tools/run for that.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace lf::testing {

struct RankResult {
  int rank = -1;
  int exit_code = -1;   // valid when signal == 0
  int signal = 0;       // the signal that ended the process, 0 if it exited
  bool timed_out = false;
  std::string output;   // stdout and stderr interleaved
  bool ok() const { return signal == 0 && exit_code == 0 && !timed_out; }
};

struct SpawnOptions {
  int world_size = 2;
  std::chrono::seconds timeout{120};
  // Extra environment, applied to every rank.
  std::vector<std::pair<std::string, std::string>> env;
  // Extra command-line arguments for the worker.
  std::vector<std::string> args;
};

using WorkerFn = void (*)();

struct WorkerRegistrar {
  WorkerRegistrar(const char* name, WorkerFn fn);
};

// Runs worker case `name` on world_size ranks and waits for all of them (or the timeout, after
// which the rest are killed). RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT (a free loopback port) are set for each rank.
std::vector<RankResult> run_workers(const std::string& name, const SpawnOptions& options);

// gtest assertion helper: every rank exited 0; otherwise prints each failed rank's output.
void expect_all_ok(const std::vector<RankResult>& results);

// The rank / world size of the current worker process (from the environment).
int worker_rank();
int worker_world_size();
// Arguments passed through SpawnOptions::args.
const std::vector<std::string>& worker_args();

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

// Path of a fresh empty directory under the test temp dir; removed at process exit by no one
// (ctest's build tree keeps them for post-mortems).
std::string make_temp_dir(const std::string& prefix);

// Paths from the build: the source tree and the build tree (bin/ holds the programs).
std::string source_dir();
std::string binary_dir();

// Runs a command (argv) with extra env, captures output, waits up to timeout.
RankResult run_command(const std::vector<std::string>& argv,
                       const std::vector<std::pair<std::string, std::string>>& env = {},
                       std::chrono::seconds timeout = std::chrono::seconds(120));

// Removes every directory make_temp_dir made in this process (test_main calls it when all tests
// passed; failures keep theirs for inspection; LOONGFORGE_KEEP_TEST_DIRS=1 keeps everything).
void remove_temp_dirs();

}  // namespace lf::testing

// Defines a worker case. Its body may use gtest EXPECT_*/ASSERT_* (a failure makes the worker
// exit 1) or throw (the exception is printed, exit 1).
#define LF_WORKER_CASE(name)                                                       \
  static void lf_worker_case_##name();                                            \
  static ::lf::testing::WorkerRegistrar lf_worker_registrar_##name(#name,         \
                                                                   lf_worker_case_##name); \
  static void lf_worker_case_##name()

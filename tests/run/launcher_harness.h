// Helpers for the loongforge-run process tests: paths of the launcher and the fake worker,
// running the launcher in the background, reading the fake worker's pid files and logs.
// Not a launcher and not a general process library (tests/support/multiprocess.h is that).
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "multiprocess.h"

namespace lf::run::testing {

using namespace std::chrono_literals;
using lf::testing::RankResult;

inline std::string launcher_path() { return lf::testing::binary_dir() + "/bin/loongforge-run"; }
inline std::string fake_worker_path() { return lf::testing::binary_dir() + "/bin/loongforge_fake_worker"; }

// argv = launcher, flags..., fake worker, mode args...
inline std::vector<std::string> launch_argv(std::vector<std::string> flags, std::vector<std::string> mode) {
  std::vector<std::string> argv{launcher_path()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(fake_worker_path());
  argv.insert(argv.end(), mode.begin(), mode.end());
  return argv;
}

// The launcher running in the background (its own process group, killed after `timeout`).
inline std::future<RankResult> launch_async(std::vector<std::string> argv, std::string pid_dir,
                                            std::chrono::seconds timeout = 30s) {
  return std::async(std::launch::async, [argv = std::move(argv), pid_dir, timeout] {
    return lf::testing::run_command(argv, {{"FAKE_WORKER_DIR", pid_dir}}, timeout);
  });
}

struct WorkerPids {
  pid_t pid = -1;
  pid_t launcher = -1;  // the worker's parent
};

// Waits until `n` workers wrote <dir>/rank<R>.pid; returns them by rank (empty on timeout).
inline std::map<int, WorkerPids> wait_for_pid_files(const std::string& dir, int n,
                                                   std::chrono::seconds timeout = 10s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {  // looks at least once, also with a zero timeout
    std::map<int, WorkerPids> out;
    for (int r = 0; r < 64; ++r) {
      std::ifstream f(dir + "/rank" + std::to_string(r) + ".pid");
      WorkerPids p;
      if (f >> p.pid >> p.launcher) out[r] = p;
    }
    if (static_cast<int>(out.size()) >= n) return out;
    if (std::chrono::steady_clock::now() >= deadline) return {};
    std::this_thread::sleep_for(5ms);
  }
}

// Alive means signalable and not a zombie (an orphan's zombie waits for a reaper; it runs no code).
inline bool process_alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

// True once the process is gone, polling up to `timeout`.
inline bool wait_gone(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (process_alive(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// KEY=VALUE lines of a fake worker's `env` output (other lines ignored).
inline std::map<std::string, std::string> parse_env(const std::string& text) {
  std::map<std::string, std::string> env;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    if (eq != std::string::npos && eq > 0) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

inline std::string describe(const RankResult& r) {
  return "exit " + std::to_string(r.exit_code) + " signal " + std::to_string(r.signal) +
         (r.timed_out ? " (timed out)" : "") + "\n--- launcher output ---\n" + r.output;
}

}  // namespace lf::run::testing

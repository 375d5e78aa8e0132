// The worker processes of one node for one attempt: fork+exec with the rank environment, each in
// its own process group (so a whole worker tree is signalled at once) and with PDEATHSIG (so they
// die even if the launcher is SIGKILLed); their stdout/stderr routed to per-rank log files, the
// terminal and an in-memory tail. Not the supervision policy (supervisor.h decides who to stop).
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "launch_options.h"

namespace lf::run {

struct Worker {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;            // also its process group id
  int fds[2] = {-1, -1};     // read ends of its stdout and stderr pipes
  int log_fd = -1;           // <log-dir>/rank<R>.log, or -1
  std::string log_path;
  bool running = false;
  int exit_code = -1;        // valid when term_signal == 0 and !running
  int term_signal = 0;
  std::string tail;          // the last kTailBytes of stdout+stderr, in arrival order
  std::string partial[2];    // an unfinished line per stream, for prefixed terminal output

  bool succeeded() const { return !running && term_signal == 0 && exit_code == 0; }
  // "exited with code 3" / "was killed by signal SIGKILL (9)"
  std::string describe_exit() const;
};

class WorkerGroup {
 public:
  static constexpr std::size_t kTailBytes = 64 * 1024;

  // `child_sigmask`: the signal mask workers start with (the launcher's mask before it blocked
  // the signals it reads through a signalfd).
  WorkerGroup(const LaunchOptions& options, int restart_count, const sigset_t& child_sigmask);
  // SIGKILLs every process group still running and reaps it: no worker outlives the group
  // object, whatever path (return, exception) leaves the supervisor.
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Opens the log files and starts every local rank. Throws lf::Error if fork/pipe/open fail
  // (already started workers are then cleaned up by the destructor).
  void start();

  std::size_t size() const { return workers_.size(); }
  const Worker& worker(std::size_t i) const { return workers_[i]; }
  std::size_t running_count() const;

  // Poll set for the open output pipes; `tags` receives (worker index * 2 + stream) per entry.
  void add_poll_fds(std::vector<pollfd>& fds, std::vector<int>& tags) const;
  // Reads what is available on one stream (tag from add_poll_fds) and routes it.
  void pump(int tag);
  // Reads everything a worker has already written (both streams, without blocking).
  void drain(std::size_t i);
  void drain_all();

  // Reaps exited workers; returns the indices of those that ended since the last call. Before
  // reaping a worker, SIGKILLs what is left of its process group (grandchildren it left behind).
  std::vector<std::size_t> reap();

  // Sends `sig` to the process group of every running worker.
  void signal_running(int sig);

  // The last `lines` lines of worker i's output.
  std::string tail_lines(std::size_t i, std::size_t lines) const;

 private:
  void spawn(Worker& w);
  void route(Worker& w, int stream, const char* data, std::size_t n);
  void close_stream(Worker& w, int stream);

  const LaunchOptions& options_;
  int restart_count_;
  sigset_t child_sigmask_;
  std::vector<Worker> workers_;
};

// "SIGKILL", "SIGSEGV", ... ("SIG<n>" for the rare ones).
std::string signal_name(int sig);

}  // namespace lf::run

#include "supervisor.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "loongforge/core/error.h"
#include "worker_env.h"
#include "worker_group.h"

namespace lf::run {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kReportLines = 30;

void say(const std::string& line) {
  std::string s = "loongforge-run: " + line + "\n";
  const char* p = s.data();
  std::size_t n = s.size();
  while (n > 0) {
    ssize_t k = write(2, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

// Signals the launcher reads synchronously: blocked, and delivered through one fd that the
// supervision loop polls next to the worker pipes (no handler, no self-pipe races). The mask
// before blocking is what the workers get back.
class SignalChannel {
 public:
  explicit SignalChannel(const std::vector<int>& handled) {
    sigset_t mine;
    sigemptyset(&mine);
    sigaddset(&mine, SIGCHLD);
    for (int s : handled) sigaddset(&mine, s);
    LF_CHECK(sigprocmask(SIG_BLOCK, &mine, &original_) == 0, "sigprocmask: ", std::strerror(errno));
    fd_ = signalfd(-1, &mine, SFD_CLOEXEC | SFD_NONBLOCK);
    if (fd_ < 0) {
      int e = errno;
      sigprocmask(SIG_SETMASK, &original_, nullptr);
      LF_FAIL("signalfd: ", std::strerror(e));
    }
    // Writing to a terminal or pipe that went away must not kill the supervisor.
    old_pipe_ = signal(SIGPIPE, SIG_IGN);
  }
  ~SignalChannel() {
    close(fd_);
    signal(SIGPIPE, old_pipe_);
    sigprocmask(SIG_SETMASK, &original_, nullptr);
  }
  SignalChannel(const SignalChannel&) = delete;
  SignalChannel& operator=(const SignalChannel&) = delete;

  int fd() const { return fd_; }
  const sigset_t& original_mask() const { return original_; }
  // The next pending signal number, or 0.
  int next() {
    signalfd_siginfo si;
    ssize_t n = read(fd_, &si, sizeof si);
    return n == static_cast<ssize_t>(sizeof si) ? static_cast<int>(si.ssi_signo) : 0;
  }

 private:
  int fd_ = -1;
  sigset_t original_;
  sighandler_t old_pipe_ = SIG_DFL;
};

struct AttemptResult {
  int launcher_signal = 0;  // a signal of --signals-to-handle received by the launcher, or 0
  long failed = -1;         // index of the first worker that failed, or -1
  int failed_code = 0;      // its exit code, or 128 + its signal
};

// One attempt: watch the group until every worker has ended.
class AttemptSupervisor {
 public:
  AttemptSupervisor(const LaunchOptions& o, WorkerGroup& g, SignalChannel& s)
      : options_(o), group_(g), signals_(s) {}

  AttemptResult run() {
    while (group_.running_count() > 0) {
      std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
      std::vector<int> tags;
      group_.add_poll_fds(fds, tags);
      if (poll(fds.data(), fds.size(), poll_timeout_ms()) < 0 && errno != EINTR)
        LF_FAIL("poll: ", std::strerror(errno));
      if (fds[0].revents) handle_signals();
      for (std::size_t k = 1; k < fds.size(); ++k)
        if (fds[k].revents) group_.pump(tags[k - 1]);
      for (std::size_t i : group_.reap()) on_exit(i);
      if (stopping_ && !killed_ && Clock::now() >= kill_at_) escalate();
    }
    group_.drain_all();
    return result_;
  }

 private:
  int poll_timeout_ms() const {
    // The periodic wake-up is a safety net only: SIGCHLD arrives through the signalfd.
    if (!stopping_ || killed_) return 1000;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - Clock::now()).count();
    return static_cast<int>(std::max<long long>(0, std::min<long long>(left + 1, 1000)));
  }

  void handle_signals() {
    for (int sig; (sig = signals_.next()) != 0;) {
      if (sig == SIGCHLD) continue;  // reaped below in the loop
      if (result_.launcher_signal == 0) {
        result_.launcher_signal = sig;
        say("received " + signal_name(sig) + ", forwarding it to " + std::to_string(group_.running_count()) +
            " workers (SIGKILL after " + format_seconds(options_.grace_period_s) + ")");
        begin_stop(sig);  // as torchrun: the workers get the signal the launcher got
      } else if (!killed_) {
        say("received " + signal_name(sig) + " again, killing the workers now");
        escalate();
      }
    }
  }

  void on_exit(std::size_t i) {
    group_.drain(i);  // the tail must hold its last words
    const Worker& w = group_.worker(i);
    // While stopping, workers ending (from our SIGTERM or otherwise) are not new failures.
    if (w.succeeded() || stopping_) return;
    result_.failed = static_cast<long>(i);
    result_.failed_code = w.term_signal ? 128 + w.term_signal : w.exit_code;
    std::size_t others = group_.running_count();
    begin_stop();  // first, so the report's time does not delay the others' shutdown
    say("rank " + std::to_string(w.global_rank) + " (local " + std::to_string(w.local_rank) + ", pid " +
        std::to_string(w.pid) + ") " + w.describe_exit());
    std::string tail = group_.tail_lines(i, kReportLines);
    std::string where = w.log_path.empty() ? "" : " (full log: " + w.log_path + ")";
    if (tail.empty()) {
      say("rank " + std::to_string(w.global_rank) + " wrote no output" + where);
    } else {
      say("last lines of rank " + std::to_string(w.global_rank) + where + ":");
      std::string block, prefix = "[rank " + std::to_string(w.global_rank) + "] ";
      std::size_t start = 0;
      while (start <= tail.size()) {
        std::size_t nl = tail.find('\n', start);
        if (nl == std::string::npos) nl = tail.size();
        block += prefix + tail.substr(start, nl - start) + "\n";
        start = nl + 1;
      }
      (void)!write(2, block.data(), block.size());
    }
    if (others > 0)
      say("stopping the other " + std::to_string(others) + " workers (SIGTERM, SIGKILL after " +
          format_seconds(options_.grace_period_s) + ")");
  }

  void begin_stop(int sig = SIGTERM) {
    if (stopping_) return;
    stopping_ = true;
    kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(options_.grace_period_s));
    group_.signal_running(sig);
  }

  void escalate() {
    killed_ = true;
    std::size_t n = group_.running_count();
    if (n == 0) return;
    if (result_.launcher_signal == 0 || Clock::now() >= kill_at_)
      say(std::to_string(n) + " workers still running after the " + format_seconds(options_.grace_period_s) +
          " grace period; sending SIGKILL");
    group_.signal_running(SIGKILL);
  }

  static std::string format_seconds(double s) {
    std::string t = std::to_string(s);
    t.erase(t.find_last_not_of('0') + 1);
    if (!t.empty() && t.back() == '.') t.pop_back();
    return t + " s";
  }

  const LaunchOptions& options_;
  WorkerGroup& group_;
  SignalChannel& signals_;
  AttemptResult result_;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_at_{};
};

}  // namespace

int run_launcher(const LaunchOptions& options) {
  SignalChannel signals(options.signals_to_handle);
  std::vector<std::string> notes;
  worker_env_defaults(options, &notes);
  for (const auto& n : notes) (void)!write(2, (n + "\n").data(), n.size() + 1);

  for (int restart = 0;; ++restart) {
    AttemptResult r;
    {
      WorkerGroup group(options, restart, signals.original_mask());
      group.start();
      r = AttemptSupervisor(options, group, signals).run();
    }
    if (r.launcher_signal != 0) return 128 + r.launcher_signal;
    if (r.failed < 0) return 0;
    if (restart >= options.max_restarts) {
      if (options.max_restarts > 0)
        say("giving up after " + std::to_string(options.max_restarts) + " restarts (--max-restarts " +
            std::to_string(options.max_restarts) + ")");
      return r.failed_code == 0 ? 1 : r.failed_code;
    }
    say("restarting the worker group: restart " + std::to_string(restart + 1) + " of " +
        std::to_string(options.max_restarts) + " (--max-restarts)");
  }
}

}  // namespace lf::run

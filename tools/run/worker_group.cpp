#include "worker_group.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "loongforge/core/error.h"
#include "worker_env.h"

namespace lf::run {
namespace {

void write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    ssize_t k = write(fd, data, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;  // a closed terminal or a full disk must not stop supervision
    data += k;
    n -= static_cast<std::size_t>(k);
  }
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    default: return "SIG" + std::to_string(sig);
  }
}

std::string Worker::describe_exit() const {
  if (running) return "is still running";
  if (term_signal != 0)
    return "was killed by signal " + signal_name(term_signal) + " (" + std::to_string(term_signal) + ")";
  return "exited with code " + std::to_string(exit_code);
}

WorkerGroup::WorkerGroup(const LaunchOptions& options, int restart_count, const sigset_t& child_sigmask)
    : options_(options), restart_count_(restart_count), child_sigmask_(child_sigmask) {
  for (int l = 0; l < options.nproc_per_node; ++l) {
    Worker w;
    w.local_rank = l;
    w.global_rank = options.global_rank(l);
    workers_.push_back(std::move(w));
  }
}

WorkerGroup::~WorkerGroup() {
  for (auto& w : workers_) {
    if (w.running) {
      kill(-w.pid, SIGKILL);
      kill(w.pid, SIGKILL);  // in case it left its group (setsid)
      int status;
      while (waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
      }
      w.running = false;
    }
    for (int s = 0; s < 2; ++s)
      if (w.fds[s] >= 0) close(w.fds[s]);
    if (w.log_fd >= 0) close(w.log_fd);
  }
}

void WorkerGroup::start() {
  if (!options_.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.log_dir, ec);
    LF_CHECK(!ec, "--log-dir ", options_.log_dir, ": cannot create the directory: ", ec.message(),
             lf::hint("give a writable directory"));
  }
  for (auto& w : workers_) spawn(w);
}

void WorkerGroup::spawn(Worker& w) {
  if (!options_.log_dir.empty()) {
    w.log_path = (std::filesystem::path(options_.log_dir) / ("rank" + std::to_string(w.global_rank) + ".log")).string();
    // Attempt 0 starts a fresh file; restarts append after a separator (docs/launcher.md).
    int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (restart_count_ == 0 ? O_TRUNC : 0);
    w.log_fd = open(w.log_path.c_str(), flags, 0644);
    LF_CHECK(w.log_fd >= 0, "--log-dir: cannot open ", w.log_path, ": ", std::strerror(errno),
             lf::hint("give a writable directory"));
    if (restart_count_ > 0) {
      std::string sep = "==== loongforge-run: restart " + std::to_string(restart_count_) + " of " +
                        std::to_string(options_.max_restarts) + " ====\n";
      write_all(w.log_fd, sep.data(), sep.size());
    }
  }

  int out[2], err[2];
  LF_CHECK(pipe2(out, O_CLOEXEC) == 0, "pipe for rank ", w.global_rank, ": ", std::strerror(errno));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    LF_FAIL("pipe for rank ", w.global_rank, ": ", std::strerror(errno));
  }

  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> args = options_.command;
  std::vector<std::string> env = build_worker_environment(
      worker_env_defaults(options_, nullptr), worker_env_overrides(options_, w.local_rank, restart_count_));
  std::vector<char*> argv = c_strings(args), envp = c_strings(env);
  const std::string exec_error = "loongforge-run: cannot execute '" + options_.executable + "': ";
  const pid_t launcher = getpid();

  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    // Die with the launcher. If it died between fork and prctl the parent is already someone
    // else, and no signal would ever come: exit now.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(1);
    // Workers run in a background process group: reading the tty would stop them (SIGTTIN).
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) dup2(devnull, 0);  // dup2 clears O_CLOEXEC on fd 0 only
    dup2(out[1], 1);
    dup2(err[1], 2);
    signal(SIGPIPE, SIG_DFL);  // the launcher ignores it; ignored dispositions survive exec
    sigprocmask(SIG_SETMASK, &child_sigmask_, nullptr);
    execve(options_.executable.c_str(), argv.data(), envp.data());
    const char* why = strerror(errno);
    (void)!write(2, exec_error.data(), exec_error.size());
    (void)!write(2, why, strlen(why));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  int fork_errno = errno;
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    LF_FAIL("fork for rank ", w.global_rank, ": ", std::strerror(fork_errno),
            lf::hint("check the process limit (ulimit -u) and free memory"));
  }
  setpgid(pid, pid);  // also here, so the group exists before we might signal it
  w.pid = pid;
  w.running = true;
  w.fds[0] = out[0];
  w.fds[1] = err[0];
  for (int fd : w.fds) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

std::size_t WorkerGroup::running_count() const {
  std::size_t n = 0;
  for (const auto& w : workers_) n += w.running ? 1 : 0;
  return n;
}

void WorkerGroup::add_poll_fds(std::vector<pollfd>& fds, std::vector<int>& tags) const {
  for (std::size_t i = 0; i < workers_.size(); ++i)
    for (int s = 0; s < 2; ++s)
      if (workers_[i].fds[s] >= 0) {
        fds.push_back({workers_[i].fds[s], POLLIN, 0});
        tags.push_back(static_cast<int>(i) * 2 + s);
      }
}

void WorkerGroup::route(Worker& w, int stream, const char* data, std::size_t n) {
  if (w.log_fd >= 0) write_all(w.log_fd, data, n);
  w.tail.append(data, n);
  if (w.tail.size() > kTailBytes) w.tail.erase(0, w.tail.size() - kTailBytes);
  if (!options_.terminal_ranks.includes(w.global_rank)) return;
  int term = stream == 0 ? 1 : 2;
  if (!options_.terminal_ranks.prefixed()) {
    write_all(term, data, n);
    return;
  }
  // Several ranks share the terminal: whole lines only, each tagged with its rank.
  std::string& p = w.partial[stream];
  p.append(data, n);
  std::string prefix = "[rank " + std::to_string(w.global_rank) + "] ", out;
  std::size_t start = 0;
  for (std::size_t nl; (nl = p.find('\n', start)) != std::string::npos; start = nl + 1)
    out += prefix + p.substr(start, nl + 1 - start);
  p.erase(0, start);
  write_all(term, out.data(), out.size());
}

void WorkerGroup::close_stream(Worker& w, int stream) {
  close(w.fds[stream]);
  w.fds[stream] = -1;
  std::string& p = w.partial[stream];
  if (!p.empty()) {
    std::string line = "[rank " + std::to_string(w.global_rank) + "] " + p + "\n";
    write_all(stream == 0 ? 1 : 2, line.data(), line.size());
    p.clear();
  }
}

void WorkerGroup::pump(int tag) {
  Worker& w = workers_[static_cast<std::size_t>(tag / 2)];
  int stream = tag % 2;
  if (w.fds[stream] < 0) return;
  char buf[65536];
  ssize_t n = read(w.fds[stream], buf, sizeof buf);
  if (n > 0) route(w, stream, buf, static_cast<std::size_t>(n));
  else if (n == 0 || (errno != EAGAIN && errno != EINTR)) close_stream(w, stream);
}

void WorkerGroup::drain(std::size_t i) {
  Worker& w = workers_[i];
  char buf[65536];
  for (int s = 0; s < 2; ++s) {
    while (w.fds[s] >= 0) {
      ssize_t n = read(w.fds[s], buf, sizeof buf);
      if (n > 0) {
        route(w, s, buf, static_cast<std::size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        // EAGAIN: a grandchild may still hold the pipe; what it writes later is not waited for.
        if (n == 0 || errno != EAGAIN) close_stream(w, s);
        break;
      }
    }
  }
}

void WorkerGroup::drain_all() {
  for (std::size_t i = 0; i < workers_.size(); ++i) drain(i);
}

std::vector<std::size_t> WorkerGroup::reap() {
  std::vector<std::size_t> ended;
  for (;;) {
    // WNOWAIT first: while the worker is an unreaped zombie its pid cannot be reused, so
    // signalling its process group cannot hit an unrelated process.
    siginfo_t info{};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) break;
    pid_t pid = info.si_pid;
    std::size_t i = 0;
    while (i < workers_.size() && !(workers_[i].running && workers_[i].pid == pid)) ++i;
    if (i < workers_.size()) kill(-pid, SIGKILL);
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) continue;
    if (i == workers_.size()) continue;  // not ours (the launcher starts no other children)
    Worker& w = workers_[i];
    w.running = false;
    if (WIFSIGNALED(status)) {
      w.term_signal = WTERMSIG(status);
    } else {
      w.exit_code = WEXITSTATUS(status);
    }
    ended.push_back(i);
  }
  return ended;
}

void WorkerGroup::signal_running(int sig) {
  for (auto& w : workers_) {
    if (!w.running) continue;
    if (kill(-w.pid, sig) != 0) kill(w.pid, sig);  // it may have left its group (setsid)
  }
}

std::string WorkerGroup::tail_lines(std::size_t i, std::size_t lines) const {
  const std::string& t = workers_[i].tail;
  std::size_t end = t.size();
  if (end > 0 && t[end - 1] == '\n') --end;  // a final newline does not start a line
  std::size_t start = end;
  for (std::size_t found = 0; start > 0; --start) {
    if (t[start - 1] == '\n' && ++found == lines) break;
  }
  return t.substr(start, end - start);
}

}  // namespace lf::run

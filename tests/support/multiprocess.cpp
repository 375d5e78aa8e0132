#include "multiprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <thread>

namespace lf::testing {
namespace {
std::map<std::string, WorkerFn>& registry() {
  static std::map<std::string, WorkerFn> r;
  return r;
}
std::vector<std::string> g_worker_args;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

struct Child {
  pid_t pid = -1;
  int fd = -1;  // read end of the output pipe
  RankResult result;
  bool done = false;
};

Child spawn(const std::vector<std::string>& argv,
            const std::vector<std::pair<std::string, std::string>>& env) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(pipefd[1]);
  Child c;
  c.pid = pid;
  c.fd = pipefd[0];
  fcntl(c.fd, F_SETFL, O_NONBLOCK);
  return c;
}

// Drains output and reaps children until all are done or the deadline passes.
void wait_all(std::vector<Child>& children, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[65536];
  size_t remaining = children.size();
  while (remaining > 0) {
    std::vector<pollfd> fds;
    for (auto& c : children)
      if (c.fd >= 0) fds.push_back({c.fd, POLLIN, 0});
    if (!fds.empty()) poll(fds.data(), fds.size(), 50);
    else std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (auto& c : children) {
      if (c.fd >= 0) {
        ssize_t n;
        while ((n = read(c.fd, buf, sizeof buf)) > 0) c.result.output.append(buf, n);
        if (n == 0) { close(c.fd); c.fd = -1; }
      }
      if (!c.done) {
        int status;
        if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
          c.done = true;
          --remaining;
          if (WIFEXITED(status)) c.result.exit_code = WEXITSTATUS(status);
          else if (WIFSIGNALED(status)) c.result.signal = WTERMSIG(status);
        }
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (auto& c : children) {
        if (!c.done) {
          c.result.timed_out = true;
          kill(-c.pid, SIGKILL);
          kill(c.pid, SIGKILL);
          int status;
          waitpid(c.pid, &status, 0);
          c.done = true;
          if (WIFSIGNALED(status)) c.result.signal = WTERMSIG(status);
        }
      }
      break;
    }
  }
  for (auto& c : children) {
    if (c.fd >= 0) {
      ssize_t n;
      while ((n = read(c.fd, buf, sizeof buf)) > 0) c.result.output.append(buf, n);
      close(c.fd);
      c.fd = -1;
    }
  }
}

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }
}  // namespace

WorkerRegistrar::WorkerRegistrar(const char* name, WorkerFn fn) { registry()[name] = fn; }

int worker_rank() { return env_int("RANK", 0); }
int worker_world_size() { return env_int("WORLD_SIZE", 1); }
const std::vector<std::string>& worker_args() { return g_worker_args; }

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

namespace {
// The directories this test process made; removed when its tests pass (remove_temp_dirs).
std::vector<std::string>& temp_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}
}  // namespace

std::string make_temp_dir(const std::string& prefix) {
  auto base = std::filesystem::temp_directory_path() / "loongforge-tests";
  std::filesystem::create_directories(base);
  std::string templ = (base / (prefix + "-XXXXXX")).string();
  if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed for " + templ);
  temp_dirs().push_back(templ);
  return templ;
}

void remove_temp_dirs() {
  if (const char* keep = std::getenv("LOONGFORGE_KEEP_TEST_DIRS"); keep && *keep) return;
  for (const auto& d : temp_dirs()) {
    std::error_code ec;  // best effort: a directory another process still writes may stay
    std::filesystem::remove_all(d, ec);
  }
  temp_dirs().clear();
}

std::string source_dir() {
  const char* s = std::getenv("LOONGFORGE_SOURCE_DIR");
  return s ? s : LOONGFORGE_TEST_SOURCE_DIR;
}
std::string binary_dir() {
  const char* s = std::getenv("LOONGFORGE_BINARY_DIR");
  return s ? s : LOONGFORGE_TEST_BINARY_DIR;
}

std::vector<RankResult> run_workers(const std::string& name, const SpawnOptions& options) {
  if (!registry().count(name)) throw std::runtime_error("no worker case named " + name);
  int port = free_port();
  std::vector<Child> children;
  for (int r = 0; r < options.world_size; ++r) {
    std::vector<std::pair<std::string, std::string>> env = {
        {"LF_TEST_WORKER", name},
        {"RANK", std::to_string(r)},
        {"LOCAL_RANK", std::to_string(r)},
        {"WORLD_SIZE", std::to_string(options.world_size)},
        {"LOCAL_WORLD_SIZE", std::to_string(options.world_size)},
        {"GROUP_RANK", "0"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(port)},
        {"OMP_NUM_THREADS", "1"},
    };
    env.insert(env.end(), options.env.begin(), options.env.end());
    std::vector<std::string> argv = {self_exe()};
    argv.insert(argv.end(), options.args.begin(), options.args.end());
    children.push_back(spawn(argv, env));
    children.back().result.rank = r;
  }
  wait_all(children, options.timeout);
  std::vector<RankResult> out;
  for (auto& c : children) out.push_back(std::move(c.result));
  return out;
}

RankResult run_command(const std::vector<std::string>& argv,
                       const std::vector<std::pair<std::string, std::string>>& env,
                       std::chrono::seconds timeout) {
  std::vector<Child> children;
  children.push_back(spawn(argv, env));
  wait_all(children, timeout);
  return std::move(children[0].result);
}

void expect_all_ok(const std::vector<RankResult>& results) {
  for (const auto& r : results) {
    EXPECT_TRUE(r.ok()) << "rank " << r.rank << (r.timed_out ? " timed out" : "")
                        << " exit " << r.exit_code << " signal " << r.signal << "\n--- output ---\n"
                        << r.output;
  }
}

// Called from test_main when LF_TEST_WORKER is set.
int run_worker_main(int argc, char** argv) {
  const char* name = std::getenv("LF_TEST_WORKER");
  for (int i = 1; i < argc; ++i) g_worker_args.emplace_back(argv[i]);
  auto it = registry().find(name);
  if (it == registry().end()) {
    fprintf(stderr, "no worker case named %s\n", name);
    return 2;
  }
  try {
    it->second();
  } catch (const std::exception& e) {
    fprintf(stderr, "worker %s rank %d threw: %s\n", name, worker_rank(), e.what());
    return 1;
  }
  fflush(stdout);
  return ::testing::UnitTest::GetInstance()->ad_hoc_test_result().Failed() ? 1 : 0;
}
}  // namespace lf::testing

// A stand-in worker for the launcher tests: behaves as told by argv[1] and reports what it saw.
// Not a training program; it only reads the torchrun variables loongforge-run sets.
//   env                 print the environment as KEY=VALUE lines (stdout) and one stderr line
//   exit N              exit with code N
//   sleep               write $FAKE_WORKER_DIR/rank<RANK>.pid ("pid ppid"), then wait forever
//   sleep-ignore-term   the same, ignoring SIGTERM (only SIGKILL ends it)
//   signal N            kill itself with signal N
//   fail-first N        exit N when LOONGFORGE_RESTART_COUNT is 0, else behave like `env`
//   fail-rank R N       every rank writes its pid file; rank R waits for all LOCAL_WORLD_SIZE
//                       pid files, prints "line 1".."line 40" and exits N; the others sleep
//   rendezvous          form a world over TCP at MASTER_ADDR:MASTER_PORT: rank 0 accepts
//                       WORLD_SIZE-1 peers and prints "world formed: 0,1,..."; exit 0 on success
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}
int env_int(const char* name) { return std::atoi(env_or(name, "-1").c_str()); }

int print_env() {
  for (char** e = environ; *e; ++e) std::printf("%s\n", *e);
  std::fflush(stdout);
  std::fprintf(stderr, "stderr line from rank %d\n", env_int("RANK"));
  return 0;
}

std::filesystem::path pid_dir() { return env_or("FAKE_WORKER_DIR", "."); }

// Atomic (write + rename) so a test polling the directory never reads half a file.
void write_pid_file() {
  auto final_path = pid_dir() / ("rank" + std::to_string(env_int("RANK")) + ".pid");
  auto tmp = final_path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp);
    f << getpid() << " " << getppid() << "\n";
  }
  std::filesystem::rename(tmp, final_path);
}

[[noreturn]] void sleep_forever() {
  std::printf("ready rank %d\n", env_int("RANK"));
  std::fflush(stdout);
  for (;;) pause();
}

int fail_rank(int rank, int code) {
  write_pid_file();
  if (env_int("RANK") != rank) sleep_forever();
  // Fail only once every local rank is up, so the test knows every pid it must see die.
  auto deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    int n = 0;
    for (auto& e : std::filesystem::directory_iterator(pid_dir()))
      n += e.path().extension() == ".pid" ? 1 : 0;
    if (n >= env_int("LOCAL_WORLD_SIZE") || Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int i = 1; i <= 40; ++i) std::printf("line %d\n", i);
  std::fflush(stdout);
  return code;
}

bool read_line(int fd, std::string& line) {
  line.clear();
  char c;
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, 10000) > 0 && read(fd, &c, 1) == 1) {
    if (c == '\n') return true;
    line += c;
  }
  return false;
}

int rendezvous() {
  int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
  std::printf("RANK=%d GROUP_RANK=%s LOCAL_RANK=%s WORLD_SIZE=%d\n", rank, env_or("GROUP_RANK", "?").c_str(),
              env_or("LOCAL_RANK", "?").c_str(), world);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(env_int("MASTER_PORT")));
  if (inet_pton(AF_INET, env_or("MASTER_ADDR", "").c_str(), &addr.sin_addr) != 1) {
    std::fprintf(stderr, "bad MASTER_ADDR\n");
    return 1;
  }
  if (rank == 0) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(s, 64) != 0) {
      std::perror("rank 0 bind/listen");
      return 1;
    }
    std::vector<int> ranks{0}, peers;
    for (int i = 1; i < world; ++i) {
      pollfd p{s, POLLIN, 0};
      if (poll(&p, 1, 10000) <= 0) {
        std::fprintf(stderr, "rank 0: only %d of %d ranks joined\n", i, world);
        return 1;
      }
      int c = accept(s, nullptr, nullptr);
      std::string line;
      int peer_rank = -1, peer_world = -1;
      if (!read_line(c, line) || std::sscanf(line.c_str(), "rank %d world %d", &peer_rank, &peer_world) != 2 ||
          peer_world != world) {
        std::fprintf(stderr, "rank 0: bad hello '%s'\n", line.c_str());
        return 1;
      }
      ranks.push_back(peer_rank);
      peers.push_back(c);
    }
    std::sort(ranks.begin(), ranks.end());
    std::string formed;
    for (int r : ranks) formed += (formed.empty() ? "" : ",") + std::to_string(r);
    std::printf("world formed: %s\n", formed.c_str());
    std::fflush(stdout);
    for (int c : peers) (void)!write(c, "ok\n", 3);
    for (int i = 0; i < world; ++i)
      if (ranks[static_cast<size_t>(i)] != i) return 1;
    return 0;
  }
  auto deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      std::string hello = "rank " + std::to_string(rank) + " world " + std::to_string(world) + "\n", line;
      (void)!write(c, hello.data(), hello.size());
      if (!read_line(c, line) || line != "ok") return 1;
      std::printf("joined a world of %d\n", world);
      return 0;
    }
    close(c);
    if (Clock::now() > deadline) {
      std::fprintf(stderr, "rank %d: cannot reach rank 0\n", rank);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  int a = argc > 2 ? std::atoi(argv[2]) : 0, b = argc > 3 ? std::atoi(argv[3]) : 0;
  if (mode == "env") return print_env();
  if (mode == "exit") return a;
  if (mode == "sleep" || mode == "sleep-ignore-term") {
    if (mode == "sleep-ignore-term") signal(SIGTERM, SIG_IGN);
    write_pid_file();
    sleep_forever();
  }
  if (mode == "sleep-report-signal") {
    // Prints which signal stopped it ("got signal 2") and exits 0: what the launcher forwarded.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2})
      signal(sig, [](int s) {
        char msg[32];
        int n = std::snprintf(msg, sizeof msg, "got signal %d\n", s);
        (void)!write(1, msg, static_cast<size_t>(n));
        _exit(0);
      });
    write_pid_file();
    sleep_forever();
  }
  if (mode == "signal") {
    rlimit no_core{0, 0};  // a crash test must not leave core files behind
    setrlimit(RLIMIT_CORE, &no_core);
    signal(a, SIG_DFL);
    kill(getpid(), a);
    pause();
    return 1;
  }
  if (mode == "fail-first") return env_or("LOONGFORGE_RESTART_COUNT", "") == "0" ? a : print_env();
  if (mode == "fail-rank") return fail_rank(a, b);
  if (mode == "rendezvous") return rendezvous();
  std::fprintf(stderr, "fake_worker: unknown mode '%s'\n", mode.c_str());
  return 99;
}

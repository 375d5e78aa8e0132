// loongforge-eval and loongforge-serve-policy as users run them: success rates of the scripted
// policies, the report, GIFs, every flag, closed-loop evaluation through the policy server, the
// server driven by the real OpenPI client (tests/vla/openpi_client_check.py with the
// openpi-client venv; skipped where it is missing), binding, the health check and usage errors.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "loongforge/media/video.h"
#include "multiprocess.h"
#include "oracle_cache.h"

namespace {
using lf::testing::run_command;
namespace fs = std::filesystem;

std::string bin(const std::string& name) { return lf::testing::binary_dir() + "/bin/" + name; }
nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(lf::testing::read_text(path)); }

// A loongforge-serve-policy process (stdout and stderr to files), stopped with SIGTERM.
struct Server {
  pid_t pid = -1;
  int port = 0;
  std::string out, err;
  int exit_code = -1;

  explicit Server(std::vector<std::string> args) {
    const std::string dir = lf::testing::make_temp_dir("serve");
    out = dir + "/stdout", err = dir + "/stderr";
    args.insert(args.begin(), bin("loongforge-serve-policy"));
    pid = ::fork();
    if (pid == 0) {
      (void)!freopen(out.c_str(), "w", stdout);
      (void)!freopen(err.c_str(), "w", stderr);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    // Wait for "serving ... on ws://HOST:PORT" (or an early exit).
    const std::regex re(R"(on ws://[^ ]*:(\d+) )");
    for (int i = 0; i < 600; ++i) {
      std::smatch m;
      const std::string text = lf::testing::read_text(out);
      if (std::regex_search(text, m, re)) {
        port = std::stoi(m[1]);
        return;
      }
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
        pid = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "the server did not start: " << lf::testing::read_text(err);
  }
  int stop() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      int status = 0;
      ::waitpid(pid, &status, 0);
      exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      pid = -1;
    }
    return exit_code;
  }
  ~Server() { stop(); }
  std::string uri() const { return "ws://127.0.0.1:" + std::to_string(port); }
  std::string output() const { return lf::testing::read_text(out) + lf::testing::read_text(err); }
};

// Connects a TCP socket to address:port: 0 when accepted, else errno.
int tcp_connect(const std::string& address, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}

// A plain HTTP GET of `path`: the whole response.
std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "(no connection)";
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return resp;
}

// This machine's IPv4 addresses other than loopback.
std::vector<std::string> other_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char s[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, s, sizeof s);
    if (std::string(s).rfind("127.", 0) != 0) out.push_back(s);
  }
  ::freeifaddrs(list);
  return out;
}

lf::testing::RankResult eval(std::vector<std::string> args) {
  args.insert(args.begin(), bin("loongforge-eval"));
  return run_command(args, {}, std::chrono::seconds(120));
}

TEST(EvalProgram, ExpertSucceedsRandomFailsAndTheReport) {
  const std::string d = lf::testing::make_temp_dir("eval");
  auto r = eval({"--policy", "expert", "--episodes", "100", "--report", d + "/expert.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::cout << r.output;
  auto rep = read_json(d + "/expert.json");
  EXPECT_GE(rep["success_rate"].get<double>(), 0.95);
  EXPECT_EQ(rep["policy"], "expert");
  EXPECT_EQ(rep["episodes"], 100);
  ASSERT_EQ(rep["per_episode"].size(), 100u);
  int64_t ok = 0, held = 0;
  for (size_t e = 0; e < 100; ++e) {
    const auto& ep = rep["per_episode"][e];
    EXPECT_EQ(ep["seed"], e);  // --seed 0
    EXPECT_LE(ep["steps"].get<int64_t>(), 100);
    EXPECT_EQ(ep["policy_calls"].get<int64_t>(), (ep["steps"].get<int64_t>() + 9) / 10);  // chunks of 10
    EXPECT_TRUE(ep.contains("instruction"));
    ok += ep["success"].get<bool>();
    // The expert goes for the named block first: its colour is the instruction's first colour word.
    const std::string instruction = ep["instruction"];
    ASSERT_TRUE(ep["first_block_held"].is_string()) << instruction;
    EXPECT_EQ(instruction.rfind("put the " + ep["first_block_held"].get<std::string>() + " block", 0), 0u) << instruction;
    EXPECT_FALSE(ep.contains("closest_to_instructed_block"));
    held += 1;
  }
  EXPECT_EQ(ok, rep["successes"].get<int64_t>());
  EXPECT_EQ(rep["first_held_instructed"], held);
  EXPECT_EQ(rep["first_held_other"], 0);
  EXPECT_NE(r.output.find("first block held: the instructed one 100/100, another 0/100"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("success rate: " + std::to_string(ok) + "/100"), std::string::npos) << r.output;

  r = eval({"--policy", "random", "--episodes", "100", "--seed", "1000", "--report", d + "/random.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::cout << r.output;
  rep = read_json(d + "/random.json");
  EXPECT_LT(rep["success_rate"].get<double>(), 0.05);
  EXPECT_EQ(rep["per_episode"][0]["seed"], 1000);
  EXPECT_EQ(rep["per_episode"][0]["steps"], 100);  // the step limit
  // Random motion rarely holds the named block first; the closest approach is reported otherwise
  // (a distance on the table, 0 .. sqrt(2)).
  int64_t instructed = 0, other = 0;
  for (const auto& ep : rep["per_episode"]) {
    const bool first = ep["first_block_held"].is_string() &&
                       ep["instruction"].get<std::string>().rfind("put the " + ep["first_block_held"].get<std::string>(), 0) == 0;
    instructed += first;
    other += ep["first_block_held"].is_string() && !first;
    if (!first) {
      ASSERT_TRUE(ep["closest_to_instructed_block"].is_number()) << ep.dump();
      EXPECT_GE(ep["closest_to_instructed_block"].get<double>(), 0.0);
      EXPECT_LE(ep["closest_to_instructed_block"].get<double>(), 1.5);
    }
  }
  EXPECT_EQ(rep["first_held_instructed"], instructed);
  EXPECT_EQ(rep["first_held_other"], other);
  EXPECT_LT(instructed, 50);
  // The same flags, the same episodes.
  r = eval({"--policy", "random", "--episodes", "100", "--seed", "1000", "--report", d + "/random2.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_json(d + "/random2.json")["per_episode"], rep["per_episode"]);
}

TEST(EvalProgram, InstructionSwapReplanChunkAndStepLimit) {
  const std::string d = lf::testing::make_temp_dir("eval");
  auto r = eval({"--episodes", "30", "--instruction-swap", "--report", d + "/swap.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rep = read_json(d + "/swap.json");
  // The expert reads the instruction: it does the swapped task, never the original.
  EXPECT_GE(rep["success_rate"].get<double>(), 0.95);
  EXPECT_EQ(rep["original_task_done"], 0);
  EXPECT_NE(r.output.find("original task done: 0/30"), std::string::npos) << r.output;
  EXPECT_EQ(rep["first_held_original"], 0);  // nor does it go for the original instruction's block
  EXPECT_GE(rep["first_held_instructed"].get<int64_t>(), 29);
  const auto& ep = rep["per_episode"][0];
  EXPECT_NE(ep["instruction"], ep["original_instruction"]);

  r = eval({"--episodes", "10", "--replan-steps", "1", "--report", d + "/replan.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& e : read_json(d + "/replan.json")["per_episode"]) {
    EXPECT_EQ(e["policy_calls"], e["steps"]);  // one action executed per call
    EXPECT_TRUE(e["success"].get<bool>());
  }
  r = eval({"--episodes", "10", "--chunk", "4", "--replan-steps", "3", "--report", d + "/chunk.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& e : read_json(d + "/chunk.json")["per_episode"])
    EXPECT_EQ(e["policy_calls"].get<int64_t>(), (e["steps"].get<int64_t>() + 2) / 3);
  r = eval({"--episodes", "5", "--max-steps", "5", "--report", d + "/short.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& e : read_json(d + "/short.json")["per_episode"]) {
    EXPECT_EQ(e["steps"], 5);
    EXPECT_FALSE(e["success"].get<bool>());
  }
  EXPECT_NE(r.output.find("success rate: 0/5"), std::string::npos) << r.output;
}

TEST(EvalProgram, GifsAndImageSize) {
  const std::string d = lf::testing::make_temp_dir("eval");
  auto r = eval({"--episodes", "3", "--save-gif", d + "/gifs", "--gif-episodes", "2", "--image-size", "32",
                 "--report", d + "/r.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(d + "/gifs/episode_0.gif"));
  EXPECT_TRUE(fs::exists(d + "/gifs/episode_1.gif"));
  EXPECT_FALSE(fs::exists(d + "/gifs/episode_2.gif"));
  const auto rep = read_json(d + "/r.json");
  EXPECT_EQ(rep["image_size"], 32);
  const auto frames = lf::media::decode_video(d + "/gifs/episode_0.gif");
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames[0].height, 128);  // 32 pixels, 4x
  EXPECT_EQ(frames[0].width, 128);
  EXPECT_EQ(static_cast<int64_t>(frames.size()), rep["per_episode"][0]["steps"].get<int64_t>() + 1);
  // The default: three episodes.
  r = eval({"--episodes", "4", "--save-gif", d + "/all"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(d + "/all/episode_2.gif"));
  EXPECT_FALSE(fs::exists(d + "/all/episode_3.gif"));
}

TEST(EvalProgram, UsageErrors) {
  auto r = eval({"--policy", "pi0"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown policy 'pi0'; the choices are: expert, random"), std::string::npos) << r.output;
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--episodes", "0"}, {"--bogus"}, {"--replan-steps", "-1"}, {"--image-size", "8"},
        {"--chunk", "0"}, {"--max-steps", "0"}, {"--gif-episodes", "1"}, {"--server", "ws://127.0.0.1:1", "--policy", "random"}}) {
    r = eval(bad);
    EXPECT_EQ(r.exit_code, 2) << bad[0] << ": " << r.output;
  }
  r = eval({"--episodes", "1", "--report", "/nonexistent-dir/r.json"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot write the report /nonexistent-dir/r.json"), std::string::npos) << r.output;
  r = eval({"--server", "ws://127.0.0.1:" + std::to_string(lf::testing::free_port())});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot connect to ws://127.0.0.1:"), std::string::npos) << r.output;
  r = eval({"--server", "not a uri"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("bad websocket address 'not a uri'"), std::string::npos) << r.output;
}

TEST(ServePolicyProgram, ClosedLoopThroughTheServer) {
  Server server({"--port", "0", "--policy", "expert"});
  ASSERT_GT(server.port, 0) << server.output();
  const std::string d = lf::testing::make_temp_dir("eval");
  auto r = eval({"--server", server.uri(), "--episodes", "20", "--replan-steps", "5", "--report", d + "/r.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output << server.output();
  const auto rep = read_json(d + "/r.json");
  EXPECT_GE(rep["success_rate"].get<double>(), 0.95);
  EXPECT_EQ(rep["server"], server.uri());
  // Through the server, the same episodes as in process.
  r = eval({"--episodes", "20", "--replan-steps", "5", "--report", d + "/local.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_json(d + "/local.json")["per_episode"], rep["per_episode"]);
  EXPECT_EQ(server.stop(), 0) << server.output();  // SIGTERM: a clean exit
  EXPECT_NE(server.output().find("connection 0 from 127.0.0.1:"), std::string::npos) << server.output();
}

TEST(ServePolicyProgram, TheOpenpiClient) {
  const std::string python = lf::testing::openpi_client_python();
  if (!fs::exists(python)) GTEST_SKIP() << "no " << python << " (tools/install-deps makes it)";
  const std::string script = lf::testing::source_dir() + "/tests/vla/openpi_client_check.py";
  {
    Server server({"--port", "0", "--chunk", "7"});
    ASSERT_GT(server.port, 0) << server.output();
    auto r = run_command({python, script, "127.0.0.1", std::to_string(server.port), "expert", "7"}, {},
                         std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.output << server.output();
    EXPECT_NE(r.output.find("OK"), std::string::npos) << r.output;
    // Errors are logged by the server, which served on.
    EXPECT_NE(server.output().find("malformed request"), std::string::npos) << server.output();
    EXPECT_EQ(server.stop(), 0);
  }
  // The random policy: --chunk and --seed (two servers with one seed answer alike).
  std::string first[2];
  for (int i = 0; i < 2; ++i) {
    Server server({"--port", "0", "--policy", "random", "--chunk", "4", "--seed", "9"});
    ASSERT_GT(server.port, 0) << server.output();
    auto r = run_command({python, script, "127.0.0.1", std::to_string(server.port), "random", "4"}, {},
                         std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.output << server.output();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, std::regex("FIRST ([^\n]*)"))) << r.output;
    first[i] = m[1];
  }
  EXPECT_EQ(first[0], first[1]);
  Server other({"--port", "0", "--policy", "random", "--chunk", "4", "--seed", "10"});
  auto r = run_command({python, script, "127.0.0.1", std::to_string(other.port), "random", "4"}, {},
                       std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("FIRST " + first[0]), std::string::npos) << r.output;
}

TEST(ServePolicyProgram, HealthCheckBindingAndUsageErrors) {
  Server server({"--host", "127.0.0.1", "--port", "0"});
  ASSERT_GT(server.port, 0) << server.output();
  const std::string health = http_get(server.port, "/healthz");
  EXPECT_EQ(health.rfind("HTTP/1.1 200", 0), 0u) << health;
  EXPECT_EQ(health.substr(health.size() - 3), "OK\n") << health;
  EXPECT_EQ(http_get(server.port, "/").rfind("HTTP/1.1 426", 0), 0u);
  // Bound to 127.0.0.1 only: another address of this machine refuses the connection.
  const auto others = other_addresses();
  EXPECT_EQ(tcp_connect("127.0.0.1", server.port), 0);
  for (const auto& a : others) EXPECT_EQ(tcp_connect(a, server.port), ECONNREFUSED) << a;
  if (!others.empty()) {  // while 0.0.0.0 accepts there
    Server all({"--host", "0.0.0.0", "--port", "0"});
    ASSERT_GT(all.port, 0) << all.output();
    EXPECT_EQ(tcp_connect(others[0], all.port), 0) << others[0];
  }

  // The port in use: a message naming the address, exit 1.
  Server clash({"--host", "127.0.0.1", "--port", std::to_string(server.port)});
  EXPECT_EQ(clash.port, 0);
  EXPECT_EQ(clash.exit_code, 1) << clash.output();
  EXPECT_NE(clash.output().find("cannot listen on 127.0.0.1:" + std::to_string(server.port)), std::string::npos)
      << clash.output();
  Server bad_host({"--host", "no.such.host.invalid", "--port", "0"});
  EXPECT_EQ(bad_host.exit_code, 1) << bad_host.output();
  EXPECT_NE(bad_host.output().find("cannot listen on no.such.host.invalid:0"), std::string::npos) << bad_host.output();

  auto r = run_command({bin("loongforge-serve-policy"), "--policy", "pi0"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown policy 'pi0'; the choices are: expert, random"), std::string::npos) << r.output;
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--port", "70000"}, {"--chunk", "0"}, {"--bogus"}}) {
    std::vector<std::string> argv = {bin("loongforge-serve-policy")};
    argv.insert(argv.end(), bad.begin(), bad.end());
    r = run_command(argv);
    EXPECT_EQ(r.exit_code, 2) << bad[0] << ": " << r.output;
  }
}

}  // namespace

// An oracle's cache is keyed by its script and the project modules it imports (recursively), so a
// change to a shared module (lerobot_dataset_oracle.py under the pi05 inputs oracle, wan_oracle.py
// under the sampler's) rebuilds the caches made with it; packages (torch, lerobot) are not read.
TEST(OracleCache, KeyCoversTheLocalModulesAScriptImports) {
  const std::string t = lf::testing::source_dir() + "/tests";
  const std::string inputs = lf::testing::oracle_sources(t + "/vla/pi05_lerobot_inputs_oracle.py");
  EXPECT_NE(inputs.find(lf::testing::read_text(t + "/vla/pi05_lerobot_inputs_oracle.py")), std::string::npos);
  EXPECT_NE(inputs.find(lf::testing::read_text(t + "/data/lerobot_dataset_oracle.py")), std::string::npos);
  const std::string wan = lf::testing::oracle_sources(t + "/models/wan_sample_oracle.py");
  EXPECT_NE(wan.find(lf::testing::read_text(t + "/models/wan_oracle.py")), std::string::npos);
  EXPECT_EQ(lf::testing::oracle_sources(t + "/models/wan_oracle.py").find("wan_sample_oracle"), std::string::npos);
}

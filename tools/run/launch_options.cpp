#include "launch_options.h"

#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <sstream>

namespace lf::run {
namespace {

const char* kHelpHint = "see loongforge-run --help";

// Strict integer parsing: "4" yes, "4x", "", "gpu" no. Range errors name the flag.
int parse_int(const std::string& flag, const std::string& value, int lo, int hi, const char* fix) {
  int v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size())
    throw UsageError(flag + " " + value + ": expected an integer", fix);
  if (v < lo || v > hi)
    throw UsageError(flag + " " + value + ": must be in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]",
                     fix);
  return v;
}

// torchrun's --nnodes accepts MIN:MAX for elastic jobs; a static world needs MIN == MAX.
int parse_nnodes(const std::string& value) {
  const char* fix = "give the number of nodes, e.g. --nnodes 2 (elastic MIN:MAX ranges are not supported)";
  auto colon = value.find(':');
  if (colon == std::string::npos) return parse_int("--nnodes", value, 1, 1 << 16, fix);
  int lo = parse_int("--nnodes", value.substr(0, colon), 1, 1 << 16, fix);
  int hi = parse_int("--nnodes", value.substr(colon + 1), 1, 1 << 16, fix);
  if (lo != hi) throw UsageError("--nnodes " + value + ": elastic node ranges are not supported", fix);
  return lo;
}

TerminalRanks parse_terminal_ranks(const std::string& value) {
  const char* fix = "use --terminal-ranks all, none, or a list of global ranks such as 0,1";
  TerminalRanks t;
  if (value == "all") {
    t.all = true;
    return t;
  }
  t.ranks.clear();
  if (value == "none") return t;
  std::stringstream ss(value);
  for (std::string item; std::getline(ss, item, ',');)
    t.ranks.push_back(parse_int("--terminal-ranks", item, 0, 1 << 30, fix));
  if (t.ranks.empty()) throw UsageError("--terminal-ranks: empty list", fix);
  return t;
}

// "host:port", "[v6::addr]:port" or "host" (port then stays as it is).
void parse_endpoint(const std::string& value, std::string& host, int& port) {
  const char* fix = "use --rdzv-endpoint HOST:PORT, e.g. --rdzv-endpoint 10.0.0.1:29500";
  std::string h = value, p;
  if (!value.empty() && value[0] == '[') {
    auto close = value.find(']');
    if (close == std::string::npos) throw UsageError("--rdzv-endpoint " + value + ": missing ']'", fix);
    h = value.substr(1, close - 1);
    if (close + 1 < value.size()) {
      if (value[close + 1] != ':') throw UsageError("--rdzv-endpoint " + value + ": expected ':' after ']'", fix);
      p = value.substr(close + 2);
    }
  } else if (auto colon = value.rfind(':'); colon != std::string::npos) {
    h = value.substr(0, colon);
    p = value.substr(colon + 1);
  }
  if (h.empty()) throw UsageError("--rdzv-endpoint " + value + ": empty host", fix);
  host = h;
  if (!p.empty()) port = parse_int("--rdzv-endpoint", p, 1, 65535, fix);
}

// A loopback port that was free a moment ago (--standalone). The workers' rank 0 binds it
// later; the short window in between is the same one torchrun --standalone accepts.
int free_loopback_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw UsageError("--standalone: cannot create a socket to pick a free port", "pass --master-port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) throw UsageError("--standalone: cannot find a free loopback port", "pass --master-port");
  return ntohs(addr.sin_port);
}

bool is_executable_file(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

}  // namespace

bool TerminalRanks::includes(int rank) const {
  return all || std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

std::string resolve_executable(const std::string& command) {
  const std::string fix =
      "the command after the flags must be an executable (loongforge-run implies --no-python), "
      "e.g. build/bin/loongforge-train";
  if (command.find('/') != std::string::npos) {
    if (!is_executable_file(command))
      throw UsageError("command '" + command + "' is not an executable file", fix);
    return command;
  }
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(ss, dir, ':');) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + command;
    if (is_executable_file(candidate)) return candidate;
  }
  throw UsageError("command '" + command + "' not found in PATH", fix);
}

std::optional<LaunchOptions> parse_launch_options(const std::vector<std::string>& args,
                                                  std::string* help_out) {
  LaunchOptions o;
  std::string nnodes = "1", nproc = "1", terminal = "0", endpoint, rdzv_backend;
  int master_port = o.master_port;

  CLI::App app{"loongforge-run: start and supervise the worker processes of one node (torchrun-compatible).",
               "loongforge-run"};
  app.footer(
      "After the flags: COMMAND [ARGS...], the worker executable and its arguments (--no-python is\n"
      "implied). Example: loongforge-run --nproc-per-node 4 build/bin/loongforge-train --config-file X\n"
      "Workers get RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT\n"
      "and TORCHELASTIC_RESTART_COUNT; see docs/launcher.md.");
  app.prefix_command();  // everything from the first positional on is the worker command
  app.set_help_flag("-h,--help", "Print this help and exit");
  auto* nnodes_opt = app.add_option("--nnodes", nnodes, "Number of nodes (N, or N:N)");
  app.add_option("--node-rank,--node_rank", o.node_rank, "Rank of this node in [0, nnodes)");
  app.add_option("--nproc-per-node,--nproc_per_node", nproc, "Worker processes on this node");
  auto* addr_opt = app.add_option("--master-addr,--master_addr", o.master_addr,
                                  "Address of node 0, where rank 0 listens (default 127.0.0.1)");
  auto* port_opt = app.add_option("--master-port,--master_port", master_port,
                                  "Port rank 0 listens on (default 29500)");
  auto* endpoint_opt = app.add_option("--rdzv-endpoint,--rdzv_endpoint", endpoint,
                                      "HOST[:PORT]: alias of --master-addr/--master-port");
  app.add_option("--rdzv-backend,--rdzv_backend", rdzv_backend,
                 "Accepted for torchrun compatibility (static, c10d); the world is static");
  app.add_option("--rdzv-id,--rdzv_id", o.run_id, "Job id, exported as TORCHELASTIC_RUN_ID");
  auto* standalone_opt = app.add_flag("--standalone", o.standalone,
                                      "Single node on loopback with a free master port");
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "Restart the whole local worker group up to N times after a failure (default 0)");
  app.add_option("--log-dir,--log_dir", o.log_dir,
                 "Directory for per-rank logs rank<R>.log (stdout and stderr of each worker)");
  app.add_option("--grace-period", o.grace_period_s,
                 "Seconds between SIGTERM and SIGKILL when stopping workers (default 5)");
  app.add_option("--terminal-ranks", terminal,
                 "Global ranks whose output also goes to this terminal: 0 (default), all, none, 0,1,...");
  app.add_flag("--no-python,--no_python")
      ->description("Accepted and ignored: the command is always an executable");

  try {
    // CLI11 parses a reversed vector; prefix_command keeps the tail (the command) in order.
    std::vector<std::string> rev(args.rbegin(), args.rend());
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    if (help_out) *help_out = app.help();
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what(), kHelpHint);
  }

  o.command = app.remaining();
  if (!o.command.empty() && o.command[0] == "--") o.command.erase(o.command.begin());
  if (o.command.empty())
    throw UsageError("missing the worker command",
                     "put the executable and its arguments after the flags, e.g. "
                     "loongforge-run --nproc-per-node 2 build/bin/loongforge-train --config-file X");
  if (o.command[0].size() > 1 && o.command[0][0] == '-')
    throw UsageError("unknown flag " + o.command[0], kHelpHint);

  o.nnodes = parse_nnodes(nnodes);
  o.nproc_per_node = parse_int("--nproc-per-node", nproc, 1, 4096,
                               "give the number of worker processes on this node, e.g. --nproc-per-node 8");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw UsageError("--node-rank " + std::to_string(o.node_rank) + " is out of range for --nnodes " +
                         std::to_string(o.nnodes),
                     "node ranks go from 0 to nnodes-1; node 0 hosts rank 0 at --master-addr");
  if (o.max_restarts < 0)
    throw UsageError("--max-restarts " + std::to_string(o.max_restarts) + " is negative",
                     "use 0 (no restart) or a positive count");
  if (!(o.grace_period_s >= 0) || o.grace_period_s > 3600)
    throw UsageError("--grace-period " + (std::ostringstream() << o.grace_period_s).str() + " is out of range",
                     "give seconds in [0, 3600], e.g. --grace-period 5");
  if (*endpoint_opt && (*addr_opt || *port_opt))
    throw UsageError("--rdzv-endpoint together with --master-addr/--master-port",
                     "give the address once: either --rdzv-endpoint HOST:PORT or the two master flags");
  if (*endpoint_opt) parse_endpoint(endpoint, o.master_addr, master_port);
  if (master_port < 1 || master_port > 65535)
    throw UsageError("--master-port " + std::to_string(master_port) + " is not a TCP port",
                     "use a free port in [1, 65535], e.g. --master-port 29500");
  o.master_port = master_port;
  if (o.master_addr.empty())
    throw UsageError("--master-addr is empty", "give the host name or IP address of node 0");
  if (*standalone_opt) {
    if (*nnodes_opt && o.nnodes != 1)
      throw UsageError("--standalone with --nnodes " + nnodes,
                       "--standalone means a single node; drop it for multi-node jobs");
    if (*addr_opt || *port_opt || *endpoint_opt)
      throw UsageError("--standalone with an explicit master address or port",
                       "--standalone picks 127.0.0.1 and a free port itself; drop one of them");
    o.master_addr = "127.0.0.1";
    o.master_port = free_loopback_port();
  }
  // Restarting one node's group alone cannot re-form a multi-node world: the other nodes'
  // workers would wait on a rank that is gone. That needs launcher-to-launcher coordination,
  // which is not implemented (docs/launcher.md, "Restarts").
  if (o.nnodes > 1 && o.max_restarts > 0)
    throw UsageError("--max-restarts " + std::to_string(o.max_restarts) + " with --nnodes " +
                         std::to_string(o.nnodes) + " is not supported",
                     "use --max-restarts 0 for multi-node jobs and resubmit the job to resume from "
                     "its last checkpoint (e.g. Slurm --requeue); restarts work with --nnodes 1");
  o.terminal_ranks = parse_terminal_ranks(terminal);
  if (!rdzv_backend.empty() && rdzv_backend != "static" && rdzv_backend != "c10d")
    throw UsageError("--rdzv-backend " + rdzv_backend + " is not supported",
                     "use static or c10d (both mean: a static world at the master address)");
  o.executable = resolve_executable(o.command[0]);
  return o;
}

}  // namespace lf::run

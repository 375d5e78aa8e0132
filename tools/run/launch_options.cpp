#include "launch_options.h"

#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <map>
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

// The NVIDIA GPUs this node's workers can see, without loading CUDA: CUDA_VISIBLE_DEVICES when it
// is set (its entries up to the first invalid one, as CUDA reads it), else the driver's GPU list.
int visible_gpus() {
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    int n = 0;
    std::stringstream ss(v);
    for (std::string item; std::getline(ss, item, ',');) {
      item.erase(0, item.find_first_not_of(' '));
      item.erase(item.find_last_not_of(' ') + 1);
      const bool index = !item.empty() && std::all_of(item.begin(), item.end(), ::isdigit);
      if (!index && item.rfind("GPU-", 0) != 0 && item.rfind("MIG-", 0) != 0) break;
      ++n;
    }
    return n;
  }
  int n = 0;
  if (DIR* d = opendir("/proc/driver/nvidia/gpus")) {
    while (const dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

// --nproc-per-node: an integer, or torchrun's gpu (one worker per visible GPU), cpu (one per
// online CPU) and auto (gpu when there is one, else cpu). Kubeflow's PyTorchJob passes
// PET_NPROC_PER_NODE=auto unless the job sets nprocPerNode.
int parse_nproc(const std::string& value) {
  const char* fix = "give the number of worker processes on this node, e.g. --nproc-per-node 8 (or gpu, cpu, auto)";
  const int gpus = value == "gpu" || value == "auto" ? visible_gpus() : 0;
  if (value == "gpu" && gpus == 0)
    throw UsageError("--nproc-per-node gpu: this node has no visible NVIDIA GPU (CUDA_VISIBLE_DEVICES, "
                     "/proc/driver/nvidia/gpus)",
                     fix);
  if (value == "gpu" || (value == "auto" && gpus > 0)) return std::min(gpus, 4096);
  if (value == "cpu" || value == "auto") return static_cast<int>(std::clamp<long>(sysconf(_SC_NPROCESSORS_ONLN), 1, 4096));
  return parse_int("--nproc-per-node", value, 1, 4096, fix);
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

// --signals-to-handle: torchrun's comma list of signal names.
std::vector<int> parse_signals(const std::string& value) {
  static const std::map<std::string, int> known{{"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},
                                                {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}};
  const char* fix = "give a comma list of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 (torchrun's default: "
                    "SIGTERM,SIGINT,SIGHUP,SIGQUIT)";
  std::vector<int> out;
  std::stringstream ss(value);
  for (std::string item; std::getline(ss, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    auto it = known.find(item);
    if (it == known.end()) throw UsageError("--signals-to-handle " + value + ": unknown signal '" + item + "'", fix);
    if (std::find(out.begin(), out.end(), it->second) == out.end()) out.push_back(it->second);
  }
  if (out.empty()) throw UsageError("--signals-to-handle: empty list", fix);
  return out;
}

// torchrun reads a flag that is not given from PET_<DEST> (its argparse `env` actions). These are
// the ones loongforge-run has; they are put before the command line's flags, whose values win
// (the last value of a flag is kept).
struct EnvFlag {
  const char* var;
  const char* flag;
  bool is_switch;  // PET_STANDALONE=1 / PET_NO_PYTHON=1 (torchrun: bool(int(value)))
};
constexpr EnvFlag kEnvFlags[] = {
    {"PET_NNODES", "--nnodes", false},           {"PET_NODE_RANK", "--node-rank", false},
    {"PET_NPROC_PER_NODE", "--nproc-per-node", false}, {"PET_MASTER_ADDR", "--master-addr", false},
    {"PET_MASTER_PORT", "--master-port", false}, {"PET_RDZV_ENDPOINT", "--rdzv-endpoint", false},
    {"PET_RDZV_BACKEND", "--rdzv-backend", false}, {"PET_RDZV_ID", "--rdzv-id", false},
    {"PET_MAX_RESTARTS", "--max-restarts", false}, {"PET_LOG_DIR", "--log-dir", false},
    {"PET_SIGNALS_TO_HANDLE", "--signals-to-handle", false}, {"PET_STANDALONE", "--standalone", true},
    {"PET_NO_PYTHON", "--no-python", true},
};

bool is_executable_file(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::vector<int> default_signals() { return {SIGTERM, SIGINT, SIGHUP, SIGQUIT}; }

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

namespace {

// `from_env`: flag -> "PET_X=value" for the flags whose value came from the environment.
std::optional<LaunchOptions> parse_args(const std::vector<std::string>& args, const std::map<std::string, std::string>& from_env,
                                        std::string* help_out) {
  LaunchOptions o;
  std::string nnodes = "1", nproc = "1", terminal = "0", endpoint, rdzv_backend, signals;
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
  // argparse keeps the last value of a repeated flag; so do we (PET_* values come first).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  auto* nnodes_opt = app.add_option("--nnodes", nnodes, "Number of nodes (N, or N:N)");
  auto* node_rank_opt = app.add_option("--node-rank,--node_rank", o.node_rank, "Rank of this node in [0, nnodes)");
  app.add_option("--nproc-per-node,--nproc_per_node", nproc, "Worker processes on this node");
  auto* addr_opt = app.add_option("--master-addr,--master_addr", o.master_addr,
                                  "Address of node 0, where rank 0 listens (default 127.0.0.1)");
  auto* port_opt = app.add_option("--master-port,--master_port", master_port,
                                  "Port rank 0 listens on (default 29500)");
  auto* endpoint_opt = app.add_option("--rdzv-endpoint,--rdzv_endpoint", endpoint,
                                      "HOST[:PORT]: alias of --master-addr/--master-port");
  app.add_option("--rdzv-backend,--rdzv_backend", rdzv_backend,
                 "static or c10d: both mean a static world at the endpoint (c10d needs --node-rank)");
  app.add_option("--rdzv-id,--rdzv_id", o.run_id, "Job id, exported as TORCHELASTIC_RUN_ID");
  auto* standalone_opt = app.add_flag("--standalone", o.standalone,
                                      "Single node on loopback with a free master port");
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "Restart the whole local worker group up to N times after a failure (default 0)");
  app.add_option("--log-dir,--log_dir", o.log_dir,
                 "Directory for per-rank logs rank<R>.log (stdout and stderr of each worker)");
  app.add_option("--grace-period", o.grace_period_s,
                 "Seconds between SIGTERM and SIGKILL when stopping workers (default 30, as torchrun)");
  auto* signals_opt = app.add_option("--signals-to-handle,--signals_to_handle", signals,
                 "Signals forwarded to the workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)");
  app.add_option("--terminal-ranks", terminal,
                 "Global ranks whose output also goes to this terminal: 0 (default), all, none, 0,1,...");
  app.add_flag("--no-python,--no_python")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
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

  // Given on the command line (a PET_* value is one more occurrence, put first).
  auto on_cli = [&](const CLI::Option* opt, const char* flag) {
    return opt->count() > (from_env.count(flag) ? 1u : 0u);
  };
  auto given = [&](const CLI::Option* opt) { return opt->count() > 0; };
  o.nnodes = parse_nnodes(nnodes);
  o.nproc_per_node = parse_nproc(nproc);
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
  // Both on the command line is a contradiction; one from PET_* yields to the command line's.
  const bool endpoint_cli = on_cli(endpoint_opt, "--rdzv-endpoint");
  const bool master_cli = on_cli(addr_opt, "--master-addr") || on_cli(port_opt, "--master-port");
  if (endpoint_cli && master_cli)
    throw UsageError("--rdzv-endpoint together with --master-addr/--master-port",
                     "give the address once: either --rdzv-endpoint HOST:PORT or the two master flags");
  if (given(endpoint_opt)) {
    std::string host = o.master_addr;
    int port = master_port;
    parse_endpoint(endpoint, host, port);
    // The endpoint (from PET_RDZV_ENDPOINT when a master flag is on the command line) gives what
    // the command line does not; its port only when it has one.
    if (!on_cli(addr_opt, "--master-addr")) o.master_addr = host;
    if (!on_cli(port_opt, "--master-port")) master_port = port;
  }
  // torchrun's help gives IPv6 master addresses in brackets ([::1]); the address is the inside.
  if (o.master_addr.size() > 2 && o.master_addr.front() == '[' && o.master_addr.back() == ']')
    o.master_addr = o.master_addr.substr(1, o.master_addr.size() - 2);
  if (master_port < 1 || master_port > 65535)
    throw UsageError("--master-port " + std::to_string(master_port) + " is not a TCP port",
                     "use a free port in [1, 65535], e.g. --master-port 29500");
  o.master_port = master_port;
  if (o.master_addr.empty())
    throw UsageError("--master-addr is empty", "give the host name or IP address of node 0");
  if (o.standalone) {
    if (given(nnodes_opt) && o.nnodes != 1)
      throw UsageError("--standalone with --nnodes " + nnodes,
                       "--standalone means a single node; drop it for multi-node jobs");
    if (on_cli(addr_opt, "--master-addr") || on_cli(port_opt, "--master-port") || endpoint_cli)
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
  // torchrun's c10d rendezvous hands out node ranks; loongforge-run does not, so without
  // --node-rank every node would be node 0 and the job would hang or fail to bind.
  if (rdzv_backend == "c10d" && o.nnodes > 1 && !given(node_rank_opt))
    throw UsageError("--rdzv-backend c10d with --nnodes " + std::to_string(o.nnodes) + " and no --node-rank",
                     "loongforge-run does not assign node ranks by rendezvous: give each node its own "
                     "--node-rank K in [0, nnodes) (e.g. $SLURM_NODEID, or PET_NODE_RANK), node 0 on the "
                     "--rdzv-endpoint host");
  if (given(signals_opt)) o.signals_to_handle = parse_signals(signals);
  o.executable = resolve_executable(o.command[0]);
  return o;
}

}  // namespace

std::optional<LaunchOptions> parse_launch_options(const std::vector<std::string>& args, std::string* help_out) {
  std::vector<std::string> all;
  std::map<std::string, std::string> from_env;
  for (const auto& e : kEnvFlags) {
    const char* v = std::getenv(e.var);
    if (!v) continue;
    const std::string value = v, origin = std::string(e.var) + "=" + value;
    if (e.is_switch) {
      int on = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), on);
      if (ec != std::errc() || end != value.data() + value.size() || (on != 0 && on != 1))
        throw UsageError(origin + ": expected 0 or 1", std::string("set ") + e.var + " to 1 for " + e.flag + ", or unset it");
      if (on) all.push_back(e.flag);
    } else {
      all.insert(all.end(), {e.flag, value});
    }
    from_env[e.flag] = origin;
  }
  all.insert(all.end(), args.begin(), args.end());
  try {
    return parse_args(all, from_env, help_out);
  } catch (const UsageError& e) {
    // A bad value from the environment: say where it came from.
    const std::string what = e.what();
    for (const auto& [flag, origin] : from_env) {
      std::string under = flag;
      std::replace(under.begin() + 2, under.end(), '-', '_');
      const bool on_cli = std::any_of(args.begin(), args.end(), [&](const std::string& a) {
        return a == flag || a == under || a.rfind(flag + "=", 0) == 0 || a.rfind(under + "=", 0) == 0;
      });
      if (!on_cli && what.find(flag) != std::string::npos) throw UsageError(what + " (from " + origin + ")", e.hint());
    }
    throw;
  }
}

}  // namespace lf::run

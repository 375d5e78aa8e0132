// Command line of loongforge-run: torchrun-compatible flags parsed and validated into one
// LaunchOptions value. Pure parsing: nothing here starts a process or touches a signal.
// Not the supervision logic (supervisor.h) nor the worker environment (worker_env.h).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace lf::run {

// A flag error: main() prints it with its hint and exits 2 (torchrun's argparse does the same).
class UsageError : public std::runtime_error {
 public:
  UsageError(std::string message, std::string hint)
      : std::runtime_error(std::move(message)), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

// Which global ranks also write to the launcher's terminal (their log files get everything).
struct TerminalRanks {
  bool all = false;
  std::vector<int> ranks{0};  // global ranks; used when !all
  bool includes(int rank) const;
  // Rank 0 alone is printed as is; several ranks get a "[rank R] " prefix per line.
  bool prefixed() const { return all || ranks.size() != 1 || ranks[0] != 0; }
};

// SIGTERM, SIGINT, SIGHUP, SIGQUIT: what torchrun handles without --signals-to-handle.
std::vector<int> default_signals();

struct LaunchOptions {
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int max_restarts = 0;
  std::string log_dir;        // empty: no files, the last 64 KiB per rank kept in memory
  double grace_period_s = 30;  // SIGTERM (or the signal received) -> SIGKILL delay, torchrun's
  // Signals the launcher catches and forwards to the workers (--signals-to-handle); others keep
  // their default action. torchrun's default set.
  std::vector<int> signals_to_handle = default_signals();
  TerminalRanks terminal_ranks;
  std::string run_id = "none";  // --rdzv-id; exported as TORCHELASTIC_RUN_ID
  bool standalone = false;
  std::vector<std::string> command;  // the worker command as given: argv of every worker
  std::string executable;            // command[0] resolved through PATH: what is exec'd

  int world_size() const { return nnodes * nproc_per_node; }
  int global_rank(int local_rank) const { return node_rank * nproc_per_node + local_rank; }
};

// Parses argv[1..] (the program name excluded). Throws UsageError naming the flag and its fix.
// Returns nullopt when --help was printed to `help_out`. As torchrun, a flag not given takes its
// value from PET_<NAME> when that is set (PET_NNODES, PET_NODE_RANK, ...: what Kubeflow's
// PyTorchJob sets); the command line wins over it. A flag given twice keeps its last value.
std::optional<LaunchOptions> parse_launch_options(const std::vector<std::string>& args,
                                                  std::string* help_out);

// The absolute path the launcher will exec for `command` (PATH lookup for a bare name), or a
// UsageError when it is not an executable file.
std::string resolve_executable(const std::string& command);

}  // namespace lf::run

// Launch-environment detection (see launch_env.h). Every error names the variable and its value,
// because the user's fix is always in the launcher's command line or job script.
#include "loongforge/dist/launch_env.h"

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "loongforge/core/error.h"

namespace lf::dist {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int parse_int(const std::string& value, const char* name) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  LF_CHECK(end != value.c_str() && *end == '\0' && errno == 0 && v >= INT32_MIN && v <= INT32_MAX,
           "environment variable ", name, "='", value, "' is not an integer",
           lf::hint("the launcher (torchrun, srun, mpirun) sets it; check the job script"));
  return static_cast<int>(v);
}

std::optional<int> env_int(const char* name) {
  auto v = env(name);
  if (!v) return std::nullopt;
  return parse_int(*v, name);
}

int require_int(const char* name, const char* source) {
  auto v = env_int(name);
  LF_CHECK(v.has_value(), "environment variable ", name, " is not set but the ", source,
           " launch convention needs it",
           lf::hint("set it, or launch with torchrun / loongforge-run / srun / mpirun"));
  return *v;
}

// Master address and port for sources that carry them in MASTER_ADDR / MASTER_PORT.
void read_master(LaunchEnv& e, const char* source) {
  if (auto a = env("MASTER_ADDR")) e.master_addr = *a;
  if (auto p = env_int("MASTER_PORT")) e.master_port = *p;
  if (e.world_size == 1) return;
  LF_CHECK(env("MASTER_ADDR").has_value(), "MASTER_ADDR is not set (", source, ", rank ", e.rank,
           " of WORLD_SIZE=", e.world_size, ")",
           lf::hint("export MASTER_ADDR=<host of rank 0> (and MASTER_PORT) before launching"));
  LF_CHECK(e.master_port != 0, "MASTER_PORT is not set (", source, ", rank ", e.rank,
           " of WORLD_SIZE=", e.world_size, ")",
           lf::hint("export MASTER_PORT=<free TCP port on rank 0's host>, e.g. 29500"));
}

void validate(const LaunchEnv& e, const char* rank_var, const char* world_var,
              const char* local_rank_var, const char* local_world_var) {
  LF_CHECK(e.world_size >= 1, world_var, "=", e.world_size, " must be >= 1 (", e.source, ")");
  LF_CHECK(e.rank >= 0 && e.rank < e.world_size, rank_var, "=", e.rank, " is out of range for ",
           world_var, "=", e.world_size, " (", e.source, ")",
           lf::hint("ranks run from 0 to world size - 1; the variables come from different jobs?"));
  LF_CHECK(e.local_world_size >= 1 && e.local_world_size <= e.world_size, local_world_var, "=",
           e.local_world_size, " must be in [1, ", world_var, "=", e.world_size, "] (", e.source,
           ")");
  LF_CHECK(e.local_rank >= 0 && e.local_rank < e.local_world_size, local_rank_var, "=",
           e.local_rank, " is out of range for ", local_world_var, "=", e.local_world_size, " (",
           e.source, ")");
  LF_CHECK(e.node_rank >= 0, "node rank ", e.node_rank, " must be >= 0 (", e.source, ")");
  LF_CHECK(e.master_port >= 0 && e.master_port <= 65535, "MASTER_PORT=", e.master_port,
           " is not a TCP port (", e.source, ")", lf::hint("use a port in 1..65535"));
}

LaunchEnv from_torchrun() {
  LaunchEnv e;
  e.source = "torchrun";
  e.rank = require_int("RANK", "torchrun");
  e.world_size = require_int("WORLD_SIZE", "torchrun");
  e.local_rank = env_int("LOCAL_RANK").value_or(e.rank);
  e.local_world_size = env_int("LOCAL_WORLD_SIZE").value_or(e.world_size);
  e.node_rank = env_int("GROUP_RANK").value_or(0);
  e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
  auto agent = env("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_store = agent && (*agent == "True" || *agent == "true" || *agent == "1");
  read_master(e, "torchrun");
  validate(e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  return e;
}

LaunchEnv from_openmpi() {
  LaunchEnv e;
  e.source = "openmpi";
  e.rank = require_int("OMPI_COMM_WORLD_RANK", "Open MPI");
  e.world_size = require_int("OMPI_COMM_WORLD_SIZE", "Open MPI");
  e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
  e.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1);
  // Open MPI has no node index; with mpirun's default by-slot mapping ranks fill nodes in order.
  e.node_rank = e.rank / e.local_world_size;
  read_master(e, "Open MPI");
  validate(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
           "OMPI_COMM_WORLD_LOCAL_SIZE");
  return e;
}

LaunchEnv from_slurm() {
  LaunchEnv e;
  e.source = "slurm";
  e.rank = require_int("SLURM_PROCID", "Slurm");
  e.world_size = require_int("SLURM_NTASKS", "Slurm");
  e.local_rank = env_int("SLURM_LOCALID").value_or(0);
  e.node_rank = env_int("SLURM_NODEID").value_or(0);
  e.restart_count = env_int("SLURM_RESTART_COUNT").value_or(0);
  const char* local_var = "SLURM_TASKS_PER_NODE";
  if (auto tpn = env("SLURM_TASKS_PER_NODE")) {
    auto counts = expand_slurm_tasks_per_node(*tpn);
    LF_CHECK(e.node_rank < static_cast<int>(counts.size()), "SLURM_NODEID=", e.node_rank,
             " has no entry in SLURM_TASKS_PER_NODE='", *tpn, "' (", counts.size(), " nodes)");
    e.local_world_size = counts[e.node_rank];
  } else if (auto n = env_int("SLURM_NTASKS_PER_NODE")) {
    local_var = "SLURM_NTASKS_PER_NODE";
    e.local_world_size = *n;
  } else {
    local_var = "SLURM_NTASKS / SLURM_NNODES";
    int nodes = env_int("SLURM_NNODES").value_or(1);
    LF_CHECK(nodes >= 1, "SLURM_NNODES=", nodes, " must be >= 1");
    e.local_world_size = e.world_size / nodes;
  }
  if (auto a = env("MASTER_ADDR")) {
    e.master_addr = *a;
  } else if (auto list = env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST")
                                                    : env("SLURM_JOB_NODELIST")) {
    e.master_addr = expand_slurm_nodelist(*list).front();
  } else if (e.world_size > 1) {
    LF_FAIL("no master address under Slurm: neither MASTER_ADDR nor SLURM_STEP_NODELIST / "
            "SLURM_JOB_NODELIST is set (SLURM_PROCID=", e.rank, ", SLURM_NTASKS=", e.world_size,
            ")", lf::hint("launch with srun inside an allocation, or export MASTER_ADDR"));
  }
  if (auto p = env_int("MASTER_PORT")) {
    e.master_port = *p;
  } else if (auto job = env("SLURM_JOB_ID")) {
    e.master_port = slurm_port_from_job_id(*job);
  } else if (e.world_size > 1) {
    LF_FAIL("no master port under Slurm: neither MASTER_PORT nor SLURM_JOB_ID is set",
            lf::hint("export MASTER_PORT=<free port>"));
  }
  validate(e, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_var);
  return e;
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list) {
  std::vector<std::string> hosts;
  size_t i = 0;
  auto bad = [&](const char* why) {
    LF_FAIL("cannot parse Slurm node list '", list, "': ", why,
            lf::hint("set MASTER_ADDR explicitly to rank 0's host"));
  };
  while (i < list.size()) {
    // One host expression runs to the next comma outside brackets.
    size_t start = i, open = std::string::npos, close = std::string::npos;
    while (i < list.size() && !(list[i] == ',' && (open == std::string::npos ||
                                                    close != std::string::npos))) {
      if (list[i] == '[') {
        if (open != std::string::npos) bad("more than one [...] group in a host name");
        open = i;
      } else if (list[i] == ']') {
        if (open == std::string::npos || close != std::string::npos) bad("unbalanced ']'");
        close = i;
      }
      ++i;
    }
    std::string expr = list.substr(start, i - start);
    ++i;  // skip the comma
    if (expr.empty()) bad("empty host name");
    if (open == std::string::npos) {
      hosts.push_back(expr);
      continue;
    }
    if (close == std::string::npos) bad("unbalanced '['");
    std::string prefix = list.substr(start, open - start);
    std::string suffix = list.substr(close + 1, i - 1 - close - 1);
    std::string body = list.substr(open + 1, close - open - 1);
    size_t p = 0;
    while (p <= body.size()) {
      size_t comma = body.find(',', p);
      std::string item = body.substr(p, comma == std::string::npos ? std::string::npos : comma - p);
      p = comma == std::string::npos ? body.size() + 1 : comma + 1;
      if (item.empty()) bad("empty range");
      size_t dash = item.find('-');
      std::string lo = item.substr(0, dash);
      std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
      if (lo.empty() || hi.empty() ||
          lo.find_first_not_of("0123456789") != std::string::npos ||
          hi.find_first_not_of("0123456789") != std::string::npos)
        bad("a range must be digits like 01-04");
      long a = std::stol(lo), b = std::stol(hi);
      if (b < a) bad("a range runs backwards");
      for (long v = a; v <= b; ++v) {
        std::string digits = std::to_string(v);
        if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
        hosts.push_back(prefix + digits + suffix);
      }
    }
  }
  if (hosts.empty()) bad("no hosts");
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& value) {
  std::vector<int> counts;
  size_t p = 0;
  while (p < value.size()) {
    size_t comma = value.find(',', p);
    std::string item = value.substr(p, comma == std::string::npos ? std::string::npos : comma - p);
    p = comma == std::string::npos ? value.size() : comma + 1;
    int repeat = 1;
    size_t paren = item.find('(');
    if (paren != std::string::npos) {
      LF_CHECK(item.size() > paren + 3 && item[paren + 1] == 'x' && item.back() == ')',
               "cannot parse SLURM_TASKS_PER_NODE='", value, "' at '", item, "'",
               lf::hint("expected entries like 4 or 2(x3)"));
      repeat = parse_int(item.substr(paren + 2, item.size() - paren - 3), "SLURM_TASKS_PER_NODE");
      item = item.substr(0, paren);
    }
    int n = parse_int(item, "SLURM_TASKS_PER_NODE");
    for (int r = 0; r < repeat; ++r) counts.push_back(n);
  }
  LF_CHECK(!counts.empty(), "SLURM_TASKS_PER_NODE='", value, "' lists no nodes");
  return counts;
}

int slurm_port_from_job_id(const std::string& job_id) {
  std::string digits;
  for (char c : job_id)
    if (c >= '0' && c <= '9') digits += c;
  LF_CHECK(!digits.empty(), "SLURM_JOB_ID='", job_id, "' has no digits to derive a port from",
           lf::hint("export MASTER_PORT"));
  if (digits.size() > 4) digits = digits.substr(digits.size() - 4);
  return 15000 + std::stoi(digits);
}

LaunchEnv detect_launch_env() {
  if (env("RANK") || env("WORLD_SIZE")) return from_torchrun();
  if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE")) return from_openmpi();
  if (env("SLURM_PROCID") || env("SLURM_NTASKS")) return from_slurm();
  return LaunchEnv{};
}

}  // namespace lf::dist

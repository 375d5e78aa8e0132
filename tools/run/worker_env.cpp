#include "worker_env.h"

#include <cstdlib>
#include <map>

extern char** environ;

namespace lf::run {

EnvVars worker_env_overrides(const LaunchOptions& o, int local_rank, int restart_count) {
  const std::string rank = std::to_string(o.global_rank(local_rank));
  const std::string world = std::to_string(o.world_size());
  const std::string restarts = std::to_string(restart_count);
  // One role ("default") per job, as torchrun without --role: role ranks equal global ranks.
  return {
      {"RANK", rank},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", world},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", rank},
      {"ROLE_WORLD_SIZE", world},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", restarts},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.run_id},
      {"LOONGFORGE_RESTART_COUNT", restarts},
      // Workers host their own store at MASTER_ADDR (no agent store): a value inherited from an
      // outer torchrun would make every rank a client of a store nobody serves.
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
  };
}

EnvVars worker_env_defaults(const LaunchOptions& o, std::vector<std::string>* notes) {
  EnvVars d;
  if (o.nproc_per_node > 1 && !std::getenv("OMP_NUM_THREADS")) {
    d.emplace_back("OMP_NUM_THREADS", "1");
    if (notes)
      notes->push_back(
          "loongforge-run: setting OMP_NUM_THREADS=1 for each worker so that " +
          std::to_string(o.nproc_per_node) +
          " processes do not oversubscribe the cores; set it yourself to tune performance");
  }
  // The launcher routes every rank's output itself (files, terminal, failure tails), so each
  // rank's logger writes to its stderr. LOONGFORGE_LOG_DIR is deliberately not set: the core
  // logger would then append to the same rank<R>.log the launcher writes, doubling lines.
  if (!std::getenv("LOONGFORGE_LOG_ALL_RANKS")) d.emplace_back("LOONGFORGE_LOG_ALL_RANKS", "1");
  // torchrun's default: NCCL tears a timed-out or failed communicator down instead of hanging.
  if (!std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")) d.emplace_back("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  return d;
}

std::vector<std::string> build_worker_environment(const EnvVars& defaults, const EnvVars& overrides) {
  // std::map keeps one value per key; later layers win.
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : defaults) env[k] = v;
  for (const auto& [k, v] : overrides) env[k] = v;
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

}  // namespace lf::run

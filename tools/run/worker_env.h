// The environment loongforge-run gives each worker: torchrun's variables (RANK, LOCAL_RANK,
// WORLD_SIZE, ..., TORCHELASTIC_RESTART_COUNT) plus LoongForge's own. A pure function of the
// options, so tests check it without starting processes. Not the process spawning (worker_group.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "launch_options.h"

namespace lf::run {

using EnvVars = std::vector<std::pair<std::string, std::string>>;

// Variables set (overriding the launcher's environment) for local rank `local_rank` in attempt
// `restart_count` (0 for the first start).
EnvVars worker_env_overrides(const LaunchOptions& options, int local_rank, int restart_count);

// Variables set only when the launcher's environment lacks them (OMP_NUM_THREADS=1 when
// nproc > 1, LOONGFORGE_LOG_ALL_RANKS=1). `notes` receives one line per default applied that
// the user should know about (torchrun prints the same OMP note).
EnvVars worker_env_defaults(const LaunchOptions& options, std::vector<std::string>* notes);

// The full environment of a worker: the launcher's own `environ`, then the defaults, then the
// overrides, as "KEY=VALUE" strings ready for execve.
std::vector<std::string> build_worker_environment(const EnvVars& defaults, const EnvVars& overrides);

}  // namespace lf::run

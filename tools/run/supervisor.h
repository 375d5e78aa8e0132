// The supervision policy of loongforge-run: start the local worker group, watch it, and on the
// first failure report it and stop the rest (SIGTERM, SIGKILL after the grace period), or
// restart the group (--max-restarts). Signals to the launcher are forwarded to the workers.
// Not the process mechanics (worker_group.h) nor flag parsing (launch_options.h).
#pragma once

#include "launch_options.h"

namespace lf::run {

// Runs the job to its end and returns the launcher's exit code:
//   0          every worker of the last attempt exited 0;
//   C          the first failed worker exited with code C (restarts exhausted);
//   128 + S    the first failed worker was killed by signal S, or the launcher received
//              SIGINT/SIGTERM/SIGHUP S (workers stopped first).
// Launcher messages go to stderr. Throws lf::Error when workers cannot be started; no worker
// survives the return or the throw. Blocks SIGCHLD/SIGINT/SIGTERM/SIGHUP and ignores SIGPIPE
// while it runs: call it from a single-threaded program (main of loongforge-run).
int run_launcher(const LaunchOptions& options);

}  // namespace lf::run

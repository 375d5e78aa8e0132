// loongforge-train-faults: loongforge-train built with the test-only fault injection that the
// crash, restart and preemption tests drive through the environment (the program users run has
// none of it). First attempt of a job only (LOONGFORGE_RESTART_COUNT unset or 0):
//   LOONGFORGE_TEST_KILL_AT=RANK:ITERATION     global rank RANK SIGKILLs itself after ITERATION
//   LOONGFORGE_TEST_SIGTERM_AT=RANK:ITERATION  ... sends itself SIGTERM instead
//   LOONGFORGE_TEST_CKPT_CRASH_AT=N            SIGKILL at the N-th point (0-based) a save passes
//                                              (after each file, the manifest, the rename, the
//                                              tracker)
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "train_main.h"

namespace {

bool first_attempt() {
  const char* restart = std::getenv("LOONGFORGE_RESTART_COUNT");
  return !(restart && std::atol(restart) != 0);
}

// RANK:ITERATION from `var`; {-1, -1} when unset.
std::pair<long, long> fault_at(const char* var) {
  const char* v = std::getenv(var);
  if (!v || !*v || !first_attempt()) return {-1, -1};
  const char* colon = std::strchr(v, ':');
  if (!colon) return {-1, -1};
  return {std::atol(v), std::atol(colon + 1)};
}

struct CrashInSave : lf::train::SaveHooks {
  long at = -1, count = 0;
  void at_save_point(const char* what) override {
    if (at >= 0 && count++ == at) {
      std::fprintf(stderr, "loongforge: test crash at checkpoint point %ld (%s)\n", at, what);
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  static CrashInSave crash;
  const char* v = std::getenv("LOONGFORGE_TEST_CKPT_CRASH_AT");
  if (v && *v && first_attempt()) crash.at = std::atol(v);
  const auto kill_at = fault_at("LOONGFORGE_TEST_KILL_AT"), term_at = fault_at("LOONGFORGE_TEST_SIGTERM_AT");
  lf::train::TrainerHooks hooks;
  hooks.save = &crash;
  hooks.after_iteration = [kill_at, term_at](int64_t it, int rank) {
    if (kill_at.first == rank && kill_at.second == it) {
      std::fprintf(stderr, "loongforge: test fault: rank %d kills itself after iteration %lld\n", rank,
                   static_cast<long long>(it));
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
    if (term_at.first == rank && term_at.second == it) std::raise(SIGTERM);
  };
  return lf::tools::run_train_program(argc, argv, hooks);
}

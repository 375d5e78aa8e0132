// Rendezvous: connects this process to the job's key-value store, a c10d::TCPStore hosted by
// rank 0 (or by torchrun's agent), within a timeout. Process groups are built on top of it by
// dist::ParallelContext; this class creates no group and moves no tensor.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#include "loongforge/dist/launch_env.h"

namespace lf::dist {

class Rendezvous {
 public:
  // Rank 0 listens on MASTER_PORT and waits for world_size - 1 clients; other ranks connect to
  // MASTER_ADDR:MASTER_PORT, retrying until `timeout`. Under torchrun's agent store every rank is
  // a client and keys live under "/worker/attempt_<restart_count>/". A single process gets an
  // in-memory store. Failure -> lf::Error naming MASTER_ADDR:MASTER_PORT, the rank, the timeout.
  Rendezvous(const LaunchEnv& env, std::chrono::milliseconds timeout);

  const LaunchEnv& env() const { return env_; }
  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

 private:
  LaunchEnv env_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
};

// --distributed-timeout-minutes as the milliseconds every store and group uses.
inline std::chrono::milliseconds timeout_from_minutes(double minutes) {
  return std::chrono::milliseconds(static_cast<int64_t>(minutes * 60'000.0));
}

}  // namespace lf::dist

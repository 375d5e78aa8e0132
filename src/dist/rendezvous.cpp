// Rendezvous (see rendezvous.h) on c10d's TCPStore from libtorch_cpu.so.
#include "loongforge/dist/rendezvous.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "loongforge/core/error.h"

namespace lf::dist {

Rendezvous::Rendezvous(const LaunchEnv& env, std::chrono::milliseconds timeout)
    : env_(env), timeout_(timeout) {
  LF_CHECK(timeout.count() > 0, "rendezvous timeout must be positive, got ", timeout.count(), " ms",
           lf::hint("--distributed-timeout-minutes must be > 0"));
  if (lf::diagnostic_rank() < 0 && env.world_size > 1) lf::set_diagnostic_rank(env.rank);
  if (env.world_size == 1) {
    store_ = c10::make_intrusive<c10d::HashStore>();
    return;
  }
  LF_CHECK(env.master_port > 0 && env.master_port <= 65535, "MASTER_PORT=", env.master_port,
           " is not a TCP port (rank ", env.rank, " of ", env.world_size, ", ", env.source, ")");
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(env.master_port);
  opts.isServer = env.rank == 0 && !env.agent_store;
  opts.numWorkers = static_cast<std::size_t>(env.world_size);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  try {
    c10::intrusive_ptr<c10d::Store> tcp =
        c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
    if (env.agent_store)
      tcp = c10::make_intrusive<c10d::PrefixStore>(
          "/worker/attempt_" + std::to_string(env.restart_count), tcp);
    store_ = std::move(tcp);
  } catch (const std::exception& e) {
    const auto* ce = dynamic_cast<const c10::Error*>(&e);
    std::string role = opts.isServer ? "hosting" : "connecting to";
    LF_FAIL("rendezvous failed: rank ", env.rank, " of ", env.world_size, " (", env.source, ") ",
            role, " the TCPStore at MASTER_ADDR:MASTER_PORT = ", env.master_addr, ":",
            env.master_port, " within the timeout of ", timeout.count(), " ms: ",
            ce ? ce->what_without_backtrace() : e.what(),
            lf::hint(opts.isServer
                         ? "rank 0 hosts the store: is MASTER_PORT free on this host, and did "
                           "every other rank start (they must connect within the timeout)?"
                         : "is rank 0 running and reachable at MASTER_ADDR:MASTER_PORT (same "
                           "values on every rank, no firewall)? Raise "
                           "--distributed-timeout-minutes if ranks start slowly"));
  }
}

}  // namespace lf::dist

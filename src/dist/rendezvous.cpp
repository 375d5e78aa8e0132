// Rendezvous (see rendezvous.h) on c10d's TCPStore from libtorch_cpu.so.
#include "loongforge/dist/rendezvous.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loongforge/core/error.h"

namespace lf::dist {
namespace {

// A listening socket bound to host:port only (not every interface): the TCPStore server takes
// it over (TCPStoreOptions::masterListenFd). Tries each address the host resolves to.
int listen_on(const std::string& host, int port, int rank) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  LF_CHECK(rc == 0 && found, "rendezvous: rank ", rank, " cannot resolve MASTER_ADDR ", host, ": ", ::gai_strerror(rc),
           lf::hint("MASTER_ADDR must name this host (node 0): an address or a resolvable host name"));
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    const int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (s < 0) continue;
    const int one = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s, a->ai_addr, a->ai_addrlen) == 0 && ::listen(s, 2048) == 0) {
      fd = s;
    } else {
      last_error = std::strerror(errno);
      ::close(s);
    }
  }
  ::freeaddrinfo(found);
  LF_CHECK(fd >= 0, "rendezvous: rank 0 cannot listen on MASTER_ADDR:MASTER_PORT = ", host, ":", port, ": ",
           last_error,
           lf::hint("is MASTER_PORT free, and is MASTER_ADDR an address of this host (node 0)?"));
  return fd;
}

}  // namespace

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
  // The server listens only on the address it was given (loopback for a one-node job), never on
  // every interface.
  if (opts.isServer) opts.masterListenFd = listen_on(env.master_addr, env.master_port, env.rank);
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

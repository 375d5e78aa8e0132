// make_gloo_communicator: a ProcessGroupGloo from the wheel's libtorch_cpu.so behind
// C10dCommunicator. This is the one translation unit that includes ProcessGroupGloo.hpp, compiled
// against the declaration shim in cmake/gloo-shim (docs/distributed.md, "Gloo from the wheel").
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "loongforge/backend/c10d_communicator.h"
#include "loongforge/core/error.h"
#include "loongforge/core/strings.h"

namespace lf::backend {
namespace {

std::string env_or(const char* name, std::string fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string join(const std::vector<int>& v) { return lf::bracket_list(v); }

}  // namespace

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), "9", &hints, &res);
  LF_CHECK(rc == 0 && res, "cannot resolve MASTER_ADDR '", host, "': ", gai_strerror(rc),
           lf::hint("set MASTER_ADDR to rank 0's host name or IPv4 address, or GLOO_SOCKET_IFNAME "
                    "to the network interface to use"));
  auto* target = reinterpret_cast<sockaddr_in*>(res->ai_addr);
  if ((ntohl(target->sin_addr.s_addr) >> 24) == 127) {
    freeaddrinfo(res);
    return "127.0.0.1";
  }
  // connect() on a UDP socket only asks the kernel for the route; no packet leaves.
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  LF_CHECK(fd >= 0, "socket() failed: ", std::strerror(errno));
  rc = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  if (rc == 0) rc = getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
  int err = errno;
  close(fd);
  LF_CHECK(rc == 0, "no route from this host to MASTER_ADDR '", host, "': ", std::strerror(err),
           lf::hint("set GLOO_SOCKET_IFNAME to the network interface that reaches rank 0"));
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf);
  return buf;
}

std::unique_ptr<Communicator> make_gloo_communicator(const CommunicatorSpec& spec,
                                                     const GlooOptions& options) {
  const std::string what = lf::str("creating Gloo group '", spec.name, "' (ranks ",
                                   join(spec.ranks), ", this rank's index ", spec.group_rank, ")");
  LF_CHECK(spec.store, what, ": the spec has no store");
  auto opts = c10d::ProcessGroupGloo::Options::create(spec.timeout);
  opts->threads = options.threads;
  std::string iface = options.interface.empty() ? env_or("GLOO_SOCKET_IFNAME", "")
                                                : options.interface;
  std::string bind;
  try {
    if (!iface.empty()) {
      iface = iface.substr(0, iface.find(','));  // torch accepts a list; one device is enough
      bind = "interface " + iface;
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(iface));
    } else {
      std::string master = options.master_addr.empty() ? env_or("MASTER_ADDR", "127.0.0.1")
                                                       : options.master_addr;
      std::string local = local_address_towards(master);
      bind = "address " + local + " (towards MASTER_ADDR " + master + ")";
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local));
    }
  } catch (const lf::Error&) {
    throw;
  } catch (const std::exception& e) {
    LF_FAIL(what, ": cannot create a Gloo device on ", bind, ": ", e.what(),
            lf::hint("set GLOO_SOCKET_IFNAME to an interface that exists on every host (e.g. lo "
                     "for one machine, eth0 ...)"));
  }
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  try {
    // Connects the full mesh: blocks until every member of spec.ranks has got here.
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
        spec.store, spec.group_rank, static_cast<int>(spec.ranks.size()), opts);
  } catch (const std::exception& e) {
    const auto* ce = dynamic_cast<const c10::Error*>(&e);
    LF_FAIL(what, " on ", bind, " failed within ", spec.timeout.count(), " ms: ",
            ce ? ce->what_without_backtrace() : e.what(),
            lf::hint("every member must create the same groups in the same order; a member may "
                     "have failed to start, or the timeout (--distributed-timeout-minutes) is too "
                     "short"));
  }
  return std::make_unique<C10dCommunicator>(spec, std::move(pg));
}

}  // namespace lf::backend

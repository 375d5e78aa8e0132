// Serving a Policy over OpenPI's websocket protocol (openpi_protocol.h), as
// openpi.serving.websocket_policy_server does, so that OpenPI simulator clients
// (openpi_client.WebsocketClientPolicy) drive our policies: on connect the policy is reset and its
// metadata sent; each observation is answered with {"actions", "policy_timing", "server_timing"};
// a request it cannot decode or the policy refuses is answered with the error's text (a text
// frame) and the connection closed with 1011; the server keeps serving. GET /healthz answers
// 200 "OK". Connections are served one message at a time on one thread (inference blocks).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "loongforge/vla/policy.h"

namespace lf::vla {

namespace ws {
class Server;
}

struct PolicyServerOptions {
  std::string host = "127.0.0.1";  // the address bound (only it: 0.0.0.0 for every interface)
  int port = 8000;                 // 0: a free port (port() tells which)
  std::function<void(const std::string&)> log;  // connection events and errors, one line each
};

class PolicyServer {
 public:
  // Binds and listens; an lf::Error "cannot listen on HOST:PORT: <reason>" (e.g. the address in
  // use) otherwise.
  PolicyServer(Policy& policy, PolicyServerOptions options);
  ~PolicyServer();
  int port() const;
  // Serves until stop() (from another thread) or SIGINT / SIGTERM.
  void run();
  void stop();

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::unique_ptr<ws::Server> server_;
};

}  // namespace lf::vla

#include "loongforge/vla/policy_server.h"

#include <chrono>
#include <map>

#include "loongforge/core/error.h"
#include "loongforge/vla/openpi_protocol.h"
#include "loongforge/vla/remote_policy.h"
#include "websocket.h"

namespace lf::vla {
namespace {
double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
// An error's text without the source location: what a client is told.
std::string text_of(const std::exception& e) {
  if (const auto* le = dynamic_cast<const lf::Error*>(&e))
    return le->message() + (le->hint().empty() ? "" : " (" + le->hint() + ")");
  return e.what();
}
}  // namespace

struct PolicyServer::State {
  Policy* policy = nullptr;
  PolicyServerOptions options;
  struct Connection {
    std::chrono::steady_clock::time_point start;
    double prev_total_ms = -1;
  };
  std::map<int64_t, Connection> connections;
};

PolicyServer::PolicyServer(Policy& policy, PolicyServerOptions options) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.policy = &policy;
  s.options = std::move(options);
  ws::ServerHandlers h;
  h.log = s.options.log;
  h.on_open = [&s](int64_t id) {
    s.connections[id] = {};
    s.policy->reset();
    return openpi::encode_json(s.policy->metadata());
  };
  h.on_message = [&s](int64_t id, const std::string& message) -> ws::Reply {
    auto& c = s.connections[id];
    c.start = std::chrono::steady_clock::now();
    Observation obs;
    try {
      obs = openpi::decode_observation(message);
    } catch (const std::exception& e) {
      return {false, "loongforge-serve-policy: malformed request: " + text_of(e)};
    }
    try {
      const auto t = std::chrono::steady_clock::now();
      const at::Tensor actions = s.policy->infer(obs);
      const double infer_ms = ms_since(t);
      LF_CHECK(actions.defined() && actions.dim() == 2, "the policy returned actions of shape ",
               actions.defined() ? actions.sizes() : at::IntArrayRef{}, ", not [H, action_dim]");
      nlohmann::json server_timing = {{"infer_ms", ms_since(c.start)}};
      if (c.prev_total_ms >= 0) server_timing["prev_total_ms"] = c.prev_total_ms;
      return {true, openpi::encode_reply(actions, {{"policy_timing", {{"infer_ms", infer_ms}}},
                                                   {"server_timing", server_timing}})};
    } catch (const std::exception& e) {
      return {false, "loongforge-serve-policy: the policy failed on the request: " + text_of(e)};
    }
  };
  h.on_sent = [&s](int64_t id) {
    auto& c = s.connections[id];
    c.prev_total_ms = ms_since(c.start);
  };
  h.on_close = [&s](int64_t id) { s.connections.erase(id); };
  try {
    server_ = std::make_unique<ws::Server>(s.options.host, s.options.port, std::move(h));
  } catch (const std::runtime_error& e) {
    LF_FAIL(e.what(), lf::hint("is another server on that port? choose another with --port (0: any free port)"));
  }
}

PolicyServer::~PolicyServer() = default;
int PolicyServer::port() const { return server_->port(); }
void PolicyServer::run() { server_->run(); }
void PolicyServer::stop() { server_->stop(); }

namespace {
class RemotePolicy : public Policy {
 public:
  RemotePolicy(const std::string& uri, std::chrono::milliseconds timeout) : uri_(uri) {
    try {
      client_ = std::make_unique<ws::Client>(uri, timeout);
      metadata_ = openpi::decode_json(client_->receive());
    } catch (const ws::ServerError& e) {
      LF_FAIL("the policy server at ", uri, " answered with an error: ", e.what());
    } catch (const std::runtime_error& e) {
      LF_FAIL(e.what(), lf::hint("is loongforge-serve-policy (or an OpenPI server) running there?"));
    }
  }
  nlohmann::json metadata() const override { return metadata_; }
  at::Tensor infer(const Observation& obs) override {
    try {
      client_->send(openpi::encode_observation(obs));
      return openpi::decode_reply(client_->receive()).actions;
    } catch (const ws::ServerError& e) {
      LF_FAIL("the policy server at ", uri_, " answered with an error: ", e.what());
    } catch (const std::runtime_error& e) {
      if (dynamic_cast<const lf::Error*>(&e)) throw;
      LF_FAIL(e.what());
    }
  }

 private:
  std::string uri_;
  std::unique_ptr<ws::Client> client_;
  nlohmann::json metadata_;
};
}  // namespace

std::unique_ptr<Policy> connect_openpi_server(const std::string& uri, std::chrono::milliseconds timeout) {
  return std::make_unique<RemotePolicy>(uri, timeout);
}

}  // namespace lf::vla

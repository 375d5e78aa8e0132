// websocketpp (0.8.2, header-only) over standalone asio; compiled as C++17 (src/vla/CMakeLists.txt).
#include "websocket.h"

#include <csignal>
#include <deque>
#include <map>
#include <websocketpp/client.hpp>
#include <websocketpp/config/asio_no_tls.hpp>
#include <websocketpp/config/asio_no_tls_client.hpp>
#include <websocketpp/server.hpp>

namespace lf::vla::ws {
namespace {
using WsServer = websocketpp::server<websocketpp::config::asio>;
using WsClient = websocketpp::client<websocketpp::config::asio_client>;
using Hdl = websocketpp::connection_hdl;

std::string host_port(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}
}  // namespace

struct Server::Impl {
  WsServer server;
  ServerHandlers h;
  std::map<Hdl, int64_t, std::owner_less<Hdl>> ids;
  int64_t next_id = 0;
  int port = 0;
  std::unique_ptr<asio::signal_set> signals;

  void log(const std::string& line) {
    if (h.log) h.log(line);
  }
  std::string remote(Hdl hdl) {
    websocketpp::lib::error_code ec;
    auto con = server.get_con_from_hdl(hdl, ec);
    return ec ? std::string("?") : con->get_remote_endpoint();
  }
};

Server::Server(const std::string& host, int port, ServerHandlers handlers) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.h = std::move(handlers);
  WsServer& s = m.server;
  s.clear_access_channels(websocketpp::log::alevel::all);
  s.clear_error_channels(websocketpp::log::elevel::all);
  s.init_asio();
  s.set_reuse_addr(true);
  s.set_max_message_size(size_t{1} << 34);  // OpenPI serves with max_size=None

  s.set_open_handler([&m](Hdl hdl) {
    const int64_t id = m.next_id++;
    m.ids[hdl] = id;
    m.log("connection " + std::to_string(id) + " from " + m.remote(hdl) + " opened");
    websocketpp::lib::error_code ec;
    m.server.send(hdl, m.h.on_open(id), websocketpp::frame::opcode::binary, ec);
  });
  s.set_message_handler([&m](Hdl hdl, WsServer::message_ptr msg) {
    const auto it = m.ids.find(hdl);
    if (it == m.ids.end()) return;
    const int64_t id = it->second;
    const Reply r = m.h.on_message(id, msg->get_payload());
    websocketpp::lib::error_code ec;
    if (r.ok) {
      m.server.send(hdl, r.data, websocketpp::frame::opcode::binary, ec);
      if (m.h.on_sent) m.h.on_sent(id);
      return;
    }
    // As OpenPI's server: the error as a text frame, then close with 1011 (internal error).
    m.log("connection " + std::to_string(id) + ": " + r.data);
    m.server.send(hdl, r.data, websocketpp::frame::opcode::text, ec);
    m.server.close(hdl, websocketpp::close::status::internal_endpoint_error,
                   "Internal server error. Traceback included in previous frame.", ec);
  });
  auto closed = [&m](Hdl hdl) {
    const auto it = m.ids.find(hdl);
    if (it == m.ids.end()) return;
    m.log("connection " + std::to_string(it->second) + " closed");
    if (m.h.on_close) m.h.on_close(it->second);
    m.ids.erase(it);
  };
  s.set_close_handler(closed);
  s.set_fail_handler(closed);
  s.set_http_handler([&m](Hdl hdl) {
    auto con = m.server.get_con_from_hdl(hdl);
    con->append_header("Content-Type", "text/plain");
    if (con->get_resource() == "/healthz") {
      con->set_status(websocketpp::http::status_code::ok);
      con->set_body("OK\n");
    } else {
      con->set_status(websocketpp::http::status_code::upgrade_required);
      con->set_body("Failed to open a WebSocket connection: this is a websocket policy server (GET /healthz checks "
                    "its health).\n");
    }
  });

  asio::error_code aec;
  asio::ip::tcp::endpoint ep;
  const asio::ip::address addr = asio::ip::make_address(host, aec);
  if (!aec) {
    ep = asio::ip::tcp::endpoint(addr, static_cast<unsigned short>(port));
  } else {
    asio::ip::tcp::resolver resolver(s.get_io_service());
    auto results = resolver.resolve(host, std::to_string(port), aec);
    if (aec || results.empty())
      throw std::runtime_error("cannot listen on " + host_port(host, port) + ": cannot resolve '" + host +
                               "': " + (aec ? aec.message() : std::string("no address")));
    ep = results.begin()->endpoint();
  }
  websocketpp::lib::error_code ec;
  s.listen(ep, ec);
  if (ec) throw std::runtime_error("cannot listen on " + host_port(host, port) + ": " + ec.message());
  m.port = s.get_local_endpoint(aec).port();
  s.start_accept(ec);
  if (ec) throw std::runtime_error("cannot accept on " + host_port(host, port) + ": " + ec.message());
}

Server::~Server() = default;

int Server::port() const { return impl_->port; }

void Server::run() {
  Impl& m = *impl_;
  m.signals = std::make_unique<asio::signal_set>(m.server.get_io_service(), SIGINT, SIGTERM);
  m.signals->async_wait([this](const asio::error_code& ec, int) {
    if (!ec) stop();
  });
  m.server.run();
}

void Server::stop() {
  Impl& m = *impl_;
  asio::post(m.server.get_io_service(), [&m] {
    websocketpp::lib::error_code ec;
    m.server.stop_listening(ec);
    for (const auto& [hdl, id] : m.ids) m.server.close(hdl, websocketpp::close::status::going_away, "server stopping", ec);
    m.server.stop();
  });
}

struct Client::Impl {
  WsClient client;
  WsClient::connection_ptr con;
  std::deque<std::pair<websocketpp::frame::opcode::value, std::string>> inbox;
  bool open = false, closed = false;
  std::string failure, close_reason, uri;
  std::chrono::milliseconds timeout{0};

  // Runs the event loop until pred() or the timeout; throws when the connection is gone.
  template <class Pred>
  void pump(Pred pred, const char* waiting_for) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
      if (!failure.empty()) throw std::runtime_error("cannot connect to " + uri + ": " + failure);
      if (closed) throw std::runtime_error("the server at " + uri + " closed the connection" + close_reason);
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        throw std::runtime_error("no answer from " + uri + " within " + std::to_string(timeout.count()) + " ms (" +
                                 waiting_for + ")");
      client.get_io_service().run_one_for(deadline - now);
    }
  }
};

Client::Client(const std::string& uri, std::chrono::milliseconds timeout) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.uri = uri;
  m.timeout = timeout;
  WsClient& c = m.client;
  c.clear_access_channels(websocketpp::log::alevel::all);
  c.clear_error_channels(websocketpp::log::elevel::all);
  c.init_asio();
  c.start_perpetual();
  c.set_max_message_size(size_t{1} << 34);
  c.set_open_handler([&m](Hdl) { m.open = true; });
  c.set_message_handler([&m](Hdl, WsClient::message_ptr msg) {
    m.inbox.emplace_back(msg->get_opcode(), msg->get_payload());
  });
  c.set_close_handler([&m](Hdl) {
    m.closed = true;
    m.close_reason = " (code " + std::to_string(m.con->get_remote_close_code()) + ": " +
                     m.con->get_remote_close_reason() + ")";
  });
  c.set_fail_handler([&m](Hdl) {
    const auto ec = m.con->get_ec();
    m.failure = ec ? ec.message() : std::string("the connection failed");
    // The transport's pass-through error carries the socket's.
    if (m.con->get_transport_ec()) m.failure = m.con->get_transport_ec().message();
  });
  websocketpp::lib::error_code ec;
  m.con = c.get_connection(uri, ec);
  if (ec) throw std::runtime_error("bad websocket address '" + uri + "': " + ec.message() + " (write ws://HOST:PORT)");
  c.connect(m.con);
  m.pump([&m] { return m.open; }, "connecting");
}

Client::~Client() {
  Impl& m = *impl_;
  try {
    if (m.open && !m.closed) {
      websocketpp::lib::error_code ec;
      m.client.close(m.con, websocketpp::close::status::normal, "", ec);
      m.timeout = std::chrono::milliseconds(1000);
      m.pump([&m] { return m.closed; }, "closing");
    }
  } catch (const std::exception&) {
  }
  m.client.stop_perpetual();
}

std::string Client::receive() {
  Impl& m = *impl_;
  m.pump([&m] { return !m.inbox.empty(); }, "waiting for a message");
  auto [op, data] = std::move(m.inbox.front());
  m.inbox.pop_front();
  if (op == websocketpp::frame::opcode::text) throw ServerError(data);
  return data;
}

void Client::send(const std::string& binary) {
  Impl& m = *impl_;
  if (m.closed) throw std::runtime_error("the server at " + m.uri + " closed the connection" + m.close_reason);
  websocketpp::lib::error_code ec;
  m.client.send(m.con, binary, websocketpp::frame::opcode::binary, ec);
  if (ec) throw std::runtime_error("cannot send to " + m.uri + ": " + ec.message());
}

}  // namespace lf::vla::ws

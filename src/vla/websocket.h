// The websocket transport of the policy server and client (websocketpp over standalone asio):
// plain strings in and out, no LibTorch, so that websocket.cpp can be compiled as C++17
// (websocketpp 0.8.2 does not compile as C++20). Internal to the vla layer.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace lf::vla::ws {

// A server for one message protocol: on connect the server sends on_open's bytes (binary); each
// binary or text message is answered with on_message's reply: binary on success; on an error its
// text as a text frame, then the connection is closed with code 1011 (the server keeps serving).
// Plain HTTP GET /healthz is answered 200 "OK\n"; other plain HTTP requests 426 (upgrade required).
struct Reply {
  bool ok = true;
  std::string data;
};
struct ServerHandlers {
  std::function<std::string(int64_t connection)> on_open;
  std::function<Reply(int64_t connection, const std::string& message)> on_message;
  std::function<void(int64_t connection)> on_sent;  // a reply has been handed to the socket
  std::function<void(int64_t connection)> on_close;
  std::function<void(const std::string& line)> log;  // connection events
};

class Server {
 public:
  // Binds host:port (port 0: any free port) and listens; a std::runtime_error "cannot listen on
  // HOST:PORT: <reason>" otherwise. host: an IPv4/IPv6 address or a name resolved to its first.
  Server(const std::string& host, int port, ServerHandlers handlers);
  ~Server();
  int port() const;  // the bound port
  // Serves until stop() (safe from another thread).
  void run();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A blocking client: connects to uri (ws://host:port[/path]) and receives its first message.
// Errors (no connection, a closed connection, a timeout) are std::runtime_errors; a text frame
// from the server is a ServerError carrying its text.
struct ServerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
class Client {
 public:
  Client(const std::string& uri, std::chrono::milliseconds timeout);
  ~Client();
  // The messages received so far are taken in order.
  std::string receive();
  void send(const std::string& binary);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lf::vla::ws

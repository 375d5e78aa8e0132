// A Policy served elsewhere over OpenPI's websocket protocol (openpi_protocol.h): the C++
// counterpart of openpi_client.WebsocketClientPolicy, for loongforge-eval --server.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "loongforge/vla/policy.h"

namespace lf::vla {

// Connects to uri (ws://HOST:PORT) and reads the server's metadata (metadata()). infer() sends the
// observation (every array, env/ included, and the prompt) and returns the reply's "actions";
// the server's error text becomes an lf::Error quoting it. reset() sends nothing (as OpenPI's
// client). An lf::Error when the server cannot be reached or does not answer within `timeout`.
std::unique_ptr<Policy> connect_openpi_server(const std::string& uri,
                                              std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace lf::vla

// loongforge-serve-policy: serves a policy over OpenPI's websocket protocol
// (vla/policy_server.h), so that OpenPI simulator clients (openpi_client.WebsocketClientPolicy)
// and loongforge-eval --server drive it.
//   loongforge-serve-policy [--host 127.0.0.1] [--port 8000] [--policy expert|random | --policy pi05|groot --load CKPT
//       --data-path STORE|LEROBOT_DATASET [--tokenizer-model DIR]] [--chunk 10] [--seed 0]
// Prints "serving ... on ws://HOST:PORT" once listening (--port 0: the port chosen), one line per
// connection event on stderr, and runs until SIGINT / SIGTERM (exit 0). Errors become one message
// on stderr and exit code 1 (2 for usage errors).
#include <CLI/CLI.hpp>
#include <iostream>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/vla/policy.h"
#include "loongforge/vla/policy_server.h"

int main(int argc, char** argv) {
  std::string host = "127.0.0.1", policy_name = "expert";
  int port = 8000;
  lf::vla::PolicyOptions po;
  std::string choices;
  for (const auto& [name, what] : lf::vla::policy_names()) choices += (choices.empty() ? "" : ", ") + name + " (" + what + ")";
  CLI::App app{"loongforge-serve-policy: a policy served over OpenPI's websocket protocol"};
  app.add_option("--host", host, "The address to bind (only it; 0.0.0.0: every interface)")->capture_default_str();
  app.add_option("--port", port, "The TCP port (0: any free port, printed)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--policy", policy_name, "The policy: " + choices)->capture_default_str();
  app.add_option("--chunk", po.chunk, "The scripted policies' chunk length H (actions per reply)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  app.add_option("--seed", po.seed, "The random policy's seed (pi05, groot: their noise's)")->capture_default_str();
  app.add_option("--load", po.load, "--policy pi05 / groot: the trained policy's checkpoint directory");
  app.add_option("--data-path", po.data_path,
                 "--policy pi05 / groot: the reach demo store it was trained on (its image size, prompt vocabulary, action "
                 "scale); pi05: or the LeRobot dataset (its cameras, normalisation stats)");
  app.add_option("--tokenizer-model", po.tokenizer,
                 "--policy pi05 on a LeRobot dataset: the tokenizer it was trained with (default: the one its checkpoint's "
                 "config.yaml names)");
  lf::log::init(lf::log::options_from_env(-1, 1));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (const auto unknown = lf::vla::unknown_policy_message(policy_name); !unknown.empty()) {
    std::cerr << "loongforge-serve-policy: error: " << unknown << "\n";
    return 2;
  }
  if ((policy_name == "pi05" || policy_name == "groot") && app.count("--chunk")) {
    std::cerr << "loongforge-serve-policy: error: --chunk sets the scripted policies' chunk; a trained policy predicts the chunk it "
                 "was trained for (pi05: model.chunk_size, groot: model.action_horizon)\n";
    return 2;
  }
  try {
    auto policy = lf::vla::make_policy(policy_name, po);
    lf::vla::PolicyServerOptions so;
    so.host = host;
    so.port = port;
    so.log = [](const std::string& line) { std::cerr << "loongforge-serve-policy: " << line << std::endl; };
    lf::vla::PolicyServer server(*policy, so);
    const std::string hp = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                           std::to_string(server.port());
    std::cout << "loongforge-serve-policy: serving the " << policy_name << " policy on ws://" << hp
              << " (health check: http://" << hp << "/healthz)" << std::endl;
    server.run();
    std::cout << "loongforge-serve-policy: stopped" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    lf::log::flush();
    std::cerr << "loongforge-serve-policy: error: " << e.what() << "\n";
    return 1;
  }
}

// loongforge-serve-policy started in the background for a test: its arguments, its log file; the
// ws:// address it prints once it serves (empty when it never does within a minute) and its pid.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "../tools/pp_training.h"

namespace lf::testing {

struct ServedPolicy {
  long pid = 0;
  std::string uri;  // ws://HOST:PORT
  void stop() const {
    if (pid > 0) ::kill(static_cast<pid_t>(pid), SIGTERM);
  }
};

inline ServedPolicy serve_policy(const std::string& args, const std::string& log) {
  ServedPolicy s;
  const std::string cmd = bin("loongforge-serve-policy") + " --port 0 " + args + " > " + log + " 2>&1 & echo $!";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return s;
  if (std::fscanf(p, "%ld", &s.pid) != 1) s.pid = 0;
  ::pclose(p);
  for (int i = 0; i < 600 && s.uri.empty(); ++i) {
    const std::string text = read_file(log);
    const auto at = text.find("on ws://");
    if (at != std::string::npos) s.uri = text.substr(at + 3, text.find(' ', at + 3) - at - 3);
    if (s.uri.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return s;
}

}  // namespace lf::testing

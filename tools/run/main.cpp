// loongforge-run: the torchrun-style launcher. Turns flag errors into exit code 2 and setup
// errors into exit code 1; everything else is lf::run::run_launcher's (docs/launcher.md).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "launch_options.h"
#include "loongforge/core/error.h"
#include "supervisor.h"

int main(int argc, char** argv) {
  // Pipes created later must not land on fds 0-2 if the launcher was started with one closed.
  for (int fd = 0; fd <= 2; ++fd)
    if (fcntl(fd, F_GETFD) < 0) open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);

  std::vector<std::string> args(argv + 1, argv + argc);
  lf::run::LaunchOptions options;
  try {
    std::string help;
    auto parsed = lf::run::parse_launch_options(args, &help);
    if (!parsed) {
      std::fputs(help.c_str(), stdout);
      return 0;
    }
    options = std::move(*parsed);
  } catch (const lf::run::UsageError& e) {
    std::fprintf(stderr, "loongforge-run: error: %s\nHINT: %s\n", e.what(), e.hint().c_str());
    return 2;
  }
  try {
    return lf::run::run_launcher(options);
  } catch (const lf::Error& e) {
    std::fprintf(stderr, "loongforge-run: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loongforge-run: error: %s\n", e.what());
  }
  return 1;
}

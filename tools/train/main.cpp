// loongforge-train: one rank of a training job (a single process when no launcher variables are
// set). Resolves the configuration (YAML composition + Megatron flags + Hydra overrides), builds
// the parallel context, backend, model and data, and trains. Errors become a message and a
// non-zero exit: 2 for configuration and usage errors, 1 for everything else.
#include <cstdio>
#include <exception>
#include <iostream>

#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/flags.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "train_main.h"

int main(int argc, char** argv) {
  try {
    auto cl = lf::config::parse_train_command_line(argc, argv);
    if (cl.help) {
      std::cout << lf::config::help_text();
      return 0;
    }
    return lf::tools::train_main(cl);
  } catch (const lf::config::ConfigError& e) {
    std::cerr << "loongforge-train: " << e.what() << std::endl;
    return 2;
  } catch (const lf::Error& e) {
    lf::log::flush();
    std::cerr << "loongforge-train: error: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    lf::log::flush();
    std::cerr << "loongforge-train: unexpected error: " << e.what() << std::endl;
    return 1;
  }
}

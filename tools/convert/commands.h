// The subcommands of loongforge-convert. Each add_*_command registers one CLI11 subcommand whose
// callback does the work and throws lf::Error on failure (main turns it into a message and exit
// code 1). A new command: declare its add function here and list it in main.cpp's kCommands.
#pragma once

#include <CLI/CLI.hpp>

namespace lf::tools::convert {

void add_hf2lf_command(CLI::App& app);  // hf.cpp
void add_lf2hf_command(CLI::App& app);  // hf.cpp
void add_reshard_command(CLI::App& app);  // reshard.cpp

}  // namespace lf::tools::convert

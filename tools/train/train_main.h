// The body of loongforge-train after argument parsing: configuration, dry run, training; and the
// whole program (parsing, errors to messages and exit codes: 2 for configuration and usage
// errors, 1 for everything else). `hooks` are empty in the program users run; a test build
// passes its fault injection (tests/tools/fault_train.cpp).
#pragma once

#include "loongforge/core/config/flags.h"
#include "loongforge/train/trainer.h"

namespace lf::tools {
int train_main(const lf::config::TrainCommandLine& cl, const lf::train::TrainerHooks& hooks);
int run_train_program(int argc, char** argv, const lf::train::TrainerHooks& hooks);
}  // namespace lf::tools

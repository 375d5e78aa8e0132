// The body of loongforge-train after argument parsing: configuration, dry run, training.
#pragma once

#include "loongforge/core/config/flags.h"

namespace lf::tools {
int train_main(const lf::config::TrainCommandLine& cl);
}

// loongforge-train: one rank of a training job (a single process when no launcher variables are
// set). Resolves the configuration (YAML composition + Megatron flags + Hydra overrides), builds
// the parallel context, backend, model and data, and trains. Errors become a message and a
// non-zero exit: 2 for configuration and usage errors, 1 for everything else.
#include "train_main.h"

int main(int argc, char** argv) { return lf::tools::run_train_program(argc, argv, {}); }

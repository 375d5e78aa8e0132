// loongforge-convert reshard: rewrites a native checkpoint for another TP x PP (x DP) layout,
// optimizer state included (train/checkpoint.h reshard_checkpoint). Any layout can load any
// checkpoint directly; this produces per-rank files of the target layout offline.
//   loongforge-convert reshard --load A --save B --tp N [--pp N] [--dp N] [--iteration N]
#include <iostream>

#include "commands.h"
#include "loongforge/train/checkpoint.h"
#include "loongforge/train/checkpoint_format.h"

namespace lf::tools::convert {

void add_reshard_command(CLI::App& app) {
  struct Options {
    std::string load, save;
    int tp = 1, pp = 1, dp = 1;
    int64_t iteration = -1;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("reshard", "Rewrite a native checkpoint for another TP/PP/DP layout");
  cmd->add_option("--load", o->load, "Checkpoint directory (the --save of a run, or an iter_NNNNNNN dir)")
      ->required();
  cmd->add_option("--save", o->save, "Output directory (a new one)")->required();
  cmd->add_option("--tp", o->tp, "Tensor-parallel size of the output")->check(CLI::PositiveNumber);
  cmd->add_option("--pp", o->pp, "Pipeline-parallel size of the output")->check(CLI::PositiveNumber);
  cmd->add_option("--dp", o->dp, "Data-parallel shards of the optimizer state")->check(CLI::PositiveNumber);
  cmd->add_option("--iteration", o->iteration, "Iteration to convert (default: the latest)");
  cmd->callback([o] {
    lf::train::reshard_checkpoint(o->load, o->save, o->tp, o->pp, o->dp, o->iteration);
    std::cout << "wrote " << o->save << "/" << lf::train::ckpt::iteration_dir_name(
                     lf::train::ckpt::read_tracker(o->save).value_or(0))
              << " (tp " << o->tp << ", pp " << o->pp << ", dp " << o->dp << ")\n";
  });
}

}  // namespace lf::tools::convert

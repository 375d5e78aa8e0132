// loongforge-convert: offline checkpoint conversion.
//   loongforge-convert hf2lf --hf-dir D --out O [--tp N --pp N] [--dtype keep|bf16|fp16|fp32]
//   loongforge-convert lf2hf --load O --out D [--dtype bf16|fp16|fp32] [--iteration N]
//                            [--architecture A] [--max-shard-size 5GB]
// D may also be a diffusers WanTransformer3DModel directory (<-> a flow_matching checkpoint).
// docs/conversion.md has the details. Errors become one message on stderr and exit code 1 (2 for
// usage errors).
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"

namespace {
using AddCommand = void (*)(CLI::App&);
// Every subcommand, in --help order.
constexpr AddCommand kCommands[] = {
    lf::tools::convert::add_hf2lf_command,
    lf::tools::convert::add_lf2hf_command,
    lf::tools::convert::add_reshard_command,
};
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loongforge-convert: HF <-> LoongForge checkpoints, resharding"};
  app.require_subcommand(1);
  for (AddCommand add : kCommands) add(app);
  lf::log::init(lf::log::options_from_env(-1, 1));
  try {
    app.parse(argc, argv);  // the chosen subcommand's callback runs here
    return 0;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; usage errors: 2
  } catch (const lf::Error& e) {
    std::cerr << "loongforge-convert: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "loongforge-convert: error: " << e.what() << "\n";
    return 1;
  }
}

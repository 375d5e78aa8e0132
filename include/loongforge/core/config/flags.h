// Megatron-compatible command-line flags of loongforge-train. ONE table maps each flag to a
// config key; parsing, --help and the docs' flag table all read it, so they cannot drift. A flag
// becomes a `++key=value` override whose origin is the flag. Not a general argument parser: the
// launcher's options live in tools/run.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loongforge/core/config/compose.h"

namespace lf::config {

struct FlagSpec {
  enum class Kind {
    store_true,   // --bf16                  -> key=true
    store_false,  // --disable-bias-linear   -> key=false
    value,        // --lr 3e-4 / --lr=3e-4   -> key=3e-4
    list,         // --data-path 0.3 A 0.7 B -> key=[0.3, A, 0.7, B] (values up to the next flag)
    comma_list,   // --split 98,2,0          -> key=[98, 2, 0]
  };
  std::string_view flag;     // "--lr"
  std::string_view key;      // "optimizer.lr"
  Kind kind;
  std::string_view metavar;  // "LR" (empty for switches)
  std::string_view help;
};

// The table, grouped by config section, in the order --help prints it.
const std::vector<FlagSpec>& flag_table();
// Megatron flags refused with the feature they wait for (parse_train_command_line errors on them).
std::vector<std::string> refused_flag_names();
// The row of a flag ("--lr"), or null.
const FlagSpec* find_flag(std::string_view flag);

struct TrainCommandLine {
  std::string config_file;          // --config-file FILE ("" when absent)
  std::vector<Override> overrides;  // flags and bare Hydra overrides, in command-line order
  bool dry_run = false;             // --dry-run
  bool show_origin = false;         // --show-origin
  bool help = false;                // --help / -h
};

// Parses loongforge-train's arguments (argv[0] is skipped). Unknown flags (with the nearest valid
// one), missing values and malformed overrides are all reported in one ConfigError.
TrainCommandLine parse_train_command_line(int argc, const char* const* argv);
TrainCommandLine parse_train_command_line(std::span<const std::string> args);

// --help text, generated from the table.
std::string help_text();
// The docs' flag table (markdown), generated from the table; docs/configuration.md holds it
// between <!-- flags:begin --> and <!-- flags:end -->.
std::string flags_markdown();

}  // namespace lf::config

// Hydra-style composition of YAML files through `defaults:` lists, and command-line overrides
// (`a.b=v`, `+a.b=v`, `++a.b=v`, `~a.b`, `group=option`). The result is an un-interpolated tree;
// interpolation is interpolate.h, typed validation is schema.h, the whole pipeline is
// job_config.h's load_job. docs/configuration.md states the rules this file implements.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/node.h"

namespace lf::config {

// One override, from a bare command-line argument or from a Megatron flag (which becomes a
// `++key=value` override whose origin is the flag).
struct Override {
  enum class Kind {
    set,       // a.b=v   the key must exist
    add,       // +a.b=v  the key must not exist
    force,     // ++a.b=v add or replace
    erase,     // ~a.b or ~a.b=v (then only when the current value equals v)
  };
  Kind kind = Kind::set;
  std::string key;            // dotted path, or a defaults group ("models/llama@model.foundation")
  std::optional<Node> value;  // absent only for `~a.b`
  Origin origin;              // Origin::from_override(text) or Origin::from_flag("--lr 3e-4")
  std::string text;           // the override as written

  // Parses one override argument. Values are YAML ("[1,2]", "{x: 1}", "null", "'3'").
  // Throws ConfigError on a malformed argument.
  static Override parse(const std::string& text);
  // A `++key=value` override from a flag.
  static Override from_flag(std::string key, Node value, std::string flag_text);
};

struct ComposeOptions {
  std::string config_root;            // the configs/ directory; "" = <repo>/configs (source_configs_dir())
  std::string config_file;            // the primary config (any path); "" = none (an empty tree)
  std::vector<Override> overrides;    // applied left to right after the files
  // Merged underneath the files before overrides are applied (so `a.b=v` may set a key that only
  // a schema default provides). load_job passes the job schema's defaults.
  std::optional<Node> base;
};

// The configs/ directory of the source tree this library was built from.
std::string source_configs_dir();

// Builds the tree: defaults lists (recursively), then `base` filled in underneath, then the
// overrides in order. Defaults-group overrides (`group=option`, `+group=option`, `~group`) act on
// the defaults lists instead. Problems are added to `errors` (composition continues past them
// where it can); the returned tree is meaningful only when `errors` stayed empty.
Node compose(const ComposeOptions& options, ErrorList& errors);
// Same, throwing ConfigError.
Node compose(const ComposeOptions& options);

// Applies config overrides (not defaults-group ones) to `tree`, in order.
void apply_overrides(Node& tree, const std::vector<Override>& overrides, ErrorList& errors);

}  // namespace lf::config

// YAML text <-> lf::config::Node. Parsing keeps the line and column of every value (from
// yaml-cpp's marks); printing writes block YAML that parses back to the same tree, optionally
// with a trailing "# origin" comment per leaf (--show-origin). Not composition: see compose.h.
#pragma once

#include <string>
#include <string_view>

#include "loongforge/core/config/node.h"

namespace lf::config {

// Parses a YAML file (one document; an empty file is an empty map). Values get
// Origin::from_file(display_path(path), line, column). Throws ConfigError on a syntax error
// (file:line and yaml-cpp's message) or a duplicate key.
Node parse_yaml_file(const std::string& path);

// Parses YAML text; every value gets `origin` (line/column are added when origin is a file).
// Used for override values ("[1,2]", "{x: 1}", "null", "'quoted'").
Node parse_yaml_string(std::string_view text, const Origin& origin);

// Block YAML. With show_origin every leaf (scalar, null, flow sequence, empty map) ends with
// "  # <origin>" (Origin::str()).
std::string to_yaml(const Node& node, bool show_origin = false);

// The path as shown in origins and messages: relative to the current directory when the file is
// below it, otherwise absolute (normalised).
std::string display_path(const std::string& path);

}  // namespace lf::config

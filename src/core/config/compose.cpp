// Hydra-style defaults lists. Each file is merged, depth first, into one accumulating tree at its
// package; a file's own content goes where its `_self_` entry is (after its defaults when there
// is none, as Hydra 1.1+). Choice overrides (`group=option` on the command line, `override`
// entries in defaults lists; the command line wins) replace the option of a group entry wherever
// it appears in the tree. docs/configuration.md is the user-facing statement of these rules.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "loongforge/core/config/compose.h"
#include "loongforge/core/config/yaml.h"

#ifndef LOONGFORGE_CONFIG_SOURCE_DIR
#define LOONGFORGE_CONFIG_SOURCE_DIR "configs"
#endif

namespace lf::config {
namespace fs = std::filesystem;

std::string source_configs_dir() {
  if (const char* env = std::getenv("LOONGFORGE_CONFIGS_DIR"); env && *env) return env;
  return LOONGFORGE_CONFIG_SOURCE_DIR;
}

namespace {

struct Entry {
  enum class Kind { self, config, group };
  Kind kind = Kind::config;
  bool optional = false;
  bool is_override = false;
  std::string name;                   // group (group entries) or config path, as written
  std::string package;                // after '@', as written ("" when none)
  std::optional<std::string> option;  // group entries: nullopt for `group: null`
  Origin origin;
  std::string text;                   // as written, for messages
};

struct Choice {
  std::string key;                    // "models/llama" or "models/llama@model.foundation"
  std::optional<std::string> option;  // nullopt: delete the entry
  Origin origin;
  std::string text;
  bool used = false;
  int override_index = -1;  // a bare `key=value` from the command line: maybe a config override
};

std::string strip_slash(std::string s) {
  while (!s.empty() && s.front() == '/') s.erase(s.begin());
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

std::string slash_to_dot(std::string s) {
  std::replace(s.begin(), s.end(), '/', '.');
  return s;
}

std::string join_group(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "/" + b;
}

void split_at(const std::string& s, std::string& name, std::string& package) {
  size_t at = s.find('@');
  name = s.substr(0, at);
  package = at == std::string::npos ? "" : s.substr(at + 1);
}

class Composer {
 public:
  Composer(const ComposeOptions& options, ErrorList& errors)
      : root_(options.config_root.empty() ? source_configs_dir() : options.config_root),
        errors_(errors) {}

  // Classifies the command-line overrides: those naming a defaults group become choices (used
  // while composing); the others are config overrides, applied to the tree afterwards.
  void take_choices(const std::vector<Override>& overrides) {
    is_config_override_.assign(overrides.size(), false);
    for (size_t i = 0; i < overrides.size(); ++i) {
      const Override& o = overrides[i];
      const bool group_syntax =
          o.key.find('/') != std::string::npos || o.key.find('@') != std::string::npos;
      const bool scalar_value = !o.value || o.value->is_scalar() || o.value->is_null();
      const bool bare = o.key.find('.') == std::string::npos;
      std::string name, package;
      split_at(o.key, name, package);
      std::error_code ec;
      const bool is_dir = !name.empty() && fs::is_directory(fs::path(root_) / strip_slash(name), ec);
      if (o.origin.kind == Origin::Kind::flag || !(group_syntax || (bare && scalar_value))) {
        is_config_override_[i] = true;
        continue;
      }
      if (o.kind == Override::Kind::add) {
        if ((group_syntax || is_dir) && o.value && o.value->is_scalar()) {
          appended_.push_back(make_entry_from_override(o));
        } else {
          is_config_override_[i] = true;
        }
        continue;
      }
      Choice c;
      c.key = strip_slash(o.key);
      if (o.kind != Override::Kind::erase && o.value && o.value->is_scalar()) c.option = o.value->text();
      c.origin = o.origin;
      c.text = o.text;
      c.override_index = group_syntax ? -1 : static_cast<int>(i);
      choices_.push_back(std::move(c));
    }
    cli_choices_ = choices_.size();
  }

  // Which overrides apply to the tree (after run(): a bare `key=value` that named no group is
  // an ordinary override after all).
  const std::vector<bool>& config_overrides() const { return is_config_override_; }

  // The un-interpolated tree of the files.
  Node run(const std::string& primary) {
    Node tree = Node::map();
    if (!primary.empty()) {
      std::string group;
      std::error_code ec;
      fs::path rel = fs::weakly_canonical(fs::absolute(primary), ec)
                         .parent_path()
                         .lexically_relative(fs::weakly_canonical(fs::absolute(root_), ec));
      if (!rel.empty() && *rel.begin() != ".." && rel != ".") group = rel.generic_string();
      load_file(primary, "", group, tree, /*primary=*/true);
    } else if (!appended_.empty()) {
      process_entries(appended_, "", "", tree, nullptr);
    }
    for (const Choice& c : choices_) {
      if (c.used) continue;
      if (c.override_index >= 0) {
        is_config_override_[c.override_index] = true;
        continue;
      }
      std::vector<std::string> groups(seen_groups_.begin(), seen_groups_.end());
      std::string near = nearest(c.key, groups);
      errors_.add("", c.origin, "'" + c.text + "' names no group of the defaults lists",
                  (near.empty() ? std::string() : "did you mean '" + near + "'? ") +
                      "groups in use: " + join(groups));
    }
    return tree;
  }

 private:
  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? "(none)" : s;
  }

  Entry make_entry_from_override(const Override& o) {
    Entry e;
    e.kind = Entry::Kind::group;
    split_at(o.key, e.name, e.package);
    e.name = "/" + strip_slash(e.name);
    e.option = o.value->text();
    e.origin = o.origin;
    e.text = o.text;
    return e;
  }

  std::vector<Entry> parse_entries(const Node& list) {
    std::vector<Entry> entries;
    if (!list.is_sequence()) {
      errors_.add("defaults", list.origin(), "'defaults' must be a list",
                  "write `defaults:` followed by `- group: option` lines");
      return entries;
    }
    for (const Node& item : list.children()) {
      Entry e;
      e.origin = item.origin();
      if (item.is_scalar()) {
        e.text = item.text();
        if (item.text() == "_self_") {
          e.kind = Entry::Kind::self;
        } else {
          e.kind = Entry::Kind::config;
          split_at(item.text(), e.name, e.package);
        }
      } else if (item.is_map() && item.size() == 1) {
        const Node& kv = item.children()[0];
        e.kind = Entry::Kind::group;
        std::string key = kv.key();
        for (const char* kw : {"optional ", "override "}) {
          while (key.starts_with(kw)) {
            (std::string_view(kw) == "optional " ? e.optional : e.is_override) = true;
            key = key.substr(std::string_view(kw).size());
          }
        }
        split_at(key, e.name, e.package);
        e.text = kv.key() + ": " + (kv.is_scalar() ? kv.text() : "null");
        if (kv.is_scalar()) {
          e.option = kv.text();
        } else if (!kv.is_null()) {
          errors_.add("defaults", kv.origin(),
                      "defaults entry '" + kv.key() + "' must name one option, not a " +
                          Node::type_name(kv.type()));
          continue;
        }
      } else {
        errors_.add("defaults", item.origin(), "malformed defaults entry",
                    "entries are `- group: option`, `- group@package: option`, `- path/to/config` "
                    "or `- _self_`");
        continue;
      }
      entries.push_back(std::move(e));
    }
    return entries;
  }

  std::string abs_name(const Entry& e, const std::string& file_group) const {
    return e.name.starts_with("/") ? strip_slash(e.name) : join_group(file_group, strip_slash(e.name));
  }

  std::string abs_package(const Entry& e, const std::string& parent_pkg) const {
    if (!e.package.empty()) {
      if (e.package == "_global_") return "";
      if (e.package.starts_with("_global_.")) return e.package.substr(9);
      return join_path(parent_pkg, e.package);
    }
    if (e.kind == Entry::Kind::group) return join_path(parent_pkg, slash_to_dot(strip_slash(e.name)));
    return parent_pkg;
  }

  Choice* find_choice(const std::string& group, const std::string& package) {
    // The command line (first cli_choices_ entries) wins over `override` entries in files.
    for (Choice& c : choices_)
      if (c.key == group || c.key == group + "@" + package) return &c;
    return nullptr;
  }

  void merge_at(Node& tree, const std::string& package, const Node& content) {
    if (package.empty()) {
      merge_into(tree, content);
      return;
    }
    Node* target = tree.find_path(package);
    if (!target || !target->is_map()) target = &tree.set_path(package, Node::map(content.origin()));
    merge_into(*target, content);
  }

  std::vector<std::string> options_in(const fs::path& dir) const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(dir, ec))
      if (f.is_regular_file() && f.path().extension() == ".yaml") out.push_back(f.path().stem().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  std::vector<std::string> subdirs_of(const fs::path& dir) const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(dir, ec))
      if (f.is_directory()) out.push_back(f.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  void report_missing_group_option(const Entry& e, const std::string& group, const std::string& option,
                                   const Choice* chosen) {
    fs::path dir = fs::path(root_) / group;
    std::string via = chosen ? " (option chosen by " + chosen->origin.str() + ")" : "";
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      fs::path parent = dir.parent_path();
      std::vector<std::string> dirs = subdirs_of(parent);
      std::string near = nearest(dir.filename().string(), dirs);
      errors_.add("defaults", e.origin,
                  "defaults entry '" + e.text + "': no config group '" + group + "' under " +
                      display_path(root_) + via,
                  (near.empty() ? std::string() : "did you mean '" + near + "'? ") +
                      "groups in " + display_path(parent.string()) + ": " + join(dirs));
      return;
    }
    std::vector<std::string> opts = options_in(dir);
    std::string near = nearest(option, opts);
    errors_.add("defaults", e.origin,
                "defaults entry '" + e.text + "': no config '" + display_path((dir / (option + ".yaml")).string()) +
                    "'" + via,
                (near.empty() ? std::string() : "did you mean '" + near + "'? ") + "options in group '" +
                    group + "': " + join(opts));
  }

  void process_entries(const std::vector<Entry>& entries, const std::string& package,
                       const std::string& file_group, Node& tree, const Node* self) {
    // `override` entries first: they change choices made anywhere below this file.
    for (const Entry& e : entries) {
      if (!e.is_override) continue;
      std::string group = abs_name(e, file_group);
      std::string key = e.package.empty() ? group : group + "@" + abs_package(e, package);
      bool cli = false;
      for (size_t i = 0; i < cli_choices_; ++i) cli = cli || choices_[i].key == key || choices_[i].key == group;
      if (cli) continue;
      Choice c;
      c.key = key;
      c.option = e.option;
      c.origin = e.origin;
      c.text = "override " + e.text;
      choices_.push_back(std::move(c));
    }
    bool self_done = false;
    for (const Entry& e : entries) {
      if (e.is_override) continue;
      switch (e.kind) {
        case Entry::Kind::self:
          if (self) merge_at(tree, package, *self);
          self_done = true;
          break;
        case Entry::Kind::config: {
          std::string name = abs_name(e, file_group);
          fs::path path = fs::path(root_) / (name.ends_with(".yaml") ? name : name + ".yaml");
          std::error_code ec;
          if (!fs::is_regular_file(path, ec)) {
            if (e.optional) break;
            fs::path dir = path.parent_path();
            std::string near = nearest(path.stem().string(), options_in(dir));
            errors_.add("defaults", e.origin,
                        "defaults entry '" + e.text + "': no config '" + display_path(path.string()) + "'",
                        (near.empty() ? std::string() : "did you mean '" + near + "'? ") + "configs in " +
                            display_path(dir.string()) + ": " + join(options_in(dir)));
            break;
          }
          std::string group = fs::path(name).parent_path().generic_string();
          load_file(path.string(), abs_package(e, package), group, tree, false);
          break;
        }
        case Entry::Kind::group: {
          std::string group = abs_name(e, file_group);
          std::string pkg = abs_package(e, package);
          seen_groups_.insert(group);
          seen_groups_.insert(group + "@" + pkg);
          std::optional<std::string> option = e.option;
          Choice* chosen = find_choice(group, pkg);
          if (chosen) {
            chosen->used = true;
            option = chosen->option;
          }
          if (!option || *option == "null") break;
          fs::path path = fs::path(root_) / group / (option->ends_with(".yaml") ? *option : *option + ".yaml");
          std::error_code ec;
          if (!fs::is_regular_file(path, ec)) {
            if (!e.optional) report_missing_group_option(e, group, *option, chosen);
            break;
          }
          load_file(path.string(), pkg, group, tree, false);
          break;
        }
      }
    }
    if (!self_done && self) merge_at(tree, package, *self);
  }

  void load_file(const std::string& path, const std::string& package, const std::string& file_group,
                 Node& tree, bool primary) {
    std::error_code ec;
    std::string canonical = fs::weakly_canonical(fs::absolute(path), ec).string();
    if (std::find(stack_.begin(), stack_.end(), canonical) != stack_.end()) {
      std::string chain;
      for (const std::string& s : stack_) chain += display_path(s) + " -> ";
      errors_.add("defaults", Origin::from_file(display_path(path), 0),
                  "defaults lists include each other in a cycle: " + chain + display_path(path));
      return;
    }
    Node content;
    try {
      content = parse_yaml_file(path);
    } catch (const ConfigError& e) {
      errors_.append(e);
      return;
    }
    if (!content.is_map()) {
      errors_.add("", content.origin(),
                  std::string("a config file must hold a map at the top, not a ") +
                      Node::type_name(content.type()));
      return;
    }
    std::vector<Entry> entries;
    if (const Node* d = content.find("defaults")) {
      entries = parse_entries(*d);
      content.erase("defaults");
    }
    if (primary) entries.insert(entries.end(), appended_.begin(), appended_.end());
    stack_.push_back(canonical);
    process_entries(entries, package, file_group, tree, &content);
    stack_.pop_back();
  }

  std::string root_;
  ErrorList& errors_;
  std::vector<Choice> choices_;
  size_t cli_choices_ = 0;
  std::vector<bool> is_config_override_;
  std::vector<Entry> appended_;
  std::vector<std::string> stack_;
  std::set<std::string> seen_groups_;
};

}  // namespace

Node compose(const ComposeOptions& options, ErrorList& errors) {
  Composer composer(options, errors);
  composer.take_choices(options.overrides);
  Node tree = composer.run(options.config_file);
  if (options.base) {
    // Underneath the files, and in the base's key order (the schema's order, for printing).
    Node merged = *options.base;
    merge_into(merged, tree);
    tree = std::move(merged);
  }
  std::vector<Override> config_overrides;
  for (size_t i = 0; i < options.overrides.size(); ++i)
    if (composer.config_overrides()[i]) config_overrides.push_back(options.overrides[i]);
  apply_overrides(tree, config_overrides, errors);
  return tree;
}

Node compose(const ComposeOptions& options) {
  ErrorList errors;
  Node tree = compose(options, errors);
  errors.throw_if_any();
  return tree;
}

}  // namespace lf::config

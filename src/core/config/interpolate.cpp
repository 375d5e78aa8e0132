// Interpolation: `${a.b}`, `${.sibling}`, `${oc.env:VAR[,default]}`. Referenced values are
// resolved first (depth first, on demand), so a chain a -> b -> c works in any file order; a node
// met again while it is being resolved is a cycle.
#include "loongforge/core/config/interpolate.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "loongforge/core/config/yaml.h"

namespace lf::config {
namespace {

struct Segment {
  bool interpolation = false;
  std::string text;  // literal text, or the expression inside ${...}
};

bool mentions_interpolation(const std::string& s) { return s.find("${") != std::string::npos; }

std::string trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return std::string(s);
}

class Resolver {
 public:
  Resolver(Node& root, ErrorList& errors) : root_(root), errors_(errors) {}

  void resolve(Node& n, const std::string& path) {
    if (n.is_scalar()) {
      resolve_scalar(n, path);
      return;
    }
    for (size_t i = 0; i < n.children().size(); ++i) {
      Node& c = n.children()[i];
      resolve(c, n.is_map() ? join_path(path, c.key()) : path + "[" + std::to_string(i) + "]");
    }
  }

 private:
  // Splits text into literal and ${...} parts (nesting allowed: `${oc.env:A,${b}}`).
  bool split(const std::string& s, std::vector<Segment>& out, std::string& error) {
    std::string literal;
    for (size_t i = 0; i < s.size();) {
      if (s.compare(i, 3, "\\${") == 0) {
        literal += "${";
        i += 3;
      } else if (s.compare(i, 2, "${") == 0) {
        int depth = 1;
        size_t j = i + 2;
        for (; j < s.size() && depth > 0; ++j) {
          if (s.compare(j, 2, "${") == 0) {
            ++depth;
            ++j;
          } else if (s[j] == '}') {
            --depth;
          }
        }
        if (depth != 0) {
          error = "unterminated interpolation in '" + s + "'";
          return false;
        }
        if (!literal.empty()) out.push_back({false, std::move(literal)});
        literal.clear();
        out.push_back({true, s.substr(i + 2, j - 1 - (i + 2))});
        i = j;
      } else {
        literal += s[i++];
      }
    }
    if (!literal.empty()) out.push_back({false, std::move(literal)});
    return true;
  }

  void mark_done(const Node& n) {
    done_.insert(&n);
    for (const Node& c : n.children()) mark_done(c);
  }

  void resolve_scalar(Node& n, const std::string& path) {
    // A resolved value may hold a literal "${" (from `\${`, or an environment variable): it is
    // never evaluated again.
    if (n.text().find("${") == std::string::npos || done_.count(&n)) return;
    if (std::find(stack_.begin(), stack_.end(), &n) != stack_.end()) {
      std::string chain;
      for (size_t i = 0; i < stack_.size(); ++i) chain += stack_paths_[i] + " -> ";
      errors_.add(path, n.origin(), "interpolation cycle: " + chain + path,
                  "one of these values must be a plain value");
      cycle_ = true;
      return;
    }
    stack_.push_back(&n);
    stack_paths_.push_back(path);
    std::optional<Node> v = evaluate_text(n.text(), n, path);
    stack_.pop_back();
    stack_paths_.pop_back();
    if (stack_.empty()) cycle_ = false;
    if (!v) {
      // Leave a plain value behind so that later references do not report it again.
      n.replace_value(Node::null(n.origin()));
      return;
    }
    Origin o = n.origin();
    n.replace_value(std::move(*v));
    n.set_origin(o);
    mark_done(n);
  }

  std::optional<Node> evaluate_text(const std::string& text, const Node& self, const std::string& path) {
    std::vector<Segment> parts;
    std::string error;
    if (!split(text, parts, error)) {
      errors_.add(path, self.origin(), error, "interpolations are ${a.b} or ${oc.env:VAR,default}");
      return std::nullopt;
    }
    if (parts.size() == 1 && parts[0].interpolation) return evaluate(parts[0].text, self, path);
    std::string out;
    for (const Segment& s : parts) {
      if (!s.interpolation) {
        out += s.text;
        continue;
      }
      std::optional<Node> v = evaluate(s.text, self, path);
      if (!v) return std::nullopt;
      if (v->is_map() || v->is_sequence()) {
        errors_.add(path, self.origin(),
                    "'${" + s.text + "}' is a " + Node::type_name(v->type()) +
                        " and cannot be part of a string",
                    "reference a scalar, or make the whole value '${" + s.text + "}'");
        return std::nullopt;
      }
      out += v->is_null() ? "null" : v->text();
    }
    return Node::scalar(out, self.origin(), /*quoted=*/true);
  }

  std::optional<Node> evaluate(const std::string& expr_in, const Node& self, const std::string& path) {
    const std::string expr = trim(expr_in);
    if (expr.starts_with("oc.env:")) {
      std::string rest = expr.substr(7);
      size_t comma = rest.find(',');
      std::string var = trim(rest.substr(0, comma));
      if (const char* value = std::getenv(var.c_str())) return Node::scalar(value, self.origin());
      if (comma == std::string::npos) {
        errors_.add(path, self.origin(), "environment variable '" + var + "' is not set",
                    "set it, or give a default: ${oc.env:" + var + ",DEFAULT}");
        return std::nullopt;
      }
      std::string def = trim(rest.substr(comma + 1));
      if (mentions_interpolation(def)) return evaluate_text(def, self, path);
      try {
        return parse_yaml_string(def, self.origin());
      } catch (const ConfigError&) {
        return Node::scalar(def, self.origin(), true);
      }
    }
    if (size_t colon = expr.find(':'); colon != std::string::npos) {
      errors_.add(path, self.origin(), "unknown resolver '" + expr.substr(0, colon) + "' in '${" + expr + "}'",
                  "the resolvers are oc.env (and plain keys: ${a.b})");
      return std::nullopt;
    }
    std::string key = expr;
    if (key.starts_with(".")) {
      // Relative: one dot is this value's map, each further dot one level up.
      std::vector<std::string> base = split_path(path.substr(0, path.find('[')));
      if (!base.empty()) base.pop_back();
      size_t dots = 0;
      while (dots < key.size() && key[dots] == '.') ++dots;
      for (size_t i = 1; i < dots && !base.empty(); ++i) base.pop_back();
      std::string prefix;
      for (const std::string& b : base) prefix = join_path(prefix, b);
      key = join_path(prefix, key.substr(dots));
    }
    Node* target = root_.find_path(key);
    if (!target) {
      std::string near = suggest_key(root_, key);
      errors_.add(path, self.origin(), "interpolation '${" + expr + "}' names a missing key '" + key + "'",
                  near.empty() ? "" : "did you mean '" + near + "'?");
      return std::nullopt;
    }
    bool was_cycle = cycle_;
    cycle_ = false;
    resolve(*target, key);
    if (cycle_) return std::nullopt;
    cycle_ = was_cycle;
    return *target;
  }

  Node& root_;
  ErrorList& errors_;
  std::vector<const Node*> stack_;
  std::vector<std::string> stack_paths_;
  std::set<const Node*> done_;
  bool cycle_ = false;
};

}  // namespace

void resolve_interpolations(Node& tree, ErrorList& errors) {
  Resolver r(tree, errors);
  r.resolve(tree, "");
}

}  // namespace lf::config

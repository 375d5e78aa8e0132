// Collected configuration errors and "did you mean" suggestions.
#include "loongforge/core/config/config_error.h"

#include <algorithm>
#include <sstream>

namespace lf::config {

std::string ConfigIssue::str() const {
  std::ostringstream os;
  if (origin.kind != Origin::Kind::unknown) os << origin.str() << ": ";
  if (!key.empty() && message.find(key) == std::string::npos) os << key << ": ";
  os << message;
  if (!hint.empty()) os << " (" << hint << ")";
  return os.str();
}

namespace {
std::string render(const std::vector<ConfigIssue>& issues) {
  std::ostringstream os;
  if (issues.size() == 1) {
    os << "configuration error: " << issues[0].str();
  } else {
    os << issues.size() << " configuration errors:";
    for (const ConfigIssue& i : issues) os << "\n  " << i.str();
  }
  return os.str();
}
}  // namespace

ConfigError::ConfigError(std::vector<ConfigIssue> issues)
    : lf::Error(render(issues), render(issues),
                issues.size() == 1 ? issues[0].hint : std::string(), __FILE__, __LINE__),
      issues_(std::move(issues)) {}

void ErrorList::throw_if_any() const {
  if (!issues_.empty()) throw ConfigError(issues_);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest(std::string_view word, const std::vector<std::string>& candidates) {
  // A typo is a few edits away; anything further is a different word, and suggesting it would
  // mislead more than help.
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  std::string best;
  size_t best_d = limit + 1;
  for (const std::string& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  std::string n = nearest(word, candidates);
  return n.empty() ? std::string() : "did you mean '" + n + "'?";
}

// "did you mean" for a key that is not in the tree: the nearest sibling of the deepest existing
// prefix, else the one path ending in the same key (`seed` -> `training.seed`), else the nearest
// full path.
std::string suggest_key(const Node& tree, const std::string& key) {
  std::vector<std::string> parts = split_path(key);
  if (parts.empty()) return "";
  const Node* n = &tree;
  std::string prefix;
  size_t i = 0;
  for (; i < parts.size(); ++i) {
    const Node* next = n->find(parts[i]);
    if (!next) break;
    n = next;
    prefix = join_path(prefix, parts[i]);
  }
  if (i < parts.size() && n->is_map()) {
    std::string near = nearest(parts[i], n->keys());
    if (!near.empty()) {
      std::string s = join_path(prefix, near);
      for (size_t j = i + 1; j < parts.size(); ++j) s = join_path(s, parts[j]);
      return s;
    }
  }
  std::vector<std::string> paths = tree.all_paths();
  std::vector<std::string> same_leaf;
  for (const std::string& p : paths) {
    std::vector<std::string> pp = split_path(p);
    if (!pp.empty() && pp.back() == parts.back()) same_leaf.push_back(p);
  }
  if (same_leaf.size() == 1) return same_leaf[0];
  return nearest(key, paths);
}

}  // namespace lf::config

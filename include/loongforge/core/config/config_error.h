// Configuration errors are collected, then thrown together: a user with a misspelled key, a
// wrong type and a missing value sees all three at once. ConfigIssue is one problem (key,
// origin, message, hint); ConfigError is the lf::Error that carries them all. Not for internal
// invariants (LF_CHECK).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "loongforge/core/config/node.h"
#include "loongforge/core/error.h"

namespace lf::config {

struct ConfigIssue {
  std::string key;      // dotted path of the offending value ("" when not about one key)
  Origin origin;        // where the value (or the statement) came from
  std::string message;  // what is wrong, with the values
  std::string hint;     // how to fix it ("did you mean 'x'?"); may be empty

  // "configs/x.yaml:12: training.lr: expected a double, got 'fast' (HINT: ...)".
  std::string str() const;
};

class ConfigError : public lf::Error {
 public:
  explicit ConfigError(std::vector<ConfigIssue> issues);
  const std::vector<ConfigIssue>& issues() const { return issues_; }

 private:
  std::vector<ConfigIssue> issues_;
};

// Accumulates issues; throw_if_any() throws one ConfigError listing them in the order added.
// One issue per key: a later issue about a key already reported is dropped, because it is almost
// always a consequence of the first (a failed interpolation then read as null, say).
class ErrorList {
 public:
  void add(ConfigIssue issue) {
    if (!issue.key.empty() && has_key(issue.key)) return;
    issues_.push_back(std::move(issue));
  }
  void add(std::string key, Origin origin, std::string message, std::string hint = {}) {
    add(ConfigIssue{std::move(key), std::move(origin), std::move(message), std::move(hint)});
  }
  void append(const ConfigError& e) {
    for (const ConfigIssue& i : e.issues()) add(i);
  }
  bool has_key(std::string_view key) const {
    for (const ConfigIssue& i : issues_)
      if (i.key == key) return true;
    return false;
  }
  bool empty() const { return issues_.empty(); }
  size_t size() const { return issues_.size(); }
  const std::vector<ConfigIssue>& issues() const { return issues_; }
  void throw_if_any() const;

 private:
  std::vector<ConfigIssue> issues_;
};

// Levenshtein distance, and the candidate closest to `word` when it is close enough to be a
// plausible typo (distance <= max(2, |word| / 3)); empty when none is.
size_t edit_distance(std::string_view a, std::string_view b);
std::string nearest(std::string_view word, const std::vector<std::string>& candidates);
// The key of `tree` a missing dotted `key` most plausibly meant: the nearest sibling of its
// deepest existing prefix, else the one path ending in the same name (`seed` ->
// `training.seed`), else the nearest full path; empty when nothing is close.
std::string suggest_key(const Node& tree, const std::string& key);
// " (did you mean 'x'?)"-style hint text: "did you mean 'x'?" or empty.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace lf::config

// The adaptive FP8 policy: which of a transformer layer's GEMMs run in FP8 at which token counts,
// and its JSON file (written by loongforge-fp8-policy, read by loongforge-train --fp8-policy):
//
//   {"format": "loongforge-fp8-policy", "version": 1, "recipe": "tensorwise", "fp8_format": "hybrid",
//    "margin": 0, "measured_on": "...",
//    "gemms": {"qkv": [{"min_tokens": 0, "precision": "bf16"}, {"min_tokens": 4096, "precision": "fp8"}],
//              "proj": [...], "fc1": [...], "fc2": [...]},
//    "measurements": [{"gemm": "qkv", "tokens": 1024, "base_ms": 1.2, "fp8_ms": 1.5}, ...]}
//
// Each kind's steps start at min_tokens 0 and rise strictly; a step holds until the next one's
// min_tokens. "precision" is "fp8" or "bf16" (the training dtype: bf16, or fp32 in an fp32 run).
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loongforge/backend/fp8.h"
#include "loongforge/core/error.h"

namespace lf::ops {
namespace {

constexpr const char* kFormat = "loongforge-fp8-policy";
constexpr int kVersion = 1;

std::string rerun_hint(const std::string& path) {
  return "write it with loongforge-fp8-policy --out " + path + " (docs/training.md, \"Adaptive FP8\")";
}

void check_steps(const std::vector<Fp8Policy::Step>& steps, const std::string& where) {
  LF_CHECK(!steps.empty(), where, ": no steps", lf::hint("give at least {\"min_tokens\": 0, \"precision\": ...}"));
  LF_CHECK(steps.front().min_tokens == 0, where, ": the first step starts at min_tokens ", steps.front().min_tokens,
           ", not 0", lf::hint("every token count needs a choice: start the list at min_tokens 0"));
  for (size_t i = 1; i < steps.size(); ++i)
    LF_CHECK(steps[i].min_tokens > steps[i - 1].min_tokens, where, "[", i, "]: min_tokens ", steps[i].min_tokens,
             " does not rise above the previous step's ", steps[i - 1].min_tokens,
             lf::hint("list the steps by increasing min_tokens"));
}

}  // namespace

const char* to_string(Fp8Gemm g) {
  switch (g) {
    case Fp8Gemm::qkv: return "qkv";
    case Fp8Gemm::proj: return "proj";
    case Fp8Gemm::fc1: return "fc1";
    case Fp8Gemm::fc2: return "fc2";
  }
  return "?";
}

void Fp8Policy::set_steps(Fp8Gemm g, std::vector<Step> steps) {
  check_steps(steps, std::string("fp8 policy: ") + to_string(g));
  steps_[g] = std::move(steps);
}

const Fp8Recipe* Fp8Policy::choose(Fp8Gemm gemm, int64_t tokens) const {
  auto it = steps_.find(gemm);
  if (it == steps_.end()) return &recipe_;
  bool fp8 = it->second.front().fp8;
  for (const Step& s : it->second)
    if (tokens >= s.min_tokens) fp8 = s.fp8;
  return fp8 ? &recipe_ : nullptr;
}

void Fp8Policy::set_layers_in_training_dtype(int64_t first, int64_t last) {
  LF_CHECK(first >= 0 && last >= 0, "fp8: negative layer counts ", first, ", ", last);
  first_ = first, last_ = last;
}

std::vector<bool> Fp8Policy::layers_in_fp8(int64_t n, const std::string& unit) const {
  LF_CHECK(first_ + last_ <= n, "--num-layers-at-start-in-bf16 ", first_, " + --num-layers-at-end-in-bf16 ", last_,
           " exceed the model's ", n, " ", unit, lf::hint("keep at least one in FP8, or drop --fp8-format"));
  std::vector<bool> on(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) on[static_cast<size_t>(i)] = i >= first_ && i < n - last_;
  return on;
}

std::string Fp8Policy::describe() const {
  std::ostringstream o;
  o << recipe_.describe();
  if (first_ > 0 || last_ > 0)
    o << ", the first " << first_ << " and last " << last_ << " layer(s) in the training dtype";
  o << (steps_.empty() ? ", every GEMM" : source_.empty() ? ", per GEMM kind:" : ", policy " + source_ + ":");
  for (const auto& [g, steps] : steps_) {
    o << "\n  " << to_string(g) << ":";
    for (const Step& s : steps) o << " from " << s.min_tokens << " tokens " << (s.fp8 ? "fp8" : "bf16") << ";";
  }
  return o.str();
}

Fp8Policy Fp8Policy::from_measurements(const Fp8Recipe& recipe, const std::vector<Measurement>& measurements) {
  Fp8Policy p(recipe);
  for (Fp8Gemm g : kFp8Gemms) {
    std::map<int64_t, bool> faster;  // token count -> FP8 faster
    for (const Measurement& m : measurements)
      if (m.gemm == g) faster[m.tokens] = m.fp8_ms < m.base_ms;
    LF_CHECK(!faster.empty(), "fp8 policy: no measurement of ", to_string(g));
    std::vector<Step> steps;
    for (const auto& [tokens, fp8] : faster)
      if (steps.empty())
        steps.push_back({0, fp8});
      else if (steps.back().fp8 != fp8)
        steps.push_back({tokens, fp8});
    p.set_steps(g, std::move(steps));
  }
  return p;
}

void Fp8Policy::write(const std::string& path, const std::string& measured_on,
                      const std::vector<Measurement>& measurements) const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["recipe"] = to_string(recipe_.scaling);
  j["fp8_format"] = to_string(recipe_.format);
  j["margin"] = recipe_.margin;
  j["measured_on"] = measured_on;
  for (Fp8Gemm g : kFp8Gemms) {
    auto& list = j["gemms"][to_string(g)];
    list = nlohmann::json::array();
    auto it = steps_.find(g);
    const std::vector<Step> steps = it == steps_.end() ? std::vector<Step>{{0, true}} : it->second;
    for (const Step& s : steps) list.push_back({{"min_tokens", s.min_tokens}, {"precision", s.fp8 ? "fp8" : "bf16"}});
  }
  j["measurements"] = nlohmann::json::array();
  for (const Measurement& m : measurements)
    j["measurements"].push_back({{"gemm", to_string(m.gemm)}, {"tokens", m.tokens}, {"base_ms", m.base_ms},
                                 {"fp8_ms", m.fp8_ms}});
  std::ofstream f(path);
  LF_CHECK(f.good(), "cannot write the FP8 policy file ", path);
  f << j.dump(2) << "\n";
  LF_CHECK(f.good(), "writing the FP8 policy file ", path, " failed");
}

Fp8Policy Fp8Policy::read(const std::string& path, const Fp8Recipe& recipe) {
  std::ifstream f(path);
  LF_CHECK(f.good(), "--fp8-policy ", path, ": cannot open the file", lf::hint(rerun_hint(path)));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    LF_FAIL("--fp8-policy ", path, ": not JSON (", e.what(), ")", lf::hint(rerun_hint(path)));
  }
  auto field = [&](const nlohmann::json& obj, const std::string& key, const std::string& where) -> const nlohmann::json& {
    LF_CHECK(obj.is_object() && obj.contains(key), "--fp8-policy ", path, ": ", where, key, " is missing",
             lf::hint(rerun_hint(path)));
    return obj.at(key);
  };
  LF_CHECK(j.is_object() && j.contains("format") && j.at("format").is_string() &&
               j.at("format").get<std::string>() == kFormat,
           "--fp8-policy ", path,
           ": \"format\" is not \"", kFormat, "\"", lf::hint(rerun_hint(path)));
  LF_CHECK(field(j, "version", "").is_number_integer() && j.at("version").get<int>() == kVersion, "--fp8-policy ", path,
           ": \"version\" ", j.at("version").dump(), " is not ", kVersion, lf::hint(rerun_hint(path)));
  const auto& rec = field(j, "recipe", ""), &fmt = field(j, "fp8_format", ""), &margin = field(j, "margin", "");
  const bool same = rec.is_string() && rec.get<std::string>() == to_string(recipe.scaling) && fmt.is_string() &&
                    fmt.get<std::string>() == to_string(recipe.format) && margin.is_number_integer() &&
                    margin.get<int>() == recipe.margin;
  LF_CHECK(same, "--fp8-policy ", path, ": measured for recipe ", rec.dump(), ", format ", fmt.dump(), ", margin ",
           margin.dump(), "; this run uses ", recipe.describe(),
           lf::hint("use the run's --fp8-recipe/--fp8-format/--fp8-margin, or " + rerun_hint(path)));
  // Unknown keys are refused, not ignored (a "max_tokens" would otherwise change nothing).
  auto known_keys = [&](const nlohmann::json& obj, std::initializer_list<const char*> keys, const std::string& where) {
    for (const auto& [key, value] : obj.items()) {
      bool known = false;
      for (const char* k : keys) known = known || key == k;
      std::string list;
      for (const char* k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
      LF_CHECK(known, "--fp8-policy ", path, ": ", where, key, " is not a key of this file", lf::hint("the keys are " + list));
    }
  };
  known_keys(j, {"format", "version", "recipe", "fp8_format", "margin", "measured_on", "gemms", "measurements"}, "");
  Fp8Policy p(recipe);
  p.source_ = path;
  const auto& gemms = field(j, "gemms", "");
  LF_CHECK(gemms.is_object(), "--fp8-policy ", path, ": \"gemms\" is not an object", lf::hint(rerun_hint(path)));
  for (const auto& [key, value] : gemms.items()) {
    bool known = false;
    for (Fp8Gemm g : kFp8Gemms) known = known || key == to_string(g);
    LF_CHECK(known, "--fp8-policy ", path, ": gemms.", key, " is not a GEMM kind",
             lf::hint("the kinds are qkv, proj, fc1, fc2"));
  }
  for (Fp8Gemm g : kFp8Gemms) {
    const std::string where = std::string("gemms.") + to_string(g);
    const auto& list = field(gemms, to_string(g), "gemms.");
    LF_CHECK(list.is_array(), "--fp8-policy ", path, ": ", where, " is not a list of steps", lf::hint(rerun_hint(path)));
    std::vector<Step> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string at = where + "[" + std::to_string(i) + "].";
      LF_CHECK(list[i].is_object(), "--fp8-policy ", path, ": ", where, "[", i, "] is not an object",
               lf::hint(rerun_hint(path)));
      known_keys(list[i], {"min_tokens", "precision"}, at);
      const auto& tokens = field(list[i], "min_tokens", at);
      const auto& prec = field(list[i], "precision", at);
      LF_CHECK(tokens.is_number_integer() && tokens.get<int64_t>() >= 0, "--fp8-policy ", path, ": ", at,
               "min_tokens ", tokens.dump(), " is not a count of tokens", lf::hint(rerun_hint(path)));
      LF_CHECK(prec.is_string() && (prec.get<std::string>() == "fp8" || prec.get<std::string>() == "bf16"),
               "--fp8-policy ", path, ": ", at, "precision ", prec.dump(), " is not \"fp8\" or \"bf16\"",
               lf::hint(rerun_hint(path)));
      steps.push_back({tokens.get<int64_t>(), prec.get<std::string>() == "fp8"});
    }
    check_steps(steps, "--fp8-policy " + path + ": " + where);
    p.steps_[g] = std::move(steps);
  }
  return p;
}

}  // namespace lf::ops

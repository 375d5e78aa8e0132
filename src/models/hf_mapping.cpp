// The family mapping files (configs/models/<family>/hf.yaml) and config.json <-> DecoderConfig.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>

#include "hf_mapping.h"
#include "loongforge/core/config/compose.h"
#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/models/composites/causal_lm.h"

namespace lf::models::hf {
namespace fs = std::filesystem;
using lf::config::Node;

namespace {

std::string where(const Node& n) { return n.origin().str(); }

const Node& need(const Node& map, const char* key, const std::string& path) {
  const Node* n = map.find(key);
  LF_CHECK(n != nullptr, path, ": ", where(map), ": missing key '", key, "'",
           lf::hint("docs/conversion.md describes the mapping format"));
  return *n;
}

std::string scalar(const Node& n, const std::string& what) {
  LF_CHECK(n.is_scalar(), where(n), ": ", what, " must be a scalar, got ", Node::type_name(n.type()));
  return n.text();
}

// A YAML scalar as the JSON value transformers would write.
json to_json(const Node& n) {
  if (n.is_null()) return nullptr;
  LF_CHECK(n.is_scalar(), where(n), ": expected a scalar, got ", Node::type_name(n.type()));
  const std::string& t = n.text();
  if (n.quoted()) return t;
  if (t == "true") return true;
  if (t == "false") return false;
  if (t == "null" || t == "~") return nullptr;
  int64_t i;
  if (lf::config::detail::read_int64(n, i)) return i;
  double d;
  if (lf::config::detail::read_double(n, d)) return d;
  return t;
}

bool same_json(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

// A JSON value as the text of a YAML scalar (the schema types it by the field).
Node to_node(const json& v, const lf::config::Origin& origin) {
  if (v.is_boolean()) return Node::scalar(v.get<bool>() ? "true" : "false", origin);
  if (v.is_string()) return Node::scalar(v.get<std::string>(), origin, /*quoted=*/true);
  if (v.is_number()) return Node::scalar(v.dump(), origin);
  if (v.is_null()) return Node::null(origin);
  return Node::scalar(v.dump(), origin);
}

struct FieldsToJson {
  json out = json::object();
  template <class T, class... A>
  void operator()(const char* name, T& value, const char*, const A&...) {
    if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double> ||
                  std::is_same_v<T, bool> || std::is_same_v<T, std::string>)
      out[name] = value;
  }
};

void check_field(const std::string& field, const json& known, const Node& at) {
  LF_CHECK(known.contains(field), where(at), ": '", field, "' is not a foundation field",
           lf::hint("use a field of lf::models::DecoderConfig (docs/configuration.md)"));
}

std::vector<HfTensorSpec> parse_hf_specs(const Node& n, const std::string& path) {
  std::vector<HfTensorSpec> out;
  auto one = [&](const Node& m) {
    LF_CHECK(m.is_map(), where(m), ": an hf entry is {name: ..., shape: [...]}");
    HfTensorSpec s;
    s.name = scalar(need(m, "name", path), "name");
    const Node& shape = need(m, "shape", path);
    LF_CHECK(shape.is_sequence() && shape.size() > 0, where(shape), ": shape must be a list");
    for (const auto& d : shape.children()) s.shape.push_back(scalar(d, "a shape entry"));
    out.push_back(std::move(s));
  };
  if (n.is_sequence())
    for (const auto& m : n.children()) one(m);
  else
    one(n);
  LF_CHECK(!out.empty(), where(n), ": hf lists no tensor");
  return out;
}

}  // namespace

json config_fields(const DecoderConfig& config) {
  DecoderConfig copy = config;
  FieldsToJson v;
  copy.visit(v);
  v.out["kv_channels"] = config.head_dim();
  v.out["num_query_groups"] = config.query_groups();
  return v.out;
}

bool holds(const std::string& when, const json& fields, const std::string& where) {
  if (when.empty()) return true;
  const bool negate = when[0] == '!';
  const std::string field = negate ? when.substr(1) : when;
  LF_CHECK(fields.contains(field) && (fields[field].is_boolean() || fields[field].is_number()), where, ": when '",
           when, "' does not name a boolean or numeric foundation field");
  const bool on = fields[field].is_boolean() ? fields[field].get<bool>() : fields[field].get<double>() != 0;
  return on != negate;
}

std::map<std::string, int64_t> shape_symbols(const DecoderConfig& c) {
  return {{"h", c.hidden_size},         {"f", c.ffn_hidden_size}, {"nq", c.num_attention_heads},
          {"nkv", c.query_groups()},    {"d", c.head_dim()},      {"vocab", c.vocab_size},
          {"layers", c.num_layers},     {"experts", c.num_experts}, {"fe", c.expert_ffn_hidden_size()},
          {"fs", c.moe_shared_expert_intermediate_size}, {"ql", c.q_lora_rank}, {"kvl", c.kv_lora_rank},
          {"dqk", c.qk_head_dim}, {"dr", c.qk_pos_emb_head_dim}, {"dv", c.v_head_dim},
          {"nh", c.dsa_indexer_n_heads}, {"di", c.dsa_indexer_head_dim}};  // DSA's indexer
}

std::vector<int64_t> eval_shape(const std::vector<std::string>& shape,
                                const std::map<std::string, int64_t>& symbols) {
  std::vector<int64_t> out;
  for (const auto& expr : shape) {
    // A sum of products: "nq*d + 2*nkv*d".
    int64_t sum = 0;
    std::stringstream terms(expr);
    for (std::string term; std::getline(terms, term, '+');) {
      int64_t v = 1;
      std::stringstream ss(term);
      for (std::string factor; std::getline(ss, factor, '*');) {
        factor.erase(std::remove(factor.begin(), factor.end(), ' '), factor.end());
        auto it = symbols.find(factor);
        if (it != symbols.end()) {
          v *= it->second;
        } else {
          LF_CHECK(!factor.empty() && std::all_of(factor.begin(), factor.end(), ::isdigit),
                   "shape expression '", expr, "': unknown symbol '", factor, "'",
                   lf::hint("symbols: h, f, nq, nkv, d, vocab, layers, experts, fe, fs, ql, kvl, dqk, dr, "
                            "dv, nh, di and integers, joined by * and +"));
          v *= std::stoll(factor);
        }
      }
      sum += v;
    }
    out.push_back(sum);
  }
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Mapping load_mapping(const std::string& yaml_path) {
  const Node root = lf::config::parse_yaml_file(yaml_path);
  const std::string path = lf::config::display_path(yaml_path);
  LF_CHECK(root.is_map(), path, ": a mapping file is a YAML map");
  auto m = std::make_shared<Mapping::Impl>();
  m->path = path;
  m->architecture = scalar(need(root, "architecture", path), "architecture");
  m->model_type = scalar(need(root, "model_type", path), "model_type");
  // The field names (a config whose head_dim() is defined; the values do not matter).
  DecoderConfig probe;
  probe.hidden_size = probe.num_attention_heads = 1;
  json known = config_fields(probe);
  known["moe_layer"] = false;  // per-layer: whether layer <i> is a MoE layer
  std::map<std::string, int64_t> any_symbols;
  for (const auto& [name, value] : shape_symbols(probe)) any_symbols[name] = 1;
  std::set<std::string> keys{"architecture", "model_type", "fixed", "constants", "config",
                             "rope", "tensors", "ignore", "moe_layers", "mtp_layers"};
  for (const auto& c : root.children())
    LF_CHECK(keys.count(c.key()), where(c), ": unknown key '", c.key(), "' in a mapping file",
             lf::hint(lf::config::did_you_mean(c.key(), {keys.begin(), keys.end()})));
  if (const Node* fixed = root.find("fixed"))
    for (const auto& c : fixed->children()) {
      check_field(c.key(), known, c);
      m->fixed.emplace_back(c.key(), to_json(c));
    }
  if (const Node* constants = root.find("constants"))
    for (const auto& c : constants->children()) m->constants.emplace_back(c.key(), to_json(c));
  for (const auto& c : need(root, "config", path).children()) {
    ConfigKey k;
    k.hf_key = c.key();
    if (c.is_map()) {
      k.field = scalar(need(c, "field", path), "field");
      if (const Node* n = c.find("negate")) k.negate = to_json(*n) == json(true);
      if (const Node* d = c.find("default")) k.has_default = true, k.default_value = to_json(*d);
      if (const Node* t = c.find("times")) k.times = scalar(*t, "times");
      if (const Node* z = c.find("zero_is_null")) k.zero_is_null = to_json(*z) == json(true);
      if (const Node* a = c.find("aliases")) {
        LF_CHECK(a->is_sequence(), where(*a), ": aliases must be a list of config.json keys");
        for (const auto& x : a->children()) k.aliases.push_back(scalar(x, "an alias"));
      }
    } else {
      k.field = scalar(c, "a config entry");
    }
    check_field(k.field, known, c);
    m->config.push_back(std::move(k));
  }
  if (const Node* moe = root.find("moe_layers")) {
    m->moe_section = true;
    for (const auto& c : moe->children())
      LF_CHECK(c.key() == "sparse_step" || c.key() == "dense_layers" || c.key() == "first_dense", where(c),
               ": unknown key '", c.key(), "' in moe_layers", lf::hint("sparse_step, dense_layers, first_dense"));
    if (const Node* s = moe->find("sparse_step")) m->sparse_step_key = scalar(*s, "sparse_step");
    if (const Node* d = moe->find("dense_layers")) m->dense_layers_key = scalar(*d, "dense_layers");
    if (const Node* f = moe->find("first_dense")) m->first_dense_key = scalar(*f, "first_dense");
  }
  if (const Node* mtp = root.find("mtp_layers")) m->mtp_layers = to_json(*mtp) == json(true);
  const Node& rope = need(root, "rope", path);
  m->rope_theta_field = scalar(need(rope, "theta", path), "theta");
  check_field(m->rope_theta_field, known, rope);
  if (const Node* scaling = rope.find("scaling"))
    for (const auto& t : scaling->children()) {
      RopeScaling r;
      r.type = t.key();
      r.flag = scalar(need(t, "flag", path), "flag");
      check_field(r.flag.substr(0, r.flag.find('=')), known, t);
      for (const auto& f : need(t, "fields", path).children()) {
        RopeField rf;
        rf.key = f.key();
        if (f.is_map()) {
          for (const auto& k : f.children())
            LF_CHECK(k.key() == "field" || k.key() == "default" || k.key() == "default_key" || k.key() == "accept",
                     where(k), ": unknown key '", k.key(), "' in a rope field", lf::hint("field, default, default_key, accept"));
          if (const Node* a = f.find("accept")) {
            rf.accept = to_json(*a);
            LF_CHECK(!f.find("field"), where(f), ": a rope field with `accept` sets no field");
          } else {
            rf.field = scalar(need(f, "field", path), "field");
            if (const Node* d = f.find("default")) rf.default_value = to_json(*d);
            if (const Node* d = f.find("default_key")) rf.default_key = scalar(*d, "default_key");
          }
        } else {
          rf.field = scalar(f, "a rope field");
        }
        if (!rf.field.empty()) check_field(rf.field, known, f);
        r.fields.push_back(std::move(rf));
      }
      m->rope_scaling.push_back(std::move(r));
    }
  std::set<std::string> lf_names;
  for (const auto& e : need(root, "tensors", path).children()) {
    LF_CHECK(e.is_map(), where(e), ": a tensors entry is a map {lf, hf, transform, when}");
    TensorRule r;
    r.origin = where(e);
    r.lf = scalar(need(e, "lf", path), "lf");
    r.hf = parse_hf_specs(need(e, "hf", path), path);
    if (const Node* t = e.find("transform")) r.transform = scalar(*t, "transform");
    if (const Node* w = e.find("when")) r.when = scalar(*w, "when");
    if (const Node* d = e.find("duplicate")) r.duplicate = to_json(*d) == json(true);
    if (!r.when.empty()) check_field(r.when[0] == '!' ? r.when.substr(1) : r.when, known, e);
    LF_CHECK(r.duplicate || lf_names.insert(r.lf).second, r.origin, ": tensor '", r.lf, "' is mapped twice",
             lf::hint("an HF copy of a tensor mapped elsewhere takes `duplicate: true`"));
    LF_CHECK(!r.per_mtp() || m->mtp_layers, r.origin, ": <n> (an MTP layer's HF index) needs `mtp_layers: true`");
    LF_CHECK(!r.per_mtp() || r.duplicate || r.lf.find("<m>") != std::string::npos, r.origin, ": '", r.lf,
             "' is per MTP layer (its HF name has <n>) and needs <m>");
    const size_t n = r.hf.size();
    LF_CHECK(r.transform == "copy" || r.transform == "vocab" || r.transform == "qkv" ||
                 r.transform == "concat" || r.transform == "experts",
             r.origin, ": unknown transform '", r.transform, "'",
             lf::hint("copy, vocab, qkv, concat or experts (docs/conversion.md)"));
    LF_CHECK((r.transform == "copy" || r.transform == "vocab") ? n == 1
             : r.transform == "qkv"                            ? (n == 1 || n == 3)
                                                               : n >= 1,
             r.origin, ": transform ", r.transform, " cannot take ", n, " HF tensors");
    if (!r.when.empty() && (r.when == "moe_layer" || r.when == "!moe_layer"))
      LF_CHECK(r.per_layer(), r.origin, ": when ", r.when, " applies to per-layer tensors (<i>) only");
    for (const auto& s : r.hf) {
      LF_CHECK((s.name.find("<n>") != std::string::npos) == r.per_mtp(), r.origin, ": '", s.name,
               "': every HF tensor of an MTP-layer entry has <n>, and only those");
      LF_CHECK((s.name.find("<i>") != std::string::npos) == r.per_layer(), r.origin,
               ": '", s.name, "' and '", r.lf, "' must both or neither contain <i>");
      LF_CHECK((s.name.find("<e>") != std::string::npos) == (r.transform == "experts"), r.origin, ": '", s.name,
               "': the experts transform stacks per-expert tensors named with <e>, and only it");
      try {
        eval_shape(s.shape, any_symbols);  // validates the symbols
      } catch (const lf::Error& e) {
        LF_FAIL(r.origin, ": ", e.message(), lf::hint(e.hint()));
      }
    }
    m->tensors.push_back(std::move(r));
  }
  if (const Node* ignore = root.find("ignore"))
    for (const auto& e : ignore->children()) {
      IgnoreRule r;
      const Node& p = e.is_map() ? need(e, "pattern", path) : e;
      r.text = scalar(p, "pattern");
      try {
        r.pattern = std::regex(r.text);
      } catch (const std::regex_error& err) {
        LF_FAIL(where(p), ": bad regular expression '", r.text, "': ", err.what());
      }
      if (e.is_map())
        if (const Node* w = e.find("when")) r.when = scalar(*w, "when");
      m->ignore.push_back(std::move(r));
    }
  return Mapping(std::move(m));
}

const std::string& Mapping::path() const { return impl_->path; }
const std::string& Mapping::architecture() const { return impl_->architecture; }
const std::string& Mapping::model_type() const { return impl_->model_type; }

std::vector<Mapping> all_mappings(const std::string& configs_root) {
  const fs::path models =
      fs::path(configs_root.empty() ? lf::config::source_configs_dir() : configs_root) / "models";
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(models, ec))
    if (fs::is_regular_file(d.path() / "hf.yaml")) files.push_back((d.path() / "hf.yaml").string());
  LF_CHECK(!ec, "cannot list ", models.string(), ": ", ec.message(),
           lf::hint("set LOONGFORGE_CONFIGS_DIR to the configs/ directory"));
  std::sort(files.begin(), files.end());
  std::vector<Mapping> out;
  for (const auto& f : files) out.push_back(load_mapping(f));
  return out;
}

Mapping mapping_for_architecture(const std::string& architecture, const std::string& model_type,
                                 const std::string& configs_root) {
  auto all = all_mappings(configs_root);
  for (const auto& m : all)
    if (!architecture.empty() && m.architecture() == architecture) return m;
  for (const auto& m : all)
    if (architecture.empty() && !model_type.empty() && m.model_type() == model_type) return m;
  std::string known;
  for (const auto& m : all) known += "\n  " + m.architecture() + " (" + m.path() + ")";
  LF_FAIL("unknown architecture '", architecture, "' (model_type '", model_type,
          "'); the families with a mapping are:", known,
          lf::hint("add configs/models/<family>/hf.yaml for it (docs/conversion.md)"));
}

Mapping mapping_for_config(const DecoderConfig& config, const std::string& configs_root) {
  std::vector<Mapping> fits;
  std::string why;
  for (const auto& m : all_mappings(configs_root)) {
    try {
      config_to_json(config, m.impl(), at::kBFloat16);
      fits.push_back(m);
    } catch (const lf::Error& e) {
      why += "\n  " + m.architecture() + ": " + e.message();
    }
  }
  LF_CHECK(fits.size() == 1,
           fits.empty() ? "no HF family can express this model:" + why
                        : "several HF families fit this model (" + fits[0].architecture() + ", " +
                              fits[1].architecture() + ")",
           lf::hint("name one with --architecture, or add a mapping (docs/conversion.md)"));
  return fits[0];
}

DecoderConfig config_from_json(const json& j, const Mapping::Impl& m, const std::string& source) {
  LF_CHECK(j.is_object(), source, ": config.json must hold a JSON object");
  auto origin = [&](const std::string& key) {
    return lf::config::Origin::from_file(source + " (" + key + ")", 0);
  };
  auto present = [&](const std::string& key) { return j.contains(key) && !j[key].is_null(); };
  for (const auto& [key, value] : m.constants)
    LF_CHECK(!present(key) || same_json(j[key], value), source, ": ", key, " is ", j[key].dump(),
             ", but the ", m.model_type, " mapping (", m.path, ") supports only ", value.dump());
  Node n = Node::map(lf::config::Origin::from_file(source, 0));
  for (const auto& k : m.config) {
    std::string key = k.hf_key;
    for (const auto& a : k.aliases)
      if (!present(key) && present(a)) key = a;
    json v = present(key) ? j[key] : k.default_value;
    if (v.is_null() && k.zero_is_null && j.contains(key)) v = 0;
    if (v.is_null()) continue;
    if (!k.times.empty()) {
      LF_CHECK(v.is_number() && present(k.times) && j[k.times].is_number(), source, ": ", key, " (", v.dump(),
               ") scales ", k.times, ", which must be a number too");
      v = v.get<int64_t>() * j[k.times].get<int64_t>();
    }
    if (k.negate) {
      LF_CHECK(v.is_boolean(), source, ": ", k.hf_key, " must be true or false, got ", v.dump());
      v = !v.get<bool>();
    }
    n.set(k.field, to_node(v, origin(k.hf_key)));
  }
  for (const auto& [field, value] : m.fixed)
    n.set(field, to_node(value, lf::config::Origin::from_file(m.path, 0)));
  if (m.moe_section && n.find("num_layers") && n.find("num_experts")) {
    // transformers' rules: layer i is MoE iff experts exist, i is not in mlp_only_layers, i >=
    // first_k_dense_replace and (i + 1) % decoder_sparse_step == 0.
    const int64_t layers = j.value("num_hidden_layers", int64_t{0});
    const int64_t step = !m.sparse_step_key.empty() && present(m.sparse_step_key) ? j[m.sparse_step_key].get<int64_t>() : 1;
    LF_CHECK(step >= 1, source, ": ", m.sparse_step_key, " must be at least 1, got ", step);
    const int64_t first_dense =
        !m.first_dense_key.empty() && present(m.first_dense_key) ? j[m.first_dense_key].get<int64_t>() : 0;
    std::set<int64_t> dense;
    for (int64_t i = 0; i < first_dense; ++i) dense.insert(i);
    if (!m.dense_layers_key.empty() && present(m.dense_layers_key)) {
      LF_CHECK(j[m.dense_layers_key].is_array(), source, ": ", m.dense_layers_key, " must be a list of layer indices");
      for (const auto& x : j[m.dense_layers_key]) dense.insert(x.get<int64_t>());
    }
    std::string pattern = "[";
    for (int64_t i = 0; i < layers; ++i)
      pattern += std::string(i ? "," : "") + ((!dense.count(i) && (i + 1) % step == 0) ? "1" : "0");
    n.set("moe_layer_freq", Node::scalar(pattern + "]", origin("MoE layer keys"), /*quoted=*/true));
  }
  // RoPE: transformers < 5 writes rope_theta + rope_scaling, >= 5 rope_parameters {rope_theta,
  // rope_type, ...}.
  const json* params = present("rope_parameters") ? &j["rope_parameters"] : nullptr;
  if (present("rope_theta"))
    n.set(m.rope_theta_field, to_node(j["rope_theta"], origin("rope_theta")));
  else if (params && params->contains("rope_theta"))
    n.set(m.rope_theta_field, to_node((*params)["rope_theta"], origin("rope_parameters.rope_theta")));
  const json* scaling = present("rope_scaling") ? &j["rope_scaling"] : params;
  const std::string skey = scaling == params ? "rope_parameters" : "rope_scaling";
  if (scaling) {
    LF_CHECK(scaling->is_object(), source, ": ", skey, " must be an object, got ", scaling->dump());
    std::string type = scaling->value("rope_type", scaling->value("type", std::string("default")));
    if (type != "default") {
      auto it = std::find_if(m.rope_scaling.begin(), m.rope_scaling.end(),
                             [&](const RopeScaling& r) { return r.type == type; });
      std::string supported;
      for (const auto& r : m.rope_scaling) supported += (supported.empty() ? "" : ", ") + r.type;
      LF_CHECK(it != m.rope_scaling.end(), source, ": ", skey, " type '", type,
               "' is not supported by the ", m.model_type, " mapping (", m.path, "; supported: ",
               supported.empty() ? "none" : supported, ")");
      const auto eq = it->flag.find('=');
      if (eq == std::string::npos)
        n.set(it->flag, Node::scalar("true", origin(skey)));
      else
        n.set(it->flag.substr(0, eq), Node::scalar(it->flag.substr(eq + 1), origin(skey), /*quoted=*/true));
      // transformers reads an absent or null key as its default; a key this mapping does not read
      // would change the model silently, so it is refused.
      auto has = [&](const std::string& key) { return scaling->contains(key) && !(*scaling)[key].is_null(); };
      std::set<std::string> read{"rope_type", "type", "rope_theta"};
      std::string keys;
      for (const auto& f : it->fields) {
        read.insert(f.key);
        keys += (keys.empty() ? "" : ", ") + f.key;
        if (!f.accept.is_null()) {
          // Absent is transformers' default; null is not (YaRN's truncate: null reads as false).
          LF_CHECK(!scaling->contains(f.key) || same_json((*scaling)[f.key], f.accept), source, ": ", skey, ".", f.key,
                   " is ", (*scaling)[f.key].dump(), "; the ", m.model_type, " mapping (", m.path, ") supports only ",
                   f.accept.dump());
          continue;
        }
        if (has(f.key)) {
          n.set(f.field, to_node((*scaling)[f.key], origin(skey + "." + f.key)));
        } else if (!f.default_key.empty() && present(f.default_key)) {
          n.set(f.field, to_node(j[f.default_key], origin(f.default_key)));
        } else {
          LF_CHECK(!f.default_value.is_null(), source, ": ", skey, " (", type, ") lacks '", f.key, "'");
          n.set(f.field, to_node(f.default_value, origin(skey + "." + f.key)));
        }
      }
      // transformers gives a top-level original_max_position_embeddings (Phi-3's) priority over
      // the scaling's own: one that disagrees with what was read is refused.
      if (present("original_max_position_embeddings") && read.count("original_max_position_embeddings")) {
        const lf::config::Node* got = nullptr;
        for (const auto& f : it->fields)
          if (f.key == "original_max_position_embeddings" && !f.field.empty()) got = n.find(f.field);
        LF_CHECK(got == nullptr || same_json(to_json(*got), j["original_max_position_embeddings"]), source,
                 ": original_max_position_embeddings ", j["original_max_position_embeddings"].dump(), " and ", skey,
                 ".original_max_position_embeddings ", got ? to_json(*got).dump() : "", " differ",
                 lf::hint("transformers uses the top-level value; make the two agree"));
      }
      for (const auto& [key, value] : scaling->items())
        LF_CHECK(read.count(key) || value.is_null(), source, ": ", skey, " has '", key, "', which the ", m.model_type,
                 " mapping (", m.path, ") does not read for rope_type ", type, " (it reads ", keys, ")",
                 lf::hint("remove the key if its value is transformers' default, else this model is not supported"));
    }
  }
  lf::config::ErrorList errors;
  DecoderConfig out;
  lf::config::load_into(&n, "model.foundation", out, errors);
  if (errors.empty()) out.validate(n, "model.foundation", errors);
  errors.throw_if_any();
  return out;
}

std::vector<ConfigDifference> model_differences(const DecoderConfig& a, const DecoderConfig& b,
                                                bool with_init) {
  // Fields that do not shape the weights or the function (padding multiple, dropout, Megatron's
  // GQA switch) are exempt; rope_scaling_* only matter with rope_scaling on (the original context
  // with YaRN too).
  // So are the MoE training settings (auxiliary-loss coefficients, the bias update rate, the
  // capacity limit), DSA's training settings (the indexer loss's coefficient, the dense warm-up
  // stage, after which the weights are those of the sparse model), and moe_layer_freq compares by
  // the layers it selects.
  static const std::set<std::string> exempt{"make_vocab_size_divisible_by", "hidden_dropout",
                                            "attention_dropout", "group_query_attention",
                                            "moe_router_load_balancing_type", "moe_aux_loss_coeff",
                                            "moe_z_loss_coeff", "moe_router_bias_update_rate",
                                            "moe_expert_capacity_factor", "moe_token_drop_policy",
                                            "moe_layer_freq", "dsa_indexer_loss_coeff", "dsa_indexer_warmup"};
  const json fa = config_fields(a), fb = config_fields(b);
  const bool llama3 = fa.value("rope_scaling", false) || fb.value("rope_scaling", false);
  const bool yarn = fa.value("rope_type", "") == "yarn" || fb.value("rope_type", "") == "yarn";
  auto unused_rope = [&](const std::string& field) {
    if (field == "rope_scaling_original_max_position_embeddings") return !llama3 && !yarn;  // both read it
    return !llama3 && field.rfind("rope_scaling_", 0) == 0;
  };
  std::vector<ConfigDifference> out;
  for (const auto& [field, value] : fa.items()) {
    if (exempt.count(field) || unused_rope(field) ||
        (!with_init && field == "init_method_std"))
      continue;
    if (!fb.contains(field) || !same_json(fb[field], value))
      out.push_back({field, value.dump(), fb.contains(field) ? fb[field].dump() : "nothing"});
  }
  if (a.is_moe() || b.is_moe()) {
    auto text = [](const DecoderConfig& c) {
      std::string s;
      for (bool m : c.moe_layer_pattern()) s += m ? '1' : '0';
      return s;
    };
    if (text(a) != text(b)) out.push_back({"moe_layer_freq", a.moe_layer_freq, b.moe_layer_freq});
  }
  return out;
}

json config_to_json(const DecoderConfig& config, const Mapping::Impl& m, at::ScalarType dtype) {
  const json fields = config_fields(config);
  LF_CHECK(!m.moe_section || config.is_moe(), "the ", m.model_type, " mapping (", m.path,
           ") is for MoE models; this one has no experts (num_experts 0)");
  for (const auto& [field, value] : m.fixed)
    LF_CHECK(same_json(fields[field], value), "the ", m.model_type, " mapping (", m.path,
             ") needs ", field, " ", value.dump(), ", the model has ", fields[field].dump());
  json out = json::object();
  out["architectures"] = json::array({m.architecture});
  out["model_type"] = m.model_type;
  for (const auto& [key, value] : m.constants) out[key] = value;
  for (const auto& k : m.config) {
    json v = k.negate ? json(!fields[k.field].get<bool>()) : fields[k.field];
    if (k.zero_is_null && v.is_number() && v.get<double>() == 0) v = nullptr;
    out[k.hf_key] = v;
  }
  for (const auto& k : m.config)
    if (!k.times.empty()) {  // hf_key = field / the value of `times` (written above)
      const int64_t total = fields[k.field].get<int64_t>(), unit = out.value(k.times, json(0)).get<int64_t>();
      LF_CHECK(unit > 0 && total % unit == 0, "the ", m.model_type, " config.json (", m.path, ") writes ", k.field,
               " ", total, " as ", k.hf_key, " x ", k.times, " (", unit, "), which does not divide it");
      out[k.hf_key] = total / unit;
    }
  if (m.moe_section) {
    const auto pattern = config.moe_layer_pattern();
    if (!m.sparse_step_key.empty()) out[m.sparse_step_key] = 1;
    size_t first = 0;
    if (!m.first_dense_key.empty()) {
      while (first < pattern.size() && !pattern[first]) ++first;
      out[m.first_dense_key] = static_cast<int64_t>(first);
    }
    json dense = json::array();
    for (size_t i = first; i < pattern.size(); ++i)
      if (!pattern[i]) dense.push_back(static_cast<int64_t>(i));
    if (!m.dense_layers_key.empty()) {
      out[m.dense_layers_key] = dense;
    } else {
      LF_CHECK(dense.empty(), "the ", m.model_type, " config.json (", m.path, ") can only make the first layers dense; "
               "moe_layer_freq ", config.moe_layer_freq, " has dense layers after MoE ones");
    }
  }
  out["rope_theta"] = fields[m.rope_theta_field];
  out["rope_scaling"] = nullptr;
  for (const auto& r : m.rope_scaling) {
    const auto eq = r.flag.find('=');
    const bool on = eq == std::string::npos ? fields[r.flag].get<bool>()
                                            : fields[r.flag.substr(0, eq)] == json(r.flag.substr(eq + 1));
    if (on) {
      json s = {{"rope_type", r.type}};
      for (const auto& f : r.fields)  // keys at their default are left out, as transformers writes them
        if (f.accept.is_null() && !same_json(fields[f.field], f.default_value)) s[f.key] = fields[f.field];
      out["rope_scaling"] = s;
    }
  }
  out["torch_dtype"] = dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
  out["use_cache"] = true;
  // Whatever config.json cannot say would be lost silently: read it back and compare.
  const DecoderConfig back = config_from_json(out, m, "config.json for " + m.architecture);
  for (const auto& d : model_differences(config, back, /*with_init=*/true))
    LF_FAIL("the ", m.model_type, " config.json (", m.path, ") cannot express ", d.field, " ",
            d.ours, " (it reads back as ", d.theirs, ")");
  return out;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  LF_CHECK(in.good(), "cannot open ", path,
           lf::hint("an HF model directory holds config.json and model*.safetensors"));
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    LF_FAIL(path, ": not valid JSON: ", e.what());
  }
}

DecoderConfig read_hf_config(const std::string& hf_dir, const Mapping* mapping,
                             const std::string& configs_root) {
  const std::string path = (fs::path(hf_dir) / "config.json").string();
  const json j = read_json_file(path);
  if (mapping) return config_from_json(j, mapping->impl(), lf::config::display_path(path));
  std::string arch, type = j.value("model_type", std::string());
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty())
    arch = j["architectures"][0].get<std::string>();
  try {
    const Mapping m = mapping_for_architecture(arch, type, configs_root);
    return config_from_json(j, m.impl(), lf::config::display_path(path));
  } catch (const lf::config::ConfigError&) {
    throw;
  } catch (const lf::Error& e) {
    if (e.message().rfind("unknown architecture", 0) != 0) throw;
    LF_FAIL(lf::config::display_path(path), ": ", e.message(), lf::hint(e.hint()));
  }
}

std::string hf_config_json(const DecoderConfig& config, const Mapping& mapping,
                           at::ScalarType dtype) {
  return config_to_json(config, mapping.impl(), dtype).dump(2) + "\n";
}

std::string model_section_yaml(const DecoderConfig& config) {
  Node model = Node::map();
  model.set("type", Node::scalar("causal_lm"));
  model.set("foundation", lf::config::to_node(config));
  Node root = Node::map();
  root.set("model", std::move(model));
  return lf::config::to_yaml(root);
}

DecoderConfig config_from_model_section(const std::string& yaml_text, const std::string& source) {
  const Node root = lf::config::parse_yaml_string(yaml_text, lf::config::Origin::from_file(source, 1));
  const Node* model = root.find("model");
  LF_CHECK(model != nullptr, source, ": no model: section in the checkpoint's configuration",
           lf::hint("the checkpoint was not written by loongforge-train or loongforge-convert"));
  return lf::models::load_causal_lm(*model).foundation;
}

}  // namespace lf::models::hf

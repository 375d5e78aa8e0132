// YAML <-> Node with yaml-cpp underneath for parsing (it gives the marks for file:line) and a
// small emitter of our own for printing (trailing origin comments, and scalars quoted exactly
// when plain text would read back as another type).
#include "loongforge/core/config/yaml.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loongforge/core/config/config_error.h"

namespace lf::config {
namespace fs = std::filesystem;

std::string display_path(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) return path;
  fs::path cwd = fs::current_path(ec);
  if (!ec) {
    fs::path rel = p.lexically_relative(cwd);
    if (!rel.empty() && *rel.begin() != "..") return rel.string();
  }
  return p.string();
}

namespace {

Origin at(const Origin& base, const YAML::Mark& mark) {
  if (base.kind != Origin::Kind::file || mark.is_null()) return base;
  Origin o = base;
  o.line = mark.line + 1;
  o.column = mark.column + 1;
  return o;
}

Node convert(const YAML::Node& y, const Origin& base, ErrorList& errors) {
  Origin o = at(base, y.Mark());
  switch (y.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return Node::null(o);
    case YAML::NodeType::Scalar:
      // yaml-cpp tags non-plain (quoted, block) scalars "!": those are strings whatever they say.
      return Node::scalar(y.Scalar(), o, y.Tag() == "!");
    case YAML::NodeType::Sequence: {
      Node s = Node::sequence(o);
      for (const YAML::Node& c : y) s.push_back(convert(c, base, errors));
      return s;
    }
    case YAML::NodeType::Map: {
      Node m = Node::map(o);
      for (auto it = y.begin(); it != y.end(); ++it) {
        Origin ko = at(base, it->first.Mark());
        if (!it->first.IsScalar()) {
          errors.add("", ko, "a map key must be a scalar");
          continue;
        }
        const std::string key = it->first.Scalar();
        if (m.find(key)) {
          errors.add(key, ko, "duplicate key '" + key + "'",
                     "the earlier one is at " + m.find(key)->origin().str());
          continue;
        }
        Node v = convert(it->second, base, errors);
        // A null has no mark of its own in yaml-cpp, and a block map or list starts on the line
        // after its key: point at the key, where a reader looks for the value.
        if (v.is_null() || v.is_map() || v.is_sequence()) v.set_origin(ko);
        m.set(key, std::move(v));
      }
      return m;
    }
  }
  return Node::null(o);
}

Node parse(std::string_view text, const Origin& base) {
  ErrorList errors;
  YAML::Node y;
  try {
    y = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    Origin o = at(base, e.mark);
    errors.add("", o, "YAML syntax error: " + e.msg);
    errors.throw_if_any();
  }
  Node n = convert(y, base, errors);
  errors.throw_if_any();
  return n;
}

// ---- printing ----

bool looks_typed(const std::string& s) { return looks_like_non_string(s); }

bool safe_plain(const std::string& s) {
  if (s.empty()) return false;
  if (std::isspace(static_cast<unsigned char>(s.front())) ||
      std::isspace(static_cast<unsigned char>(s.back())))
    return false;
  if (std::string_view("?:,[]{}#&*!|>'\"%@`").find(s.front()) != std::string_view::npos) return false;
  if (s.front() == '-' && (s.size() == 1 || s[1] == ' ')) return false;
  if (s.back() == ':') return false;
  for (char c : s)
    if (c == '\n' || c == '\t' || c == '\r') return false;
  return s.find(": ") == std::string::npos && s.find(" #") == std::string::npos;
}

std::string double_quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default: out += c;
    }
  }
  return out + "\"";
}

std::string scalar_text(const Node& n) {
  const std::string& s = n.text();
  if (!safe_plain(s)) return double_quoted(s);
  if (n.quoted() && looks_typed(s)) return double_quoted(s);
  return s;
}

bool inline_leaf(const Node& n) {
  if (n.is_null() || n.is_scalar()) return true;
  if (n.size() == 0) return true;
  if (n.is_sequence()) {
    for (const Node& c : n.children())
      if (!(c.is_null() || c.is_scalar())) return false;
    return true;
  }
  return false;
}

std::string inline_text(const Node& n) {
  if (n.is_null()) return "null";
  if (n.is_scalar()) return scalar_text(n);
  if (n.is_map()) return "{}";
  std::string out = "[";
  for (size_t i = 0; i < n.size(); ++i) {
    if (i) out += ", ";
    const Node& c = n.children()[i];
    std::string t = inline_text(c);
    // Inside a flow sequence ',' and brackets end a plain scalar.
    if (c.is_scalar() && t.front() != '"' && t.find_first_of(",[]{}") != std::string::npos)
      t = double_quoted(c.text());
    out += t;
  }
  return out + "]";
}

std::string key_text(const std::string& k) {
  return safe_plain(k) && !looks_typed(k) ? k : double_quoted(k);
}

class Emitter {
 public:
  explicit Emitter(bool show_origin) : show_origin_(show_origin) {}

  void leaf(const Node& n) {
    os_ << inline_text(n);
    if (show_origin_ && n.origin().kind != Origin::Kind::unknown) os_ << "  # " << n.origin().str();
    os_ << "\n";
  }

  // Emits a map's entries; the first line's indentation is `first` (for "- " items).
  void map(const Node& n, const std::string& indent, const std::string& first) {
    bool is_first = true;
    for (const Node& c : n.children()) {
      os_ << (is_first ? first : indent) << key_text(c.key()) << ":";
      is_first = false;
      value(c, indent);
    }
  }

  void seq(const Node& n, const std::string& indent, const std::string& first) {
    bool is_first = true;
    for (const Node& c : n.children()) {
      os_ << (is_first ? first : indent) << "- ";
      is_first = false;
      if (inline_leaf(c)) {
        leaf(c);
      } else if (c.is_map()) {
        map(c, indent + "  ", "");
      } else {
        seq(c, indent + "  ", "");
      }
    }
  }

  // After "key:".
  void value(const Node& c, const std::string& indent) {
    if (inline_leaf(c)) {
      os_ << " ";
      leaf(c);
    } else if (c.is_map()) {
      os_ << "\n";
      map(c, indent + "  ", indent + "  ");
    } else {
      os_ << "\n";
      seq(c, indent + "  ", indent + "  ");
    }
  }

  std::string str() const { return os_.str(); }
  std::ostringstream& os() { return os_; }

 private:
  bool show_origin_;
  std::ostringstream os_;
};

}  // namespace

Node parse_yaml_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    ErrorList errors;
    errors.add("", Origin{}, "config file '" + path + "' does not exist",
               "check the path (it is resolved against the current directory " +
                   fs::current_path(ec).string() + ")");
    errors.throw_if_any();
  }
  std::string text;
  {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  Node n = parse(text, Origin::from_file(display_path(path), 1, 1));
  if (n.is_null()) {
    Node m = Node::map(Origin::from_file(display_path(path), 1, 1));
    return m;
  }
  return n;
}

Node parse_yaml_string(std::string_view text, const Origin& origin) {
  if (text.empty()) return Node::scalar("", origin, true);
  return parse(text, origin);
}

std::string to_yaml(const Node& node, bool show_origin) {
  Emitter e(show_origin);
  if (node.is_map() && node.size() > 0) {
    e.map(node, "", "");
  } else if (node.is_sequence() && !inline_leaf(node)) {
    e.seq(node, "", "");
  } else {
    e.leaf(node);
  }
  return e.str();
}

}  // namespace lf::config

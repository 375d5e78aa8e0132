// Node, YAML parsing with origins, and printing (to_yaml with and without origins).
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "loongforge/core/config/yaml.h"

namespace lf::config {
namespace {
using testing::expect_config_error;
using testing::write_file;

TEST(ConfigYaml, ParsesWithLineAndColumn) {
  std::string dir = lf::testing::make_temp_dir("cfg_yaml");
  std::string path = write_file(dir, "a.yaml", "# comment\nx: 1\nsub:\n  y: 'two'\n  z: [1, 2]\n  n:\n");
  Node n = parse_yaml_file(path);
  ASSERT_TRUE(n.is_map());
  EXPECT_EQ(n.keys(), (std::vector<std::string>{"x", "sub"}));
  const Node* y = n.find_path("sub.y");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(y->text(), "two");
  EXPECT_TRUE(y->quoted());
  EXPECT_EQ(y->origin().kind, Origin::Kind::file);
  EXPECT_EQ(y->origin().line, 4);
  EXPECT_EQ(y->origin().column, 6);
  EXPECT_EQ(y->origin().str(), display_path(path) + ":4");
  EXPECT_FALSE(n.find("x")->quoted());
  EXPECT_EQ(n.find_path("sub.z")->size(), 2u);
  EXPECT_TRUE(n.find_path("sub.n")->is_null());
  EXPECT_EQ(n.find_path("sub.n")->origin().line, 6);  // a null points at its key
}

TEST(ConfigYaml, SyntaxErrorNamesFileAndLine) {
  std::string dir = lf::testing::make_temp_dir("cfg_yaml");
  std::string path = write_file(dir, "bad.yaml", "a: 1\nb: [1, 2\nc: 3\n");
  ConfigError e = expect_config_error([&] { parse_yaml_file(path); });
  ASSERT_EQ(e.issues().size(), 1u);
  EXPECT_EQ(e.issues()[0].origin.file, display_path(path));
  EXPECT_GE(e.issues()[0].origin.line, 2);
  EXPECT_NE(std::string(e.what()).find("YAML syntax error"), std::string::npos);
}

TEST(ConfigYaml, DuplicateKeyIsAnError) {
  std::string dir = lf::testing::make_temp_dir("cfg_yaml");
  std::string path = write_file(dir, "dup.yaml", "a: 1\nb: 2\na: 3\n");
  ConfigError e = expect_config_error([&] { parse_yaml_file(path); });
  ASSERT_EQ(e.issues().size(), 1u);
  EXPECT_EQ(e.issues()[0].origin.line, 3);
  EXPECT_EQ(e.issues()[0].hint, "the earlier one is at " + display_path(path) + ":1");
}

TEST(ConfigNode, MergeMapsRecursivelySequencesReplace) {
  Node a = parse_yaml_string("{x: {p: 1, q: 2}, s: [1, 2, 3], k: v}", Origin::from_override("a"));
  Node b = parse_yaml_string("{x: {q: 20, r: 30}, s: [9], k: {m: 1}}", Origin::from_override("b"));
  merge_into(a, b);
  EXPECT_EQ(to_yaml(a), "x:\n  p: 1\n  q: 20\n  r: 30\ns: [9]\nk:\n  m: 1\n");
  EXPECT_EQ(a.find_path("x.p")->origin().text, "a");
  EXPECT_EQ(a.find_path("x.q")->origin().text, "b");
}

TEST(ConfigNode, PathsSetErase) {
  Node n = Node::map();
  n.set_path("a.b.c", Node::scalar("1"));
  n.set_path("a.d", Node::scalar("2"));
  EXPECT_EQ(n.all_paths(), (std::vector<std::string>{"a", "a.b", "a.b.c", "a.d"}));
  EXPECT_TRUE(n.erase_path("a.b.c"));
  EXPECT_FALSE(n.erase_path("a.b.c"));
  EXPECT_EQ(to_yaml(n), "a:\n  b: {}\n  d: 2\n");
  Node defaults = parse_yaml_string("{a: {d: 9, e: 5}, f: 6}", Origin::from_default());
  fill_missing(n, defaults);
  EXPECT_EQ(to_yaml(n), "a:\n  b: {}\n  d: 2\n  e: 5\nf: 6\n");
}

TEST(ConfigYaml, PrintQuotesExactlyWhatWouldReadBackAsAnotherType) {
  Node n = Node::map();
  n.set("plain", Node::scalar("hello"));
  n.set("num_string", Node::scalar("3", {}, true));
  n.set("num", Node::scalar("3"));
  n.set("bool_string", Node::scalar("true", {}, true));
  n.set("colon", Node::scalar("a: b"));
  n.set("empty", Node::scalar("", {}, true));
  n.set("nothing", Node::null());
  n.set("list", parse_yaml_string("[a, 'b,c', 1]", {}));
  EXPECT_EQ(to_yaml(n),
            "plain: hello\nnum_string: \"3\"\nnum: 3\nbool_string: \"true\"\ncolon: \"a: b\"\n"
            "empty: \"\"\nnothing: null\nlist: [a, \"b,c\", 1]\n");
  Node back = parse_yaml_string(to_yaml(n), {});
  EXPECT_TRUE(back.same_value(n)) << to_yaml(back);
}

TEST(ConfigYaml, SequencesOfMapsRoundTrip) {
  Node n = parse_yaml_string("a:\n  - x: 1\n    y: [1, 2]\n  - - 3\n    - 4\n", {});
  std::string text = to_yaml(n);
  EXPECT_EQ(text, "a:\n  - x: 1\n    y: [1, 2]\n  - [3, 4]\n");
  EXPECT_TRUE(parse_yaml_string(text, {}).same_value(n));
}

TEST(ConfigYaml, ShowOriginAddsOneCommentPerLeaf) {
  std::string dir = lf::testing::make_temp_dir("cfg_yaml");
  std::string path = write_file(dir, "o.yaml", "training:\n  seed: 3\n  tags: [a, b]\n");
  Node n = parse_yaml_file(path);
  n.set_path("training.lr", Node::scalar("0.1", Origin::from_flag("--lr 0.1")));
  n.set_path("training.iters", Node::scalar("5", Origin::from_override("training.iters=5")));
  n.set_path("training.mbs", Node::scalar("1", Origin::from_default()));
  const std::string f = display_path(path);
  EXPECT_EQ(to_yaml(n, true), "training:\n  seed: 3  # " + f + ":2\n  tags: [a, b]  # " + f +
                                  ":3\n  lr: 0.1  # flag --lr 0.1\n  iters: 5  # override training.iters=5\n"
                                  "  mbs: 1  # default\n");
}

}  // namespace
}  // namespace lf::config

// Defaults-list composition: _self_ ordering, packages, nested defaults, choice overrides,
// optional entries, missing options and cycles; and the real configs/ tree.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "loongforge/core/config/compose.h"
#include "loongforge/core/config/yaml.h"

namespace lf::config {
namespace {
using testing::expect_config_error;
using testing::write_file;

std::vector<Override> parse_all(const std::vector<std::string>& texts) {
  std::vector<Override> out;
  for (const std::string& t : texts) out.push_back(Override::parse(t));
  return out;
}

// A small tree: db/{mysql,postgres}.yaml, server/apache.yaml with nested defaults.
std::string make_tree() {
  std::string root = lf::testing::make_temp_dir("cfg_compose");
  write_file(root, "db/mysql.yaml", "driver: mysql\nport: 3306\n");
  write_file(root, "db/postgres.yaml", "driver: postgres\nport: 5432\n");
  write_file(root, "server/apache.yaml", "defaults:\n  - db: mysql\n  - _self_\nname: apache\nport: 80\n");
  write_file(root, "server/db/sqlite.yaml", "driver: sqlite\n");
  write_file(root, "common.yaml", "port: 1\nshared: true\n");
  return root;
}

Node run(const std::string& root, const std::string& primary_text, const std::vector<std::string>& overrides = {}) {
  ComposeOptions o;
  o.config_root = root;
  o.config_file = write_file(root, "main.yaml", primary_text);
  o.overrides = parse_all(overrides);
  return compose(o);
}

TEST(ConfigCompose, SelfLastByDefault) {
  std::string root = make_tree();
  Node n = run(root, "defaults:\n  - db: mysql\ndb:\n  port: 1\n");
  EXPECT_EQ(to_yaml(n), "db:\n  driver: mysql\n  port: 1\n");
}

TEST(ConfigCompose, SelfFirstLetsDefaultsWin) {
  std::string root = make_tree();
  Node n = run(root, "defaults:\n  - _self_\n  - db: mysql\ndb:\n  port: 1\n  extra: 2\n");
  EXPECT_EQ(to_yaml(n), "db:\n  port: 3306\n  extra: 2\n  driver: mysql\n");
  EXPECT_EQ(n.find_path("db.port")->origin().str(), display_path(root + "/db/mysql.yaml") + ":2");
}

TEST(ConfigCompose, PackageOverrideAndGlobal) {
  std::string root = make_tree();
  Node n = run(root, "defaults:\n  - db@backend.primary: postgres\n  - /common@_global_\n  - db@_global_: mysql\n");
  EXPECT_EQ(to_yaml(n), "backend:\n  primary:\n    driver: postgres\n    port: 5432\nport: 3306\nshared: true\ndriver: mysql\n");
}

TEST(ConfigCompose, PlainConfigEntryMergesAtCurrentPackage) {
  std::string root = make_tree();
  Node n = run(root, "defaults:\n  - common\nport: 2\n");
  EXPECT_EQ(to_yaml(n), "port: 2\nshared: true\n");
}

TEST(ConfigCompose, NestedDefaultsAreRelativeToTheIncludingGroup) {
  std::string root = make_tree();
  // server/apache.yaml says `- db: mysql`: relative, so group server/db, package server.db.
  write_file(root, "server/db/mysql.yaml", "driver: server-mysql\n");
  Node n = run(root, "defaults:\n  - server: apache\n");
  EXPECT_EQ(to_yaml(n), "server:\n  db:\n    driver: server-mysql\n  name: apache\n  port: 80\n");
}

TEST(ConfigCompose, ChoiceOverrideFromCommandLine) {
  std::string root = make_tree();
  Node n = run(root, "defaults:\n  - db: mysql\n", {"db=postgres"});
  EXPECT_EQ(n.find_path("db.driver")->text(), "postgres");
  // Nested entry, addressed by its full group path.
  Node m = run(root, "defaults:\n  - server: apache\n", {"server/db=sqlite"});
  EXPECT_EQ(m.find_path("server.db.driver")->text(), "sqlite");
  // group@package form; ~group deletes the entry.
  Node k = run(root, "defaults:\n  - db@x: mysql\n  - db@y: mysql\n", {"db@y=postgres", "~db@x"});
  EXPECT_EQ(to_yaml(k), "y:\n  driver: postgres\n  port: 5432\n");
}

TEST(ConfigCompose, OverrideKeywordInFileAndCommandLineWins) {
  std::string root = make_tree();
  const std::string primary = "defaults:\n  - server: apache\n  - override server/db: sqlite\n";
  EXPECT_EQ(run(root, primary).find_path("server.db.driver")->text(), "sqlite");
  write_file(root, "server/db/pg.yaml", "driver: server-pg\n");
  EXPECT_EQ(run(root, primary, {"server/db=pg"}).find_path("server.db.driver")->text(), "server-pg");
}

TEST(ConfigCompose, AppendGroupFromCommandLine) {
  std::string root = make_tree();
  // Appended to the primary defaults list, which merges before the file's own content.
  Node n = run(root, "a: 1\n", {"+db=postgres"});
  EXPECT_EQ(to_yaml(n), "db:\n  driver: postgres\n  port: 5432\na: 1\n");
}

TEST(ConfigCompose, BareOverrideThatNamesNoGroupIsAConfigOverride) {
  std::string root = make_tree();
  Node n = run(root, "defaults:\n  - db: mysql\na: 1\n", {"a=2"});
  EXPECT_EQ(n.find("a")->text(), "2");
  EXPECT_EQ(n.find("a")->origin().str(), "override a=2");
}

TEST(ConfigCompose, OptionalMissingIsSkippedMissingOptionIsAnError) {
  std::string root = make_tree();
  EXPECT_EQ(to_yaml(run(root, "defaults:\n  - optional db: oracle\nx: 1\n")), "x: 1\n");
  ConfigError e = expect_config_error([&] { run(root, "x: 1\ndefaults:\n  - db: mysqll\n"); });
  ASSERT_EQ(e.issues().size(), 1u);
  const ConfigIssue& i = e.issues()[0];
  EXPECT_EQ(i.origin.str(), display_path(root + "/main.yaml") + ":3");
  EXPECT_EQ(i.message, "defaults entry 'db: mysqll': no config '" + display_path(root + "/db/mysqll.yaml") + "'");
  EXPECT_EQ(i.hint, "did you mean 'mysql'? options in group 'db': mysql, postgres");
}

TEST(ConfigCompose, MissingGroupAndUnknownChoiceAreErrors) {
  std::string root = make_tree();
  ConfigError e = expect_config_error([&] { run(root, "defaults:\n  - dbs: mysql\n", {"server/db=x"}); });
  ASSERT_EQ(e.issues().size(), 2u);
  EXPECT_NE(e.issues()[0].message.find("no config group 'dbs'"), std::string::npos);
  EXPECT_EQ(e.issues()[0].hint.substr(0, 21), "did you mean 'db'? gr");
  EXPECT_EQ(e.issues()[1].message, "'server/db=x' names no group of the defaults lists");
}

TEST(ConfigCompose, CycleIsAnError) {
  std::string root = make_tree();
  write_file(root, "a.yaml", "defaults:\n  - b\nx: 1\n");
  write_file(root, "b.yaml", "defaults:\n  - a\ny: 1\n");
  ConfigError e = expect_config_error([&] { run(root, "defaults:\n  - a\n"); });
  ASSERT_EQ(e.issues().size(), 1u);
  EXPECT_NE(e.issues()[0].message.find("cycle"), std::string::npos);
}

TEST(ConfigCompose, BaseIsFilledUnderneathBeforeOverrides) {
  std::string root = make_tree();
  ComposeOptions o;
  o.config_root = root;
  o.config_file = write_file(root, "main.yaml", "t:\n  a: 1\n");
  o.base = parse_yaml_string("{t: {a: 0, b: 0}}", Origin::from_default());
  o.overrides = parse_all({"t.b=5"});
  Node n = compose(o);
  EXPECT_EQ(to_yaml(n, true), "t:\n  a: 1  # " + display_path(o.config_file) + ":2\n  b: 5  # override t.b=5\n");
}

TEST(ConfigCompose, RealDemoTree) {
  ComposeOptions o;
  o.config_root = lf::testing::source_dir() + "/configs";
  o.config_file = o.config_root + "/demo.yaml";
  Node n = compose(o);
  EXPECT_EQ(n.find_path("model.type")->text(), "causal_lm");
  EXPECT_EQ(n.find_path("model.foundation.num_layers")->text(), "2");
  EXPECT_EQ(n.find_path("model.foundation.hidden_size")->origin().str(),
            display_path(o.config_root + "/models/llama/tiny.yaml") + ":3");
  EXPECT_EQ(n.find_path("optimizer.lr")->text(), "1.0e-3");  // demo.yaml wins over train/base.yaml
  EXPECT_EQ(n.find_path("optimizer.adam_beta2")->text(), "0.95");
  EXPECT_EQ(n.keys(), (std::vector<std::string>{"parallel", "training", "optimizer", "data", "checkpoint",
                                                "logging", "model"}));
}

}  // namespace
}  // namespace lf::config

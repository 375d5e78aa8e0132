// Overrides: parsing each form and applying it, including the errors.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "loongforge/core/config/compose.h"
#include "loongforge/core/config/yaml.h"

namespace lf::config {
namespace {
using testing::expect_config_error;

Node tree() { return parse_yaml_string("training:\n  seed: 1\n  lr: 0.1\nmodel:\n  layers: 2\n", {}); }

void apply(Node& n, const std::vector<std::string>& texts) {
  std::vector<Override> o;
  for (const std::string& t : texts) o.push_back(Override::parse(t));
  ErrorList errors;
  apply_overrides(n, o, errors);
  errors.throw_if_any();
}

TEST(ConfigOverride, ParsesEachForm) {
  Override a = Override::parse("a.b=3");
  EXPECT_EQ(a.kind, Override::Kind::set);
  EXPECT_EQ(a.key, "a.b");
  EXPECT_EQ(a.value->text(), "3");
  EXPECT_EQ(a.origin.str(), "override a.b=3");
  EXPECT_EQ(Override::parse("+a.b=3").kind, Override::Kind::add);
  EXPECT_EQ(Override::parse("++a.b=3").kind, Override::Kind::force);
  Override e = Override::parse("~a.b");
  EXPECT_EQ(e.kind, Override::Kind::erase);
  EXPECT_FALSE(e.value.has_value());
  EXPECT_EQ(Override::parse("~a.b=3").value->text(), "3");
}

TEST(ConfigOverride, ValuesAreYaml) {
  EXPECT_EQ(to_yaml(*Override::parse("a=[1,2]").value), "[1, 2]\n");
  EXPECT_EQ(to_yaml(*Override::parse("a={x: 1}").value), "x: 1\n");
  EXPECT_TRUE(Override::parse("a=null").value->is_null());
  Node q = *Override::parse("a='3'").value;
  EXPECT_TRUE(q.quoted());
  EXPECT_EQ(q.text(), "3");
  EXPECT_EQ(Override::parse("a=x=y").value->text(), "x=y");
  Node empty = *Override::parse("a=").value;
  EXPECT_TRUE(empty.is_scalar());
  EXPECT_EQ(empty.text(), "");
}

TEST(ConfigOverride, MalformedIsAnError) {
  ConfigError e = expect_config_error([] { Override::parse("training.seed"); });
  EXPECT_EQ(e.issues()[0].message, "malformed override 'training.seed': missing '=value'");
  ConfigError k = expect_config_error([] { Override::parse("a b=1"); });
  EXPECT_EQ(k.issues()[0].message, "malformed override 'a b=1': bad key 'a b'");
  ConfigError v = expect_config_error([] { Override::parse("a=[1,"); });
  EXPECT_EQ(v.issues()[0].message, "malformed override 'a=[1,': the value is not YAML");
}

TEST(ConfigOverride, SetReplacesAnExistingKey) {
  Node n = tree();
  apply(n, {"training.seed=7", "model={layers: 4, width: 8}"});
  EXPECT_EQ(to_yaml(n, true),
            "training:\n  seed: 7  # override training.seed=7\n  lr: 0.1\nmodel:\n"
            "  layers: 4  # override model={layers: 4, width: 8}\n  width: 8  # override model={layers: 4, width: 8}\n");
}

TEST(ConfigOverride, SetOfAMissingKeySuggestsTheNearest) {
  Node n = tree();
  ConfigError e = expect_config_error([&] { apply(n, {"training.sed=7"}); });
  ASSERT_EQ(e.issues().size(), 1u);
  EXPECT_EQ(e.issues()[0].message, "cannot override 'training.sed': no such key in the config");
  EXPECT_EQ(e.issues()[0].hint,
            "did you mean 'training.seed'? to add a new key write +training.sed=VALUE (or "
            "++training.sed=VALUE: add or replace)");
  ConfigError f = expect_config_error([&] { apply(n, {"seed=7"}); });
  EXPECT_EQ(f.issues()[0].hint.substr(0, 29), "did you mean 'training.seed'?");
}

TEST(ConfigOverride, AddMustBeNew) {
  Node n = tree();
  apply(n, {"+training.clip=1.0", "+new.deep.key=x"});
  EXPECT_EQ(n.find_path("training.clip")->text(), "1.0");
  EXPECT_EQ(n.find_path("new.deep.key")->text(), "x");
  ConfigError e = expect_config_error([&] { apply(n, {"+training.seed=2"}); });
  EXPECT_EQ(e.issues()[0].message, "cannot add 'training.seed': it already exists (<unknown origin>)");
  EXPECT_EQ(e.issues()[0].hint, "use training.seed=VALUE to replace it, or ++training.seed=VALUE");
  ConfigError b = expect_config_error([&] { apply(n, {"+training.seed.x=2"}); });
  EXPECT_EQ(b.issues()[0].message, "cannot set 'training.seed.x': 'training.seed' is a scalar, not a map (<unknown origin>)");
}

TEST(ConfigOverride, ForceAddsOrReplaces) {
  Node n = tree();
  apply(n, {"++training.seed=9", "++training.extra=[a]"});
  EXPECT_EQ(to_yaml(n), "training:\n  seed: 9\n  lr: 0.1\n  extra: [a]\nmodel:\n  layers: 2\n");
}

TEST(ConfigOverride, DeleteWithAndWithoutValue) {
  Node n = tree();
  apply(n, {"~training.seed", "~model.layers=2"});
  EXPECT_EQ(to_yaml(n), "training:\n  lr: 0.1\nmodel: {}\n");
  ConfigError e = expect_config_error([&] { apply(n, {"~training.lr=0.2"}); });
  EXPECT_EQ(e.issues()[0].message, "cannot delete 'training.lr': its value is not the one given (<unknown origin>)");
  ConfigError m = expect_config_error([&] { apply(n, {"~training.missing"}); });
  EXPECT_EQ(m.issues()[0].message, "cannot delete 'training.missing': no such key in the config");
}

TEST(ConfigOverride, AppliedLeftToRightAndErrorsCollected) {
  Node n = tree();
  apply(n, {"training.seed=2", "training.seed=3"});
  EXPECT_EQ(n.find_path("training.seed")->text(), "3");
  ConfigError e = expect_config_error([&] { apply(n, {"a.x=1", "training.seed=4", "b.y=2"}); });
  ASSERT_EQ(e.issues().size(), 2u);
  EXPECT_EQ(e.issues()[0].key, "a.x");
  EXPECT_EQ(e.issues()[1].key, "b.y");
  EXPECT_EQ(n.find_path("training.seed")->text(), "4");  // the good one still applied
}

}  // namespace
}  // namespace lf::config

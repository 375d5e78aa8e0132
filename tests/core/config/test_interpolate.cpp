// Interpolation: keys, environment, types, escapes, and the errors (missing, cycle).
#include <gtest/gtest.h>

#include <cstdlib>

#include "config_test_util.h"
#include "loongforge/core/config/interpolate.h"
#include "loongforge/core/config/yaml.h"

namespace lf::config {
namespace {
using testing::write_file;

Node resolve(const std::string& yaml, ErrorList& errors) {
  Node n = parse_yaml_string(yaml, Origin::from_file("t.yaml", 1));
  resolve_interpolations(n, errors);
  return n;
}
Node resolve(const std::string& yaml) {
  ErrorList errors;
  Node n = resolve(yaml, errors);
  errors.throw_if_any();
  return n;
}

TEST(ConfigInterpolate, WholeValueKeepsTheType) {
  Node n = resolve("a: {b: 4, m: {x: 1}, s: [1, 2]}\nc: ${a.b}\nd: ${a.m}\ne: ${a.s}\nf: '${a.b}'\n");
  EXPECT_EQ(n.find("c")->text(), "4");
  EXPECT_FALSE(n.find("c")->quoted());  // still an int to a typed reader
  EXPECT_EQ(to_yaml(*n.find("d")), "x: 1\n");
  EXPECT_EQ(to_yaml(*n.find("e")), "[1, 2]\n");
  EXPECT_EQ(n.find("f")->text(), "4");
  // The referencing line stays the value's origin.
  EXPECT_EQ(n.find("c")->origin().str(), "t.yaml:2");
}

TEST(ConfigInterpolate, InsideAStringIsStringified) {
  Node n = resolve("name: run\nseed: 3\nout: /ckpt/${name}_s${seed}\n");
  EXPECT_EQ(n.find("out")->text(), "/ckpt/run_s3");
  EXPECT_TRUE(n.find("out")->quoted());
}

TEST(ConfigInterpolate, ChainsResolveInAnyOrder) {
  Node n = resolve("a: ${b}\nb: ${c.d}\nc: {d: 5}\n");
  EXPECT_EQ(n.find("a")->text(), "5");
}

TEST(ConfigInterpolate, RelativeKeys) {
  Node n = resolve("x:\n  a: 1\n  b: ${.a}\n  y:\n    c: ${..a}\n");
  EXPECT_EQ(n.find_path("x.b")->text(), "1");
  EXPECT_EQ(n.find_path("x.y.c")->text(), "1");
}

TEST(ConfigInterpolate, EnvironmentWithAndWithoutDefault) {
  ::setenv("LF_CFG_TEST_VAR", "/data/x", 1);
  ::unsetenv("LF_CFG_TEST_UNSET");
  Node n = resolve(
      "a: ${oc.env:LF_CFG_TEST_VAR}\nb: ${oc.env:LF_CFG_TEST_UNSET,8}\nc: ${oc.env:LF_CFG_TEST_UNSET, 'q'}\n"
      "d: ${oc.env:LF_CFG_TEST_UNSET,${a}}/y\ne: ${oc.env:LF_CFG_TEST_UNSET,null}\n");
  EXPECT_EQ(n.find("a")->text(), "/data/x");
  EXPECT_EQ(n.find("b")->text(), "8");
  EXPECT_FALSE(n.find("b")->quoted());
  EXPECT_EQ(n.find("c")->text(), "q");
  EXPECT_TRUE(n.find("c")->quoted());
  EXPECT_EQ(n.find("d")->text(), "/data/x/y");
  EXPECT_TRUE(n.find("e")->is_null());
}

TEST(ConfigInterpolate, EscapedIsLiteral) {
  ::setenv("LF_CFG_TEST_DOLLAR", "${a}", 1);
  Node n = resolve("a: 1\nb: \\${a}\nc: ${oc.env:LF_CFG_TEST_DOLLAR}\nd: ${c}\n");
  EXPECT_EQ(n.find("b")->text(), "${a}");
  EXPECT_EQ(n.find("c")->text(), "${a}");  // an environment value is never evaluated
}

TEST(ConfigInterpolate, MissingKeyNamesTheReferencingValue) {
  ErrorList errors;
  resolve("train:\n  seed: 1\nx: ${train.sed}\n", errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors.issues()[0].key, "x");
  EXPECT_EQ(errors.issues()[0].origin.str(), "t.yaml:3");
  EXPECT_EQ(errors.issues()[0].message, "interpolation '${train.sed}' names a missing key 'train.sed'");
  EXPECT_EQ(errors.issues()[0].hint, "did you mean 'train.seed'?");
}

TEST(ConfigInterpolate, MissingEnvironmentVariable) {
  ::unsetenv("LF_CFG_TEST_UNSET");
  ErrorList errors;
  resolve("x: ${oc.env:LF_CFG_TEST_UNSET}\n", errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors.issues()[0].message, "environment variable 'LF_CFG_TEST_UNSET' is not set");
}

TEST(ConfigInterpolate, CycleIsReportedOnce) {
  ErrorList errors;
  Node n = resolve("a: ${b}\nb: ${c}\nc: ${a}\nd: 1\n", errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors.issues()[0].message, "interpolation cycle: a -> b -> c -> a");
  EXPECT_EQ(errors.issues()[0].origin.str(), "t.yaml:1");
  EXPECT_EQ(n.find("d")->text(), "1");
}

TEST(ConfigInterpolate, NonScalarInsideAStringAndUnknownResolver) {
  ErrorList errors;
  resolve("m: {x: 1}\na: pre${m}\nb: ${foo:bar}\n", errors);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors.issues()[0].message, "'${m}' is a map and cannot be part of a string");
  EXPECT_EQ(errors.issues()[1].message, "unknown resolver 'foo' in '${foo:bar}'");
}

}  // namespace
}  // namespace lf::config

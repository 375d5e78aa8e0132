// Typed schema: loading with collected errors (unknown key with suggestion, wrong type, missing
// required, constraints), defaults as a tree, and documentation rows.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/core/config/yaml.h"

namespace lf::config {
namespace {
using testing::expect_config_error;
using testing::write_file;

struct Inner {
  int64_t width = 8;
  std::vector<double> scales = {1.0, 2.0};
  template <class V>
  void visit(V& v) {
    v("width", width, "Width", Min{1});
    v("scales", scales, "Scales", Min{0});
  }
};

struct Sample {
  int64_t tensor_model_parallel_size = 1;
  double lr = 0;
  bool flag = false;
  std::string style = "linear";
  std::optional<std::string> path;
  std::vector<std::string> names;
  int32_t small = 3;
  Inner inner;
  template <class V>
  void visit(V& v) {
    v("tensor_model_parallel_size", tensor_model_parallel_size, "TP size", Min{1});
    v("lr", lr, "Learning rate", Required{}, Min{0});
    v("flag", flag, "A switch");
    v("style", style, "Decay", OneOf{{"linear", "cosine"}});
    v("path", path, "Optional path");
    v("names", names, "Names");
    v("small", small, "A 32-bit int", Max{100});
    v("inner", inner, "Nested section");
  }
};

Node file_node(const std::string& text, std::string* path_out = nullptr) {
  std::string dir = lf::testing::make_temp_dir("cfg_schema");
  std::string path = write_file(dir, "s.yaml", text);
  if (path_out) *path_out = display_path(path);
  return parse_yaml_file(path);
}

TEST(ConfigSchema, LoadsEveryType) {
  Node n = file_node(
      "tensor_model_parallel_size: 4\nlr: 3e-4\nflag: true\nstyle: cosine\npath: /x\nnames: [a, b]\n"
      "small: -7\ninner: {width: 16, scales: [0.5]}\n");
  Sample s = load<Sample>(n);
  EXPECT_EQ(s.tensor_model_parallel_size, 4);
  EXPECT_DOUBLE_EQ(s.lr, 3e-4);
  EXPECT_TRUE(s.flag);
  EXPECT_EQ(s.style, "cosine");
  EXPECT_EQ(s.path, std::optional<std::string>("/x"));
  EXPECT_EQ(s.names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.small, -7);
  EXPECT_EQ(s.inner.width, 16);
  EXPECT_EQ(s.inner.scales, std::vector<double>{0.5});
}

TEST(ConfigSchema, AbsentFieldsKeepDefaultsNullClearsOptional) {
  Sample s = load<Sample>(file_node("lr: 1\npath: null\n"));
  EXPECT_EQ(s.tensor_model_parallel_size, 1);
  EXPECT_EQ(s.style, "linear");
  EXPECT_FALSE(s.path.has_value());
  EXPECT_EQ(s.inner.width, 8);
}

TEST(ConfigSchema, MisspelledKeyNamesFileLineAndNearestKey) {
  std::string path;
  Node n = file_node("lr: 1\ntensor_model_paralel_size: 2\n", &path);
  ConfigError e = expect_config_error([&] { load<Sample>(n, "parallel"); });
  ASSERT_EQ(e.issues().size(), 1u);
  const ConfigIssue& i = e.issues()[0];
  EXPECT_EQ(i.origin.str(), path + ":2");
  EXPECT_EQ(i.message, "unknown key 'parallel.tensor_model_paralel_size'");
  EXPECT_EQ(i.hint, "did you mean 'parallel.tensor_model_parallel_size'?");
  EXPECT_EQ(std::string(e.what()),
            "configuration error: " + path +
                ":2: unknown key 'parallel.tensor_model_paralel_size' (did you mean "
                "'parallel.tensor_model_parallel_size'?)");
}

TEST(ConfigSchema, FarOffUnknownKeyListsTheValidKeys) {
  ConfigError e = expect_config_error([&] { load<Sample>(file_node("lr: 1\ninner: {zzzzzz: 1}\n")); });
  ASSERT_EQ(e.issues().size(), 1u);
  EXPECT_EQ(e.issues()[0].hint, "valid keys in 'inner': width, scales");
}

TEST(ConfigSchema, WrongTypeNamesFileLineAndExpectedType) {
  std::string path;
  Node n = file_node("lr: fast\nflag: 1\ntensor_model_parallel_size: '2'\nnames: a\nsmall: 5000000000\n", &path);
  ConfigError e = expect_config_error([&] { load<Sample>(n); });
  ASSERT_EQ(e.issues().size(), 5u);  // in field order
  EXPECT_EQ(e.issues()[0].str(), path + ":3: 'tensor_model_parallel_size' expects int, got '2' (a quoted string)");
  EXPECT_EQ(e.issues()[1].str(), path + ":1: 'lr' expects float, got 'fast'");
  EXPECT_EQ(e.issues()[2].str(), path + ":2: 'flag' expects bool, got '1'");
  EXPECT_EQ(e.issues()[3].str(), path + ":4: 'names' expects list of string, got 'a'");
  EXPECT_EQ(e.issues()[4].str(), path + ":5: 'small' expects int, got '5000000000'");
}

TEST(ConfigSchema, MissingRequiredSaysWhich) {
  ConfigError e = expect_config_error([&] { load<Sample>(file_node("flag: false\n"), "optimizer"); });
  ASSERT_EQ(e.issues().size(), 1u);
  EXPECT_EQ(e.issues()[0].message, "required key 'optimizer.lr' is missing");
  EXPECT_EQ(e.issues()[0].hint, "set it in a config file, with a flag or with ++optimizer.lr=VALUE");
}

TEST(ConfigSchema, ConstraintViolationsNameKeyValueAndOrigin) {
  std::string path;
  Node n = file_node("lr: -1\ntensor_model_parallel_size: 0\nstyle: cosin\ninner: {scales: [1, -2]}\n", &path);
  ConfigError e = expect_config_error([&] { load<Sample>(n); });
  ASSERT_EQ(e.issues().size(), 4u);
  EXPECT_EQ(e.issues()[0].str(), path + ":2: tensor_model_parallel_size: value 0 is below the minimum 1");
  EXPECT_EQ(e.issues()[1].str(), path + ":1: lr: value -1 is below the minimum 0");
  EXPECT_EQ(e.issues()[2].str(),
            path + ":3: style: value 'cosin' is not allowed; one of: linear, cosine (did you mean 'cosine'?)");
  EXPECT_EQ(e.issues()[3].str(), path + ":4: inner.scales: value -2 is below the minimum 0");
}

TEST(ConfigSchema, AllErrorsOfOneLoadReportedTogether) {
  std::string path;
  Node n = file_node("tensor_model_paralel_size: 2\nflag: maybe\ninner:\n  widht: 3\n", &path);
  ConfigError e = expect_config_error([&] { load<Sample>(n); });
  ASSERT_EQ(e.issues().size(), 4u);
  std::string what = e.what();
  EXPECT_EQ(what.substr(0, 24), "4 configuration errors:\n");
  EXPECT_NE(what.find(path + ":2: 'flag' expects bool"), std::string::npos);
  EXPECT_NE(what.find(path + ":4: unknown key 'inner.widht' (did you mean 'inner.width'?)"), std::string::npos);
  EXPECT_NE(what.find("required key 'lr' is missing"), std::string::npos);
  EXPECT_NE(what.find(path + ":1: unknown key 'tensor_model_paralel_size'"), std::string::npos);
}

TEST(ConfigSchema, SectionOfTheWrongKind) {
  ConfigError e = expect_config_error([&] { load<Sample>(file_node("lr: 1\ninner: 3\n")); });
  ASSERT_EQ(e.issues().size(), 1u);
  EXPECT_EQ(e.issues()[0].message, "'inner' expects map (section), got '3'");
}

TEST(ConfigSchema, DefaultsAsATreeAndBack) {
  Node d = defaults_node<Sample>();
  EXPECT_EQ(to_yaml(d),
            "tensor_model_parallel_size: 1\nflag: false\nstyle: linear\npath: null\nnames: []\nsmall: 3\n"
            "inner:\n  width: 8\n  scales: [1, 2]\n");
  EXPECT_EQ(d.find("style")->origin().str(), "default");
  Sample s;
  s.lr = 0.5;
  s.names = {"x"};
  Sample back = load<Sample>(to_node(s));
  EXPECT_EQ(back.lr, 0.5);
  EXPECT_EQ(back.names, std::vector<std::string>{"x"});
}

TEST(ConfigSchema, DescribeListsEveryField) {
  std::vector<FieldDoc> docs = describe<Sample>("s");
  ASSERT_EQ(docs.size(), 9u);
  EXPECT_EQ(docs[1].key, "s.lr");
  EXPECT_EQ(docs[1].default_text, "(required)");
  EXPECT_EQ(docs[1].constraints, ">= 0");
  EXPECT_EQ(docs[3].constraints, "one of: linear, cosine");
  EXPECT_EQ(docs[4].type, "string or null");
  EXPECT_EQ(docs[8].key, "s.inner.scales");
  EXPECT_EQ(docs[8].default_text, "[1, 2]");
}

TEST(ConfigSchema, GetOneTypedValue) {
  Node n = file_node("model:\n  foundation:\n    num_layers: 2\n");
  EXPECT_EQ(get<int64_t>(n, "model.foundation.num_layers"), 2);
  ConfigError e = expect_config_error([&] { get<bool>(n, "model.foundation.num_layers"); });
  EXPECT_EQ(e.issues()[0].message, "'model.foundation.num_layers' expects bool, got '2'");
}

}  // namespace
}  // namespace lf::config

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "multiprocess.h"

namespace {

TEST(Error, CheckCarriesLocationValuesAndHint) {
  lf::set_diagnostic_rank(3);
  int tp = 3, world = 8;
  try {
    LF_CHECK(world % tp == 0, "tensor-model-parallel-size ", tp, " does not divide world size ", world,
             lf::hint("choose a divisor of the world size"));
    FAIL() << "LF_CHECK did not throw";
  } catch (const lf::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("[rank 3]"), std::string::npos) << what;
    EXPECT_NE(what.find("tensor-model-parallel-size 3 does not divide world size 8"), std::string::npos);
    EXPECT_NE(what.find("tests/core/test_error_logging.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("HINT: choose a divisor"), std::string::npos) << what;
    EXPECT_EQ(e.hint(), "choose a divisor of the world size");
    EXPECT_EQ(e.file(), "tests/core/test_error_logging.cpp");
  }
  lf::set_diagnostic_rank(-1);
}

TEST(Error, CheckWithoutMessageNamesCondition) {
  try {
    LF_CHECK(1 + 1 == 3);
    FAIL();
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("check failed: 1 + 1 == 3"), std::string::npos) << e.what();
  }
}

TEST(Logging, RankPrefixAndFile) {
  auto dir = lf::testing::make_temp_dir("log");
  lf::log::Options o;
  o.rank = 2;
  o.world_size = 4;
  o.terminal = false;
  o.file = dir + "/rank2.log";
  lf::log::init(o);
  LF_INFO("hello ", 42);
  LF_DEBUG("not shown at info level");
  lf::log::flush();
  std::ifstream in(o.file);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("[rank 2] hello 42"), std::string::npos) << ss.str();
  EXPECT_EQ(ss.str().find("not shown"), std::string::npos);
  lf::log::init(lf::log::Options{});
}

TEST(Logging, UnknownLevelIsAnError) {
  EXPECT_THROW(lf::log::parse_level("verbose"), lf::Error);
}

}  // namespace

// main() of every LoongForge test binary: the gtest runner, or one rank of a multi-process
// worker case when LF_TEST_WORKER is set (tests/support/multiprocess.h).
#include <gtest/gtest.h>

#include <cstdlib>

namespace lf::testing {
int run_worker_main(int argc, char** argv);
void remove_temp_dirs();
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (std::getenv("LF_TEST_WORKER")) return lf::testing::run_worker_main(argc, argv);
  const int result = RUN_ALL_TESTS();
  if (result == 0) lf::testing::remove_temp_dirs();  // /tmp stays small over repeated runs
  return result;
}

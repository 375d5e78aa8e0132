// Modules (core/modules.h): FFmpeg and Arrow/Parquet are mapped only once a video or a parquet
// file is touched. A fresh process (a worker: this binary re-executed) checks /proc/self/maps
// before and after each first use; the values read back are checked too. And the errors a missing
// module gives.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "loongforge/core/error.h"
#include "loongforge/core/modules.h"
#include "loongforge/media/video.h"
#include "multiprocess.h"
#include "oracle_cache.h"
#include "parquet_table.h"

namespace lf {
namespace {

bool mapped(const std::string& library) {
  std::ifstream f("/proc/self/maps");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str().find(library) != std::string::npos;
}

LF_WORKER_CASE(modules_load_on_first_use) {
  for (const char* lib : {"libavcodec", "libavformat", "libloongforge_video", "libarrow", "libparquet",
                          "libloongforge_parquet_reader"})
    EXPECT_FALSE(mapped(lib)) << lib << " is mapped before anything needed it";

  const std::string dir = lf::testing::make_temp_dir("modules");
  std::vector<media::Image> frames(3);
  for (size_t i = 0; i < frames.size(); ++i) {
    frames[i].height = 4;
    frames[i].width = 6;
    frames[i].rgb.assign(4 * 6 * 3, static_cast<uint8_t>(40 * i));
  }
  media::write_video(frames, 5.0, dir + "/clip.mkv");
  media::VideoInfo info;
  const auto back = media::decode_video(dir + "/clip.mkv", &info);
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[2].rgb, frames[2].rgb);
  EXPECT_DOUBLE_EQ(info.fps, 5.0);
  EXPECT_TRUE(mapped("libloongforge_video.so"));
  EXPECT_TRUE(mapped("libavcodec"));
  EXPECT_FALSE(mapped("libarrow")) << "a video loaded Arrow";

  const std::string file = dir + "/t.parquet";
  const auto made = lf::testing::run_command(
      {lf::testing::venv_python(), "-c",
       "import sys, pyarrow as pa, pyarrow.parquet as pq; "
       "pq.write_table(pa.table({'a': [3, 1, 2], 's': ['x', 'y', 'z']}), sys.argv[1])",
       file});
  // pyarrow is a build dependency (the reader module links its Arrow), so the .venv has it.
  ASSERT_TRUE(made.ok()) << "writing a parquet file with the project's .venv failed: " << made.output;
  const auto t = data::parquet::Table::read(file, "a test table");
  EXPECT_EQ(t.num_rows(), 3);
  EXPECT_TRUE(at::equal(t.tensor("a"), at::tensor({3, 1, 2}, at::kLong)));
  EXPECT_EQ(t.strings("s"), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_TRUE(mapped("libloongforge_parquet_reader.so"));
  EXPECT_TRUE(mapped("libarrow"));
  // Errors from inside the module reach the caller as lf::Error, naming the file.
  try {
    data::parquet::Table::read(dir + "/absent.parquet", "episode 7's data");
    ADD_FAILURE() << "read a missing file";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.parquet (episode 7's data) is missing"),
              std::string::npos) << e.what();
  }
  std::printf("modules loaded on first use\n");
}

TEST(Modules, FfmpegAndArrowAreMappedOnlyOnceAVideoOrParquetFileIsTouched) {
  auto res = lf::testing::run_workers("modules_load_on_first_use",
                                      {.world_size = 1, .timeout = std::chrono::seconds(60)});
  lf::testing::expect_all_ok(res);
  EXPECT_NE(res[0].output.find("modules loaded on first use"), std::string::npos) << res[0].output;
}

TEST(Modules, AMissingModuleOrSymbolIsAnErrorNamingTheFileAndItsUse) {
  try {
    module_symbol("libloongforge_no_such_module.so", "f", "testing the loader");
    FAIL() << "loaded a module that does not exist";
  } catch (const lf::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the module " + module_dir() + "/libloongforge_no_such_module.so (testing the "
                     "loader) is missing"), std::string::npos) << m;
    EXPECT_NE(m.find("HINT: it is built with the rest of LoongForge"), std::string::npos) << m;
  }
  try {
    module_symbol("libloongforge_video.so", "lf_no_such_symbol", "testing the loader");
    FAIL() << "found a symbol that does not exist";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lacks the symbol lf_no_such_symbol"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lf

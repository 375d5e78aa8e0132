// Internals shared by checkpoint.cpp (the job's protocol) and checkpoint_offline.cpp (conversion
// tools): file names, the temp directory and the commit. Not installed.
#pragma once

#include <csignal>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loongforge/train/checkpoint_format.h"

namespace lf::train::ckpt {

std::string model_file(int tp, int pp);
std::string optim_file(int tp, int pp, int dp);
// SAVE/iter_NNNNNNN.tmp
std::string temp_dir(const std::string& save_dir, int64_t iteration);
// Creates save_dir, removes leftovers of interrupted saves, creates the (empty) temp dir.
void prepare_save_dir(const std::string& save_dir, int64_t iteration);
// Writes the manifest of `files` (all in the temp dir), fsyncs, renames the temp dir to
// iter_NNNNNNN, updates the tracker, then applies keep-last-k.
void commit_checkpoint(const std::string& save_dir, int64_t iteration,
                       const std::map<std::string, FileRecord>& files, std::optional<int64_t> keep_last);
FileRecord write_file(const std::string& dir, const std::string& name, const std::vector<Entry>& entries);
// Test hook: LOONGFORGE_TEST_CKPT_CRASH_AT=N kills the process (SIGKILL) at the N-th point
// (0-based) a save passes: after each file, after the manifest, after the rename, after the tracker;
// on a job's first attempt only (LOONGFORGE_RESTART_COUNT unset or 0).
void test_crash_point(const char* what);
volatile std::sig_atomic_t& sigterm_flag();

}  // namespace lf::train::ckpt

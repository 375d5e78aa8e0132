// Internals shared by checkpoint.cpp (the job's protocol) and checkpoint_offline.cpp (conversion
// tools): file names, the temp directory and the commit. Not installed.
#pragma once

#include <csignal>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loongforge/train/checkpoint.h"
#include "loongforge/train/checkpoint_format.h"

namespace lf::train::ckpt {

// The files of parameter group `group` ("model": no infix).
std::string model_file(int tp, int pp, const std::string& group = "model");
std::string optim_file(int tp, int pp, int dp, const std::string& group = "model");
// Delayed FP8 scaling's histories and scales of a group's pipeline stage (TP/DP-replicated).
std::string fp8_file(int pp, const std::string& group = "model", int tp = 0);
// SAVE/iter_NNNNNNN.tmp
std::string temp_dir(const std::string& save_dir, int64_t iteration);
// Creates save_dir, removes leftovers of interrupted saves, creates the (empty) temp dir.
void prepare_save_dir(const std::string& save_dir, int64_t iteration);
// Writes the manifest of `files` (all in the temp dir), fsyncs, renames the temp dir to
// iter_NNNNNNN, updates the tracker, then applies keep-last-k.
void commit_checkpoint(const std::string& save_dir, int64_t iteration,
                       const std::map<std::string, FileRecord>& files, std::optional<int64_t> keep_last,
                       SaveHooks* hooks = nullptr);
FileRecord write_file(const std::string& dir, const std::string& name, const std::vector<Entry>& entries,
                      SaveHooks* hooks = nullptr);
// The save passed a point a test may stop at (hooks null: nothing).
inline void save_point(SaveHooks* hooks, const char* what) {
  if (hooks) hooks->at_save_point(what);
}
volatile std::sig_atomic_t& sigterm_flag();

}  // namespace lf::train::ckpt

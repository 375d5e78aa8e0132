// Modules: parts of LoongForge built as separate libraries beside libloongforge_core.so and loaded
// with dlopen the first time something needs them, so that a process pays for a heavy dependency
// (FFmpeg's codecs and everything they link, Arrow/Parquet) only when it decodes a video or reads
// a LeRobot parquet file. A model trainer that does neither maps none of them (~35 MiB of resident
// memory and ~130 libraries less; docs/performance.md).
#pragma once

#include <string>

namespace lf {

// The address of `symbol` in module `file` (a file name such as
// "libloongforge_parquet_reader.so", looked up in the directory of libloongforge_core.so), loading
// the module on first use; modules are never unloaded. Throws lf::Error naming the file, the
// loader's message and `needed_for` when the file is missing, does not load (a library it needs is
// absent) or lacks the symbol.
void* module_symbol(const std::string& file, const char* symbol, const std::string& needed_for);

// The directory modules are looked up in (that of libloongforge_core.so).
std::string module_dir();

}  // namespace lf

// On-disk cache of int64 index arrays (internal): <stem>.{doc,sample,shuffle}_index.bin beside a
// <stem>.description.json that names the parameters which shaped them. Not a general store.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lf::data {

// 16 hex digits of FNV-1a 64 over the description (collisions are harmless: load compares the
// stored description with the wanted one).
std::string description_hash(const std::string& description);

struct CachedIndices {
  std::vector<int64_t> doc, sample, shuffle;
};

// Loads when <stem>.description.json holds exactly `description` and all three arrays are whole;
// false otherwise (a mismatch or a damaged array is rebuilt, not trusted).
bool load_cached_indices(const std::string& stem, const std::string& description,
                         CachedIndices& out);
// Writes the arrays, then the description, each to a temporary name renamed into place, so a
// reader in another process sees all or nothing. False (with a warning) if the directory is not
// writable.
bool save_cached_indices(const std::string& stem, const std::string& description,
                         const CachedIndices& indices);

}  // namespace lf::data

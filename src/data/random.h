// The data layer's documented randomness (internal): std::mt19937_64 streams, an unbiased bounded
// draw (Lemire's multiply-shift with rejection) and Fisher-Yates. Unlike std::shuffle and
// std::uniform_int_distribution these give the same permutation with every standard library.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace lf::data {

// Uniform in [0, n), n > 0.
inline uint64_t bounded_draw(std::mt19937_64& rng, uint64_t n) {
  unsigned __int128 m = static_cast<unsigned __int128>(rng()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(rng()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

// Shuffles v[begin, end) in place: for i from the end down, swap v[i] with v[begin + draw(i+1)].
template <class T>
void fisher_yates(std::vector<T>& v, size_t begin, size_t end, std::mt19937_64& rng) {
  for (size_t n = end - begin; n > 1; --n) {
    size_t j = static_cast<size_t>(bounded_draw(rng, n));
    std::swap(v[begin + n - 1], v[begin + j]);
  }
}

}  // namespace lf::data

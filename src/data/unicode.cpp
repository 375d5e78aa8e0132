// UTF-8 decoding/encoding, lossy repair, and NFC (decompose, canonical order, compose).
#include "unicode.h"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace lf::data::unicode {
namespace {

struct CombiningRange { uint32_t first, last; uint8_t ccc; };
struct Decomposition { uint32_t cp; uint32_t offset; uint8_t count; };
struct Composition { uint32_t first, second, composite; };
struct CodeRange { uint32_t first, last; };
#include "unicode_tables.inc"

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t ccc(uint32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::upper_bound(std::begin(kCombiningClass), std::end(kCombiningClass), cp,
                             [](uint32_t c, const CombiningRange& r) { return c < r.first; });
  if (it == std::begin(kCombiningClass)) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

bool interesting(uint32_t cp) {
  if (cp < 0x300) return false;
  auto it = std::upper_bound(std::begin(kNfcInteresting), std::end(kNfcInteresting), cp,
                             [](uint32_t c, const CodeRange& r) { return c < r.first; });
  if (it == std::begin(kNfcInteresting)) return false;
  return cp <= (it - 1)->last;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  auto it = std::lower_bound(std::begin(kDecomposition), std::end(kDecomposition), cp,
                             [](const Decomposition& d, uint32_t c) { return d.cp < c; });
  if (it != std::end(kDecomposition) && it->cp == cp) {
    out.insert(out.end(), kDecompositionData + it->offset, kDecompositionData + it->offset + it->count);
  } else {
    out.push_back(cp);
  }
}

// The primary composite of (a, b), or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = std::lower_bound(std::begin(kComposition), std::end(kComposition), std::pair{a, b},
                             [](const Composition& c, std::pair<uint32_t, uint32_t> k) {
                               return c.first < k.first || (c.first == k.first && c.second < k.second);
                             });
  if (it != std::end(kComposition) && it->first == a && it->second == b) return it->composite;
  return 0;
}

// Length of the valid prefix of a UTF-8 sequence at s[i] (Unicode Table 3-7), and whether it is
// complete.
size_t valid_prefix(std::string_view s, size_t i, bool& complete) {
  unsigned char b0 = static_cast<unsigned char>(s[i]);
  complete = false;
  if (b0 < 0x80) return complete = true, 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
  else if (b0 == 0xE0) need = 2, lo = 0xA0;
  else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) need = 2;
  else if (b0 == 0xED) need = 2, hi = 0x9F;
  else if (b0 == 0xF0) need = 3, lo = 0x90;
  else if (b0 >= 0xF1 && b0 <= 0xF3) need = 3;
  else if (b0 == 0xF4) need = 3, hi = 0x8F;
  else return 1;  // a lone continuation byte or an impossible lead byte
  size_t n = 1;
  for (int k = 0; k < need; ++k, ++n) {
    if (i + n >= s.size()) return n;
    unsigned char b = static_cast<unsigned char>(s[i + n]);
    if (b < (k == 0 ? lo : 0x80) || b > (k == 0 ? hi : 0xBF)) return n;
  }
  complete = true;
  return n;
}

}  // namespace

bool decode_utf8(std::string_view s, size_t& i, uint32_t& cp) {
  bool complete;
  size_t n = valid_prefix(s, i, complete);
  if (!complete) return false;
  unsigned char b0 = static_cast<unsigned char>(s[i]);
  if (n == 1) cp = b0;
  else if (n == 2) cp = (b0 & 0x1Fu) << 6 | (s[i + 1] & 0x3F);
  else if (n == 3) cp = (b0 & 0x0Fu) << 12 | (s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F);
  else cp = (b0 & 0x07u) << 18 | (s[i + 1] & 0x3F) << 12 | (s[i + 2] & 0x3F) << 6 | (s[i + 3] & 0x3F);
  i += n;
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | cp >> 6);
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | cp >> 12);
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | cp >> 18);
    out += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t find_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) { ++i; continue; }
    bool complete;
    size_t n = valid_prefix(s, i, complete);
    if (!complete) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    bool complete;
    size_t n = valid_prefix(s, i, complete);
    if (complete) out.append(s.substr(i, n));
    else out += "\xEF\xBF\xBD";
    i += n;
  }
  return out;
}

bool nfc_unchanged(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0xCC) {  // every code point below U+0300
      i += static_cast<unsigned char>(s[i]) < 0x80 ? 1 : 2;
      continue;
    }
    uint32_t cp;
    if (!decode_utf8(s, i, cp)) return false;
    if (interesting(cp)) return false;
  }
  return true;
}

namespace {

// NFC of one segment: a starter that NFC leaves alone followed by code points it may change.
void nfc_segment(std::string_view s, std::string& out) {
  std::vector<uint32_t> d;
  d.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    if (!decode_utf8(s, i, cp)) cp = 0xFFFD, ++i;
    decompose(cp, d);
  }
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (ccc(d[i]) == 0) { ++i; continue; }
    size_t j = i;
    while (j < d.size() && ccc(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + static_cast<std::ptrdiff_t>(i), d.begin() + static_cast<std::ptrdiff_t>(j),
                     [](uint32_t a, uint32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  // Composition: each character joins the last starter unless blocked by an intervening
  // character of equal or higher class (or any starter).
  std::vector<uint32_t> r;
  r.reserve(d.size());
  std::ptrdiff_t starter = -1;
  int last_ccc = 0;
  for (uint32_t c : d) {
    int cc = ccc(c);
    if (starter >= 0) {
      bool adjacent = static_cast<std::ptrdiff_t>(r.size()) - 1 == starter;
      if (adjacent || (last_ccc != 0 && last_ccc < cc)) {
        if (uint32_t comp = compose(r[static_cast<size_t>(starter)], c)) {
          r[static_cast<size_t>(starter)] = comp;
          continue;
        }
      }
    }
    if (cc == 0) starter = static_cast<std::ptrdiff_t>(r.size());
    last_ccc = cc;
    r.push_back(c);
  }
  for (uint32_t c : r) append_utf8(out, c);
}

}  // namespace

// A code point NFC never changes and that nothing before it composes with (ccc 0, no
// decomposition, never the second of a pair) starts a new normalisation segment, so only the
// segments holding "interesting" code points need work; the rest is copied.
std::string nfc(std::string_view s) {
  std::vector<NfcPiece> pieces;
  return nfc_aligned(s, pieces);
}

std::string nfc_aligned(std::string_view s, std::vector<NfcPiece>& pieces) {
  std::string out;
  out.reserve(s.size() + 16);
  pieces.clear();
  size_t copied = 0, seg = 0;  // seg: start of the last stable code point
  auto copy_to = [&](size_t end) {
    if (end > copied) pieces.push_back({out.size(), copied, end, true});
    out.append(s.substr(copied, end - copied));
  };
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    uint32_t cp;
    if (!decode_utf8(s, i, cp)) cp = 0xFFFD, i = at + 1;
    if (!interesting(cp)) {
      seg = at;
      continue;
    }
    size_t end = i;  // extend over the run of interesting code points
    while (end < s.size()) {
      size_t k = end;
      uint32_t c2;
      if (!decode_utf8(s, k, c2)) c2 = 0xFFFD, k = end + 1;
      if (!interesting(c2)) break;
      end = k;
    }
    size_t begin = std::max(seg, copied);
    copy_to(begin);
    pieces.push_back({out.size(), begin, end, false});
    nfc_segment(s.substr(begin, end - begin), out);
    copied = seg = i = end;
  }
  copy_to(s.size());
  return out;
}

size_t decomposition_length(uint32_t cp) {
  std::vector<uint32_t> d;
  decompose(cp, d);
  if (d.size() == 1 && d[0] == cp) return 1;
  size_t n = 0;
  for (uint32_t c : d) n += decomposition_length(c);  // the table's entries may decompose further
  return n;
}

size_t nfc_input_offset(const std::vector<NfcPiece>& pieces, size_t out, bool at_end) {
  // The piece holding `out`: the last that starts at or before it (for an end offset, before it).
  auto it = at_end ? std::lower_bound(pieces.begin(), pieces.end(), out,
                                      [](const NfcPiece& p, size_t o) { return p.out_begin < o; })
                   : std::upper_bound(pieces.begin(), pieces.end(), out,
                                      [](size_t o, const NfcPiece& p) { return o < p.out_begin; });
  if (it == pieces.begin()) return 0;
  const NfcPiece& p = *(it - 1);
  if (p.copied) return p.in_begin + (out - p.out_begin);
  return at_end ? p.in_end : p.in_begin;
}

}  // namespace lf::data::unicode

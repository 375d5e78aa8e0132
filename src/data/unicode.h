// UTF-8 helpers and Unicode NFC for the tokenizers (internal). Tables come from
// tools/data/gen_unicode_tables.py (Unicode version in unicode_tables.inc). Not a general
// Unicode library: only what tokenizer.json byte-level BPE needs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lf::data::unicode {

// Decodes the code point at s[i] and advances i; false (i unchanged) on invalid UTF-8.
bool decode_utf8(std::string_view s, size_t& i, uint32_t& cp);
void append_utf8(std::string& out, uint32_t cp);
// Offset of the first byte that is not valid UTF-8, or npos.
size_t find_invalid_utf8(std::string_view s);
// Invalid sequences become U+FFFD, one per maximal subpart (Rust's String::from_utf8_lossy).
std::string utf8_lossy(std::string_view s);

// True when s is certainly NFC without work (no code point that NFC could change).
bool nfc_unchanged(std::string_view s);
// The number of code points in cp's full canonical decomposition (1 when it has none).
size_t decomposition_length(uint32_t cp);
// Canonical composition (NFC) of valid UTF-8 s.
std::string nfc(std::string_view s);

// NFC with an alignment to the input: the result is cut into pieces, each either copied from
// the input byte for byte or the normalization of one input run (which then maps as a whole).
struct NfcPiece {
  size_t out_begin, in_begin, in_end;
  bool copied;
};
std::string nfc_aligned(std::string_view s, std::vector<NfcPiece>& pieces);
// Input byte offset of output offset `out`; inside a normalized run, the run's start (or its end
// for an end offset, at_end).
size_t nfc_input_offset(const std::vector<NfcPiece>& pieces, size_t out, bool at_end);

}  // namespace lf::data::unicode

// Sizes as people write them: "40GiB", "1.5GB", "4096", or a share of a
// total known only later ("60%" of the device's memory). One parser for every
// SPILLWAY_* size and every tool's size option.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace spillway {

// A size given as bytes or as a fraction of a total known only later
// (device or host memory).
struct SizeSpec {
  uint64_t bytes = 0;
  double fraction = 0;  // > 0: a percentage was given
  bool set = false;
  uint64_t resolve(uint64_t total) const {
    return fraction > 0 ? static_cast<uint64_t>(static_cast<double>(total) * fraction) : bytes;
  }
};

// Bytes with an optional binary (KiB..TiB) or decimal (KB..TB) unit;
// nullopt for anything else, fractional bytes, or more than 2^64.
std::optional<uint64_t> parse_bytes(const std::string& text);
// The smallest percentage accepted: 0.0001% of a 1 GiB device is 1073 bytes.
inline constexpr double kMinPercent = 0.0001;
// A percentage in [kMinPercent, 100] followed by '%', or bytes as parse_bytes.
std::optional<SizeSpec> parse_size_or_percent(const std::string& text);
// The length of the leading decimal number of `text` ("12.5" of "12.5GiB"),
// its value in *value; 0 if there is none.
size_t decimal_prefix(const std::string& text, double* value);
// Bytes as a person reads them: "512 B", "4.0 KiB", "12.3 MiB", "40.0 GiB".
std::string format_bytes(uint64_t bytes);

}  // namespace spillway

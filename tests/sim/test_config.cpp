// SIMCUDA_* parsing: accepted forms and refusals naming the variable.
#include <gtest/gtest.h>

#include <cstdlib>

#include "config.h"

using sim::parse_size;

TEST(SimConfig, ParsesSizes) {
  EXPECT_EQ(80ull << 30, parse_size("80GiB"));
  EXPECT_EQ(512ull << 20, parse_size("512MiB"));
  EXPECT_EQ(1500000000ull, parse_size("1.5GB"));
  EXPECT_EQ(4096ull, parse_size("4096"));
  EXPECT_FALSE(parse_size("").has_value());
  EXPECT_FALSE(parse_size("-1GiB").has_value());
  EXPECT_FALSE(parse_size("12 parsecs").has_value());
  EXPECT_FALSE(parse_size("0.3B").has_value());
}

TEST(SimConfig, RefusesBadValueNamingTheVariable) {
  setenv("SIMCUDA_DEVICE_MEMORY", "lots", 1);
  std::string err;
  EXPECT_FALSE(sim::load_config(&err).has_value());
  EXPECT_NE(std::string::npos, err.find("SIMCUDA_DEVICE_MEMORY='lots'")) << err;
  unsetenv("SIMCUDA_DEVICE_MEMORY");
}

TEST(SimConfig, RefusesUnknownVariable) {
  setenv("SIMCUDA_DEVICE_MEMROY", "1GiB", 1);
  std::string err;
  EXPECT_FALSE(sim::load_config(&err).has_value());
  EXPECT_NE(std::string::npos, err.find("SIMCUDA_DEVICE_MEMROY")) << err;
  unsetenv("SIMCUDA_DEVICE_MEMROY");
}

TEST(SimConfig, ReadsOverrides) {
  setenv("SIMCUDA_H2D_GBPS", "25", 1);
  setenv("SIMCUDA_DEVICE_COUNT", "2", 1);
  std::string err;
  auto c = sim::load_config(&err);
  ASSERT_TRUE(c.has_value()) << err;
  EXPECT_DOUBLE_EQ(25.0, c->h2d_bytes_per_ns);
  EXPECT_EQ(2, c->device_count);
  unsetenv("SIMCUDA_H2D_GBPS");
  unsetenv("SIMCUDA_DEVICE_COUNT");
}

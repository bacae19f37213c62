// SIMCUDA_* parsing: accepted forms and refusals naming the variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

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

// A value with control characters is quoted escaped: the refusal stays one
// line (found by fuzz_sim_config: a newline carried into the message).
TEST(SimConfig, ARefusalQuotesControlCharactersEscaped) {
  setenv("SIMCUDA_FAULT_GBPS", "2\n;\x08", 1);
  std::string err;
  EXPECT_FALSE(sim::load_config(&err).has_value());
  unsetenv("SIMCUDA_FAULT_GBPS");
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_NE(err.find("SIMCUDA_FAULT_GBPS='2\\x0a;\\x08' is not valid"), std::string::npos) << err;
  setenv("SIMCUDA_CALL_NS", "cuMemMap:1\r", 1);
  EXPECT_FALSE(sim::load_config(&err).has_value());
  unsetenv("SIMCUDA_CALL_NS");
  EXPECT_NE(err.find("item 'cuMemMap:1\\x0d'"), std::string::npos) << err;
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

TEST(SimConfig, ParsesNanoseconds) {
  EXPECT_EQ(500u, sim::parse_ns("500"));
  EXPECT_EQ(500u, sim::parse_ns("500ns"));
  EXPECT_EQ(20000u, sim::parse_ns("20us"));
  EXPECT_EQ(3000000u, sim::parse_ns("3ms"));
  EXPECT_EQ(1000000000u, sim::parse_ns("1000ms"));
  EXPECT_EQ(0u, sim::parse_ns("0"));
  EXPECT_FALSE(sim::parse_ns("").has_value());
  EXPECT_FALSE(sim::parse_ns("us").has_value());
  EXPECT_FALSE(sim::parse_ns("-1").has_value());
  EXPECT_FALSE(sim::parse_ns("1.5us").has_value());
  EXPECT_FALSE(sim::parse_ns("20 us").has_value());
  EXPECT_FALSE(sim::parse_ns("20s").has_value());
  EXPECT_FALSE(sim::parse_ns("1001ms").has_value());  // above 1 s
  EXPECT_FALSE(sim::parse_ns("99999999999").has_value());
}

TEST(SimConfig, ReadsCallCosts) {
  setenv("SIMCUDA_CALL_NS", "cuMemMap:20us,cuMemcpyHtoDAsync_v2:700", 1);
  setenv("SIMCUDA_VMM_NS", "15us", 1);
  std::string err;
  auto c = sim::load_config(&err);
  unsetenv("SIMCUDA_CALL_NS");
  unsetenv("SIMCUDA_VMM_NS");
  ASSERT_TRUE(c.has_value()) << err;
  ASSERT_EQ(2u, c->call_ns.size());
  EXPECT_EQ("cuMemMap", c->call_ns[0].first);
  EXPECT_EQ(20000u, c->call_ns[0].second);
  EXPECT_EQ("cuMemcpyHtoDAsync_v2", c->call_ns[1].first);
  EXPECT_EQ(700u, c->call_ns[1].second);
  EXPECT_EQ(15000u, c->vmm_ns);
  EXPECT_EQ(500u, c->api_ns);  // the defaults stay
}

TEST(SimConfig, RefusesBadCallCosts) {
  for (const char* bad : {"cuMemMap", ":20us", "cuMemMap:", "cuMemMap:fast", "cuMemMap:1us,,"}) {
    setenv("SIMCUDA_CALL_NS", bad, 1);
    std::string err;
    EXPECT_FALSE(sim::load_config(&err).has_value()) << bad;
    EXPECT_NE(std::string::npos, err.find(std::string("SIMCUDA_CALL_NS='") + bad + "'")) << err;
    EXPECT_NE(std::string::npos, err.find("accepted:")) << err;
  }
  unsetenv("SIMCUDA_CALL_NS");
  setenv("SIMCUDA_VMM_NS", "20 us", 1);
  std::string err;
  EXPECT_FALSE(sim::load_config(&err).has_value());
  EXPECT_NE(std::string::npos, err.find("SIMCUDA_VMM_NS='20 us'")) << err;
  unsetenv("SIMCUDA_VMM_NS");
}

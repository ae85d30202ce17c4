// Units of the HTTP transport (placeholder until the suite lands).
#include <gtest/gtest.h>

#include "transport/http.hpp"

TEST(HttpLoopback, RecognisesLoopbackNames) {
  EXPECT_TRUE(nshpc::transport::is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(nshpc::transport::is_loopback_host("localhost"));
  EXPECT_TRUE(nshpc::transport::is_loopback_host("[::1]"));
  EXPECT_FALSE(nshpc::transport::is_loopback_host("0.0.0.0"));
  EXPECT_FALSE(nshpc::transport::is_loopback_host("example.com"));
}

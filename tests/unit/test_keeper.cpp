// The job keeper's command line and the documents it adds to bwrap's status stream.
#include <gtest/gtest.h>

#include "base/error.hpp"
#include "sandbox/keeper.hpp"
#include "sandbox/status.hpp"

using namespace nshpc;
using namespace nshpc::sandbox;

TEST(KeeperArgv, RoundTripsAndKeepsBwrapsArgvWordForWord) {
  KeeperOptions in;
  in.status_fd = 3;
  in.time_limit = std::chrono::milliseconds(2000);
  in.grace = std::chrono::milliseconds(1000);
  in.bwrap_argv = {"/usr/bin/bwrap", "--die-with-parent", "--", "/bin/sh", "-c", "echo -- --grace-ms 5", ""};
  in.join_init = 42;
  in.join_pid_ns = 4026531836;
  in.join_cwd = "/workspace";
  in.keep_caps = 0xa80405fb;  // an image instance's job keeps its capabilities inside
  in.audit_fd = 14;
  in.instance_id = "calm-otter-3f2a";
  const auto argv = keeper_argv("/opt/ns-hpc", in);
  EXPECT_EQ(argv[0], "/opt/ns-hpc");
  EXPECT_EQ(argv[1], "__keeper");
  const KeeperOptions out = parse_keeper_argv(argv);
  EXPECT_EQ(out.status_fd, 3);
  EXPECT_EQ(out.time_limit.count(), 2000);
  EXPECT_EQ(out.grace.count(), 1000);
  EXPECT_EQ(out.bwrap_argv, in.bwrap_argv);
  EXPECT_EQ(out.join_init, 42);
  EXPECT_EQ(out.keep_caps, 0xa80405fbU);
  EXPECT_EQ(out.audit_fd, 14);
  EXPECT_EQ(out.instance_id, "calm-otter-3f2a");
}

TEST(KeeperArgv, RefusesWhatItDidNotWrite) {
  EXPECT_THROW(parse_keeper_argv({"ns-hpc", "run"}), UsageError);
  EXPECT_THROW(parse_keeper_argv({"ns-hpc", "__keeper", "--status-fd", "3", "--"}), UsageError);  // no bwrap
  EXPECT_THROW(parse_keeper_argv({"ns-hpc", "__keeper", "--time-limit-ms", "-1", "--", "bwrap"}), UsageError);
  EXPECT_THROW(parse_keeper_argv({"ns-hpc", "__keeper", "--status-fd", "x", "--", "bwrap"}), UsageError);
  EXPECT_THROW(parse_keeper_argv({"ns-hpc", "__keeper", "--bogus", "1", "--", "bwrap"}), UsageError);
  EXPECT_THROW(parse_keeper_argv({"ns-hpc", "__keeper", "--", "bwrap"}), UsageError);  // no status fd
}

TEST(StatusStream, ReadsTheKeepersDocumentsBetweenBwraps) {
  StatusStream s;
  s.feed("{\"ns-hpc-keeper\": 41, \"time-limit-ms\": 2000, \"grace-ms\": 1000}\n");
  s.feed("{ \"child-pid\": 42, \"pid-namespace\": 4026532000 }\n");
  EXPECT_TRUE(s.keeper());
  EXPECT_FALSE(s.deadline_reached());
  s.feed("{\"ns-hpc-deadline\": 1700000002000}\n{ \"exit-code\": 143 }\n{\"ns-hpc-ended\": 1700000002500}\n");
  EXPECT_EQ(s.child_pid(), 42);
  EXPECT_EQ(s.exit_code(), 143);
  ASSERT_TRUE(s.deadline_reached());
  ASSERT_TRUE(s.ended());
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::milliseconds>(*s.ended() - *s.deadline_reached()).count(), 500);
  EXPECT_FALSE(s.malformed());
}

TEST(StatusStream, WithoutAKeeperNothingOfItsIsMadeUp) {
  StatusStream s;
  s.feed("{ \"child-pid\": 42, \"pid-namespace\": 4026532000 }\n{ \"exit-code\": 0 }\n");
  EXPECT_FALSE(s.keeper());
  EXPECT_FALSE(s.deadline_reached());
  EXPECT_FALSE(s.ended());
}

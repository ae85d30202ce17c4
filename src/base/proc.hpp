// What /proc/<pid>/stat and /proc/<pid>/cmdline say about one process: the one reader of each for
// new code (the older readers in sandbox/members.cpp, sandbox/execution.cpp, sandbox/join.cpp and
// sandbox/network.cpp predate it).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nshpc::proc {

struct Stat {
  char state = 0;                // field 3: R, S, D, T, t, Z (zombie), X (dead), I, P...
  pid_t ppid = 0;                // field 4
  std::uint64_t start_time = 0;  // field 22: clock ticks after boot, with the pid its identity
  // A zombie waiting to be reaped, or a dead process: it keeps its pid and start time until its
  // parent reaps it (forever when that parent is an init that reaps nothing), yet runs nothing.
  bool ended() const { return state == 'Z' || state == 'X'; }
};

// The line's fields after "pid (comm)" (comm may hold spaces and parentheses: everything up to the
// last ')' is skipped); nullopt when the line is not one.
std::optional<Stat> parse_stat(std::string_view line);

// /proc/<pid>/stat of `pid`; nullopt when there is no such process (or its line is unreadable).
std::optional<Stat> read_stat(pid_t pid);

// The arguments of `pid` (argv[0] first; a process may rewrite them, so a caller that trusts them
// reads them while a pidfd says the process it means still runs); none when it is gone, or a
// kernel thread.
std::vector<std::string> read_cmdline(pid_t pid);

}  // namespace nshpc::proc

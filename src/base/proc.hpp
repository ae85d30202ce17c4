// What /proc says about one process: its stat line, its memory (statm), its arguments (cmdline)
// and its children. The one reader of each: nothing else in the tree opens these files.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nshpc::proc {

struct Stat {
  std::string comm;              // field 2, without its parentheses (the process chose it: untrusted)
  char state = 0;                // field 3: R, S, D, T, t, Z (zombie), X (dead), I, P...
  pid_t ppid = 0;                // field 4
  std::uint64_t start_time = 0;  // field 22: clock ticks after boot, with the pid its identity
  // Fields 48 and 49: where the kernel keeps the process's arguments in its memory (0 when the
  // kernel does not say: before Linux 3.5, or not ours to see).
  std::uint64_t arg_start = 0, arg_end = 0;
  // A zombie waiting to be reaped, or a dead process: it keeps its pid and start time until its
  // parent reaps it (forever when that parent is an init that reaps nothing), yet runs nothing.
  bool ended() const { return state == 'Z' || state == 'X'; }
};

// A stat line: "pid (comm) state ppid ...". comm may hold spaces, parentheses and newlines, so the
// fields are read after the last ')'. nullopt when the line is not one (no "(...)", fewer than 22
// fields, a field used here that is not a number).
std::optional<Stat> parse_stat(std::string_view line);

// /proc/<pid>/stat of `pid`; nullopt when there is no such process (or none this process may see).
// Throws SysError on any other failure to read it.
std::optional<Stat> read_stat(pid_t pid);
// /proc/self/stat: this process, whatever pid namespace /proc belongs to.
std::optional<Stat> read_own_stat();

// /proc/<pid>/statm, in pages.
struct Statm {
  std::uint64_t size = 0;      // the whole address space
  std::uint64_t resident = 0;  // in memory now
  std::uint64_t resident_bytes() const;
};
std::optional<Statm> parse_statm(std::string_view line);
// nullopt when the process is gone (or its memory is not ours to see).
std::optional<Statm> read_statm(pid_t pid);

// The arguments of `pid` (argv[0] first; a process may rewrite them, so a caller that trusts them
// reads them while a pidfd says the process it means still runs); none when it is gone, or a
// kernel thread.
std::vector<std::string> read_cmdline(pid_t pid);

// The children of `pid`'s main thread (/proc/<pid>/task/<pid>/children); none when it is gone.
std::vector<pid_t> read_children(pid_t pid);

}  // namespace nshpc::proc

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/proc.hpp"
#include "base/process.hpp"
#include "base/random.hpp"
#include "base/scope.hpp"
#include "base/steps.hpp"
#include "base/log.hpp"
#include "base/spawn.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "base/users.hpp"
#include "common/temp_dir.hpp"

namespace fs = std::filesystem;
namespace timeutil = nshpc::timeutil;
namespace text = nshpc::text;

using nshpc::tests::TempDir;

TEST(Fs, AtomicWriteReplacesWholeFileAndLeavesNoTemporaries) {
  const TempDir tmp("nshpc-unit");
  const fs::path& dir = tmp.path();
  nshpc::fs::atomic_write(dir / "f.json", "first");
  nshpc::fs::atomic_write(dir / "f.json", "second");
  EXPECT_EQ(nshpc::fs::read_file(dir / "f.json").value(), "second");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

// What a keeper and the network helpers watch: their record's folder removed under them (rm -rf of
// the instance) is seen through the descriptor they hold, whatever happens to the path; renamed,
// it is still there.
TEST(Fs, RemovedSaysWhenAHeldFolderOrFileHasNoNameLeft) {
  const TempDir tmp("nshpc-unit");
  const fs::path& dir = tmp.path();
  fs::create_directories(dir / "inst/status");
  std::ofstream(dir / "inst/status/sandbox.status") << "{}";
  const nshpc::UniqueFd folder = nshpc::fs::open_dir_path(dir / "inst/status");
  const nshpc::UniqueFd file(::open((dir / "inst/status/sandbox.status").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(file);
  EXPECT_FALSE(nshpc::fs::removed(folder.get()));
  EXPECT_FALSE(nshpc::fs::removed(file.get()));
  fs::rename(dir / "inst", dir / "moved");
  EXPECT_FALSE(nshpc::fs::removed(folder.get()));
  fs::remove_all(dir / "moved");
  EXPECT_TRUE(nshpc::fs::removed(folder.get()));
  EXPECT_TRUE(nshpc::fs::removed(file.get()));
}

TEST(Proc, ReadCmdlineGivesEveryArgumentEmptyOnesIncluded) {
  nshpc::SpawnSpec spec;
  // A shell that stays (GNU sleep refuses an empty argument and exits at once, which a loaded
  // machine showed before the read); its loop's children last a second at most.
  spec.program = "/bin/sh";
  spec.argv = {"sh", "-c", "while :; do sleep 1; done", "sh", ""};
  nshpc::SpawnedChild child = nshpc::spawn(spec);
  // spawn() returns once the exec closed its pipe, which the kernel does just before it sets up
  // the new program's arguments: until then the command line reads empty.
  std::vector<std::string> cmdline;
  for (int i = 0; i < 500 && cmdline.empty(); ++i) {
    cmdline = nshpc::proc::read_cmdline(child.pid());
    if (cmdline.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(cmdline, (std::vector<std::string>{"sh", "-c", "while :; do sleep 1; done", "sh", ""}));
  ::kill(child.pid(), SIGKILL);
  child.wait("sh");
  EXPECT_TRUE(nshpc::proc::read_cmdline(child.pid()).empty());
}

// A stat line with `comm`, fields 3.. as given, then zeros up to field `fields`.
std::string stat_line(const std::string& comm, const std::string& from_state, int given_up_to, int fields) {
  std::string line = "4242 (" + comm + ") " + from_state;
  for (int field = given_up_to + 1; field <= fields; ++field) line += " " + std::to_string(field == 22 ? 123456 : 0);
  return line + "\n";
}

// comm is whatever the process named itself (prctl PR_SET_NAME, or its file name): spaces,
// parentheses and newlines included. Only what comes after the last ')' is fields.
TEST(Proc, TheStatLineIsReadPastAHostileCommandName) {
  for (const std::string comm : {"a) Z 1 (x", "sleep 9) R 1", ")", "((", "two\nlines) X 7", "", "a b c"}) {
    const std::optional<nshpc::proc::Stat> stat = nshpc::proc::parse_stat(stat_line(comm, "S 77", 4, 52));
    ASSERT_TRUE(stat) << comm;
    EXPECT_EQ(stat->comm, comm);
    EXPECT_EQ(stat->state, 'S') << comm;
    EXPECT_EQ(stat->ppid, 77) << comm;
    EXPECT_EQ(stat->start_time, 123456u) << comm;
    EXPECT_FALSE(stat->ended()) << comm;
  }
}

TEST(Proc, AStatLineCutShortOrMalformedIsNoStat) {
  using nshpc::proc::parse_stat;
  EXPECT_FALSE(parse_stat(""));
  EXPECT_FALSE(parse_stat("no parenthesis"));
  EXPECT_FALSE(parse_stat("4242 (sleep"));                     // cut inside comm
  EXPECT_FALSE(parse_stat("4242 (sleep)"));                    // nothing after it
  EXPECT_FALSE(parse_stat("4242 (sleep) S 1 2 3"));            // cut before the start time
  EXPECT_FALSE(parse_stat(stat_line("sleep", "S 1", 4, 21)));  // one field short
  EXPECT_FALSE(parse_stat(stat_line("sleep", "SS 1", 4, 52))); // a state of two letters
  EXPECT_FALSE(parse_stat(stat_line("sleep", "S 1x", 4, 52)));  // ppid not a number
  EXPECT_FALSE(parse_stat(stat_line("sleep", "S  1", 4, 52)));  // an empty field
  // The start time not a number: the line is not one.
  std::string line = "4242 (sleep) S 1";
  for (int field = 5; field <= 21; ++field) line += " 0";
  EXPECT_FALSE(parse_stat(line + " 12z 0 0"));
  // An older kernel's line (no argument area, 44 fields) is one, its argument area unknown.
  const auto old = parse_stat(stat_line("sleep", "Z 1", 4, 44));
  ASSERT_TRUE(old);
  EXPECT_TRUE(old->ended());
  EXPECT_EQ(old->arg_start, 0u);
  // Fields 48 and 49: where the arguments are.
  std::string full = "1 (init) S 0";
  for (int field = 5; field <= 47; ++field) full += " 0";
  const auto with_args = parse_stat(full + " 140737488351000 140737488351100 0 0 0\n");
  ASSERT_TRUE(with_args);
  EXPECT_EQ(with_args->arg_start, 140737488351000u);
  EXPECT_EQ(with_args->arg_end, 140737488351100u);
}

TEST(Proc, StatmIsReadInPagesAndCutShortIsNone) {
  const auto statm = nshpc::proc::parse_statm("2000 300 100 10 0 500 0\n");
  ASSERT_TRUE(statm);
  EXPECT_EQ(statm->size, 2000u);
  EXPECT_EQ(statm->resident, 300u);
  EXPECT_EQ(statm->resident_bytes(), 300u * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)));
  EXPECT_FALSE(nshpc::proc::parse_statm(""));
  EXPECT_FALSE(nshpc::proc::parse_statm("2000"));
  EXPECT_FALSE(nshpc::proc::parse_statm("2000 x 1"));
  EXPECT_FALSE(nshpc::proc::parse_statm("-1 3 1"));
}

// The real files: a child's stat, memory, arguments and place among this process's children;
// this process's own argument area is where its argv is.
TEST(Proc, ARunningChildAsTheKernelDescribesIt) {
  nshpc::SpawnSpec spec;
  spec.program = "/bin/sleep";
  spec.argv = {"sleep", "30"};
  nshpc::SpawnedChild child = nshpc::spawn(spec);
  const auto stat = nshpc::proc::read_stat(child.pid());
  ASSERT_TRUE(stat);
  EXPECT_EQ(stat->comm, "sleep");
  EXPECT_EQ(stat->ppid, ::getpid());
  EXPECT_NE(stat->start_time, 0u);
  const auto statm = nshpc::proc::read_statm(child.pid());
  ASSERT_TRUE(statm);
  EXPECT_GT(statm->resident_bytes(), 0u);
  const std::vector<pid_t> children = nshpc::proc::read_children(::getpid());
  EXPECT_NE(std::find(children.begin(), children.end(), child.pid()), children.end());
  const auto own = nshpc::proc::read_own_stat();
  ASSERT_TRUE(own);
  ASSERT_GT(own->arg_end, own->arg_start);
  const std::string first(reinterpret_cast<const char*>(own->arg_start));  // argv[0], NUL-terminated
  EXPECT_EQ(first, nshpc::proc::read_cmdline(::getpid()).at(0));
  ::kill(child.pid(), SIGKILL);
  child.wait("sleep");
  EXPECT_FALSE(nshpc::proc::read_stat(child.pid()));
  EXPECT_FALSE(nshpc::proc::read_statm(child.pid()));
}

TEST(Fs, RemoveTreeNeverFollowsSymlinks) {
  const TempDir tmp("nshpc-unit"), victim_tmp("nshpc-unit");
  const fs::path& dir = tmp.path();
  const fs::path& victim = victim_tmp.path();
  std::ofstream(victim / "keep.txt") << "precious";
  fs::create_directories(dir / "tree/sub");
  std::ofstream(dir / "tree/sub/file") << "x";
  fs::create_directory_symlink(victim, dir / "tree/link-to-victim");
  fs::create_symlink(victim / "keep.txt", dir / "tree/sub/file-link");
  ::chmod((dir / "tree/sub").c_str(), 0);  // unreadable folder, as a sandbox could leave it
  ::chmod(victim.c_str(), 0555);             // a link to it stands where a folder could be
  nshpc::fs::remove_tree(dir / "tree");
  EXPECT_FALSE(fs::exists(dir / "tree"));
  EXPECT_TRUE(fs::exists(victim / "keep.txt"));
  EXPECT_EQ(fs::status(victim).permissions(), fs::perms(0555));
  ::chmod(victim.c_str(), 0700);
}

// The swap of issue 29: a folder the sandbox made 000 is made writable before it is emptied;
// if a link to one of the user's folders is swapped in just then, the mode must not land on that
// folder. Raced here as it was found: a thread exchanges t/x (a 000 folder) with t/l (a link to a
// 0555 folder outside) as fast as it can while remove_tree removes t, 2,000 times. As a normal
// user (root opens a 000 folder without changing its mode): as root, in a child that becomes
// uid 65534 and owns both.
TEST(Fs, RemoveTreeNeverChangesAModeThroughALinkSwappedInForAFolder) {
  const TempDir tmp("nshpc-unit");
  const fs::path base = tmp.path() / "base";
  const fs::path outside = tmp.path() / "outside";
  fs::create_directories(base);
  fs::create_directories(outside);
  std::ofstream(outside / "keep.txt") << "precious";
  const bool root = ::geteuid() == 0;
  if (root) {
    ASSERT_EQ(::chmod(tmp.path().c_str(), 0755), 0);
    ASSERT_EQ(::chown(base.c_str(), 65534, 65534), 0);
    ASSERT_EQ(::chown(outside.c_str(), 65534, 65534), 0);
  }
  ASSERT_EQ(::chmod(outside.c_str(), 0555), 0);
  const fs::path t = base / "t";
  const std::string x = (t / "x").string(), l = (t / "l").string();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (root && (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
                 ::setresuid(65534, 65534, 65534) != 0))
      ::_exit(3);
    std::atomic<bool> stop{false};
    std::thread swapper([&] {
      while (!stop.load(std::memory_order_relaxed))
        ::renameat2(AT_FDCWD, x.c_str(), AT_FDCWD, l.c_str(), RENAME_EXCHANGE);
    });
    int changed = 0;
    for (int round = 0; round < 2000 && !changed; ++round) {
      for (int tries = 0; fs::exists(fs::symlink_status(t)) && tries < 100; ++tries) {
        try {
          nshpc::fs::remove_tree(t);
        } catch (const nshpc::SysError&) {  // the swapper moved something meanwhile: again
        }
      }
      if (::mkdir(t.c_str(), 0755) != 0 || ::mkdir(x.c_str(), 0) != 0 || ::symlink(outside.c_str(), l.c_str()) != 0)
        continue;
      try {
        nshpc::fs::remove_tree(t);
      } catch (const nshpc::SysError&) {
        // a refusal is fine; what matters is the folder outside
      }
      struct stat st;
      if (::stat(outside.c_str(), &st) != 0 || (st.st_mode & 07777) != 0555) changed = 1;
    }
    stop = true;
    swapper.join();
    try {
      nshpc::fs::remove_tree(t);
    } catch (const nshpc::SysError&) {
    }
    ::_exit(changed);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  ASSERT_NE(WEXITSTATUS(status), 3) << "could not become uid 65534";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the folder outside the tree had its mode changed through a swapped-in link";
  struct stat st;
  ASSERT_EQ(::stat(outside.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0555u);
  EXPECT_EQ(nshpc::fs::read_file(outside / "keep.txt").value_or(""), "precious");
  ::chmod(outside.c_str(), 0755);
  if (fs::exists(t)) nshpc::fs::remove_tree(t);
}

TEST(Fs, ExpandsHomeAndVariables) {
  auto env = [](std::string_view name) -> std::optional<std::string> {
    if (name == "HOME") return "/home/ada";
    if (name == "SCRATCH") return "/scratch/ada";
    return std::nullopt;
  };
  EXPECT_EQ(nshpc::fs::expand_user_vars("~/x", env), "/home/ada/x");
  EXPECT_EQ(nshpc::fs::expand_user_vars("$SCRATCH/i", env), "/scratch/ada/i");
  EXPECT_EQ(nshpc::fs::expand_user_vars("${SCRATCH}x", env), "/scratch/adax");
  EXPECT_EQ(nshpc::fs::expand_user_vars("$MISSING/y", env), "/y");
  EXPECT_EQ(nshpc::fs::expand_user_vars("a~b$", env), "a~b$");
}

TEST(Time, IsoRoundTripWithMicroseconds) {
  auto now = timeutil::Clock::now();
  auto text = timeutil::iso_utc(now);
  ASSERT_EQ(text.size(), 32u) << text;
  auto parsed = timeutil::parse_iso(text);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::microseconds>(*parsed - now).count(), 0);
  EXPECT_TRUE(timeutil::parse_iso("2026-06-12T00:00:00Z"));
  EXPECT_TRUE(timeutil::parse_iso("2026-06-12T02:00:00+02:00"));
  EXPECT_EQ(*timeutil::parse_iso("2026-06-12T02:00:00+02:00"), *timeutil::parse_iso("2026-06-12T00:00:00Z"));
  EXPECT_FALSE(timeutil::parse_iso("yesterday"));
}

TEST(Text, ShellQuoteOnlyWhenNeeded) {
  EXPECT_EQ(text::shell_join({"ls", "-la", "my file", "it's"}), "ls -la 'my file' 'it'\\''s'");
  EXPECT_EQ(text::truncate_utf8("héllo", 2), "h…");
}

TEST(Text, SplitKeepsEmptyPiecesAndTrimCutsBothEnds) {
  using nshpc::text::split;
  EXPECT_EQ(split("a,,b", ','), (std::vector<std::string_view>{"a", "", "b"}));
  EXPECT_EQ(split("", ','), (std::vector<std::string_view>{""}));
  EXPECT_EQ(split("a,", ','), (std::vector<std::string_view>{"a", ""}));
  EXPECT_EQ(nshpc::text::trim("  x y \n"), "x y");
  EXPECT_EQ(nshpc::text::trim(" \t "), "");
  EXPECT_EQ(nshpc::text::trim("--x-", "-"), "x");
}

TEST(Text, Utf8LengthAndFirstInvalidByte) {
  using namespace nshpc::text;
  EXPECT_FALSE(find_invalid_utf8("plain \xC3\xA9t\xC3\xA9"));
  EXPECT_EQ(find_invalid_utf8("ab\xFF"), 2u);
  EXPECT_EQ(find_invalid_utf8("\xED\xA0\x80"), 0u);  // a UTF-16 surrogate
  EXPECT_EQ(utf8_length("\xC3\xA9t\xC3\xA9"), 3u);
  EXPECT_EQ(utf8_length("a\xFF\xFE"), 3u);
}

TEST(Text, CutMiddleKeepsHeadAndTailWithinTheCharacterBudget) {
  using namespace nshpc::text;
  auto marker = [](std::size_t n) { return "[cut " + std::to_string(n) + "]"; };
  EXPECT_EQ(cut_middle("short", 10, marker).text, "short");
  EXPECT_EQ(cut_middle("short", 10, marker).cut_chars, 0u);
  std::string lines;
  for (int i = 0; i < 1000; ++i) lines += std::to_string(i) + "\n";
  const MiddleCut c = cut_middle(lines, 200, marker);
  EXPECT_LE(utf8_length(c.text), 200u);
  EXPECT_EQ(c.text.rfind("0\n1\n2\n", 0), 0u);
  EXPECT_EQ(c.text.substr(c.text.size() - 4), "999\n");
  EXPECT_NE(c.text.find("\n[cut " + std::to_string(c.cut_chars) + "]\n"), std::string::npos) << c.text;
  EXPECT_EQ(utf8_length(lines), utf8_length(c.text) - utf8_length("[cut " + std::to_string(c.cut_chars) + "]\n") + c.cut_chars);
  // Characters, not bytes: 500 two-byte characters cut to 100 characters (more than 100 bytes).
  std::string accents;
  for (int i = 0; i < 500; ++i) accents += "\xC3\xA9";
  const MiddleCut a = cut_middle(accents, 100, marker);
  EXPECT_LE(utf8_length(a.text), 100u);
  EXPECT_GT(a.text.size(), 100u);
  EXPECT_FALSE(find_invalid_utf8(a.text));
}

TEST(Random, HexIsFreshEachTimeAndBelowStaysInRange) {
  const std::string a = nshpc::random::hex(16), b = nshpc::random::hex(16);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
  std::vector<int> seen(3);
  for (int i = 0; i < 300; ++i) ++seen.at(nshpc::random::below(3));
  for (int n : seen) EXPECT_GT(n, 0);
}

TEST(Text, SanitizeUtf8ReplacesOnlyInvalidSequences) {
  EXPECT_EQ(text::sanitize_utf8("plain ascii"), "plain ascii");
  EXPECT_EQ(text::sanitize_utf8("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80"), "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(text::sanitize_utf8("\xff ok"), "\xef\xbf\xbd ok");
  EXPECT_EQ(text::sanitize_utf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");   // overlong '/'
  EXPECT_EQ(text::sanitize_utf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate
  EXPECT_EQ(text::sanitize_utf8("cut \xe2\x82"), "cut \xef\xbf\xbd\xef\xbf\xbd");
}

TEST(Process, RunCommandCapturesBothStreamsAndTheExitCode) {
  const auto r = nshpc::run_command({"/bin/sh", "-c", "cat; echo err >&2; exit 3"}, "in\n");
  EXPECT_EQ(r.out, "in\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_FALSE(r.timed_out);
}

TEST(Process, AProgramThatDoesNotReadItsInputCannotKillTheCaller) {
  // Bigger than a pipe buffer: the write meets a closed pipe (EPIPE, no SIGPIPE for us).
  const auto r = nshpc::run_command({"/bin/sh", "-c", "exit 1"}, std::string(1 << 20, 'x'));
  EXPECT_EQ(r.exit_code, 1);
}

TEST(Process, AProgramThatClosesItsOutputButStaysIsKilledAtTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto r = nshpc::run_command({"/bin/sh", "-c", "exec >&- 2>&-; sleep 30"}, {}, std::chrono::milliseconds(300));
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(Process, AProgramThatCannotStartIsASysErrorWithItsErrno) {
  try {
    nshpc::run_command({"/nonexistent/program"});
    FAIL();
  } catch (const nshpc::SysError& e) {
    EXPECT_EQ(e.code(), ENOENT);
  }
}

TEST(Process, AChildSetupGivesDescriptorsAndRunsItsHookBeforeExec) {
  nshpc::Pipe given = nshpc::make_pipe();
  ASSERT_EQ(::write(given.write.get(), "from fd 3\n", 10), 10);
  given.write.reset();
  nshpc::ChildSetup setup;
  setup.fds = {{given.read.get(), 3}};
  // The hook runs in the child with its descriptors in place (stdout is the captured pipe).
  setup.in_child = [](const char**) { return ::write(1, "hook\n", 5) == 5 ? 0 : errno; };
  const auto r = nshpc::run_command({"/bin/sh", "-c", "cat <&3"}, {}, std::chrono::seconds(10), 1 << 20, {}, setup);
  EXPECT_EQ(r.out, "hook\nfrom fd 3\n");
  EXPECT_EQ(r.exit_code, 0);

  setup.in_child = [](const char** step) {
    *step = "join the test's namespace";
    return EPERM;
  };
  try {
    nshpc::run_command({"/bin/true"}, {}, std::chrono::seconds(10), 1 << 20, {}, setup);
    FAIL() << "a failed hook let the program run";
  } catch (const nshpc::SysError& e) {
    EXPECT_EQ(e.code(), EPERM);
    EXPECT_NE(std::string(e.what()).find("join the test's namespace"), std::string::npos) << e.what();
  }
  setup.fds = {{0, 1}};
  EXPECT_THROW(nshpc::run_command({"/bin/true"}, {}, std::chrono::seconds(10), 1 << 20, {}, setup), nshpc::Error);
}

TEST(Users, SandboxesDropToTheSandboxUidOnlyAsRootAndNeverToRoot) {
  const auto owner = nshpc::users::sandbox_owner(65534, 65533, true);
  ASSERT_TRUE(owner);
  EXPECT_EQ(owner->uid, 65534u);
  EXPECT_EQ(owner->gid, 65533u);
  EXPECT_FALSE(nshpc::users::sandbox_owner(65534, 65533, false));  // unprivileged: our own uid
  EXPECT_FALSE(nshpc::users::sandbox_owner(0, 0, true));           // root asked to stay root
}

TEST(Errors, AnErrorWrappedTwiceKeepsItsErrnoAndBothContexts) {
  try {
    try {
      try {
        nshpc::check_sys(-(errno = ENOENT, 1), "open", "/x/y");
      } catch (const nshpc::SysError& e) {
        throw e.wrapped("cannot open the instance's workspace folder");
      }
    } catch (const nshpc::SysError& e) {
      throw e.wrapped("could not start the sandbox");
    }
    FAIL();
  } catch (const nshpc::SysError& e) {
    EXPECT_EQ(e.code(), ENOENT);
    EXPECT_STREQ(e.what(), "could not start the sandbox: cannot open the instance's workspace folder: open /x/y: "
                           "No such file or directory");
  }
}

TEST(Text, FindAllAndReplaceAtReplaceEveryOccurrenceWithoutOverlaps) {
  using nshpc::text::find_all;
  using nshpc::text::replace_at;
  EXPECT_EQ(find_all("aaaa", "aa"), (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(find_all("héllo héllo", "héllo"), (std::vector<std::size_t>{0, 7}));
  EXPECT_TRUE(find_all("abc", "").empty());
  EXPECT_TRUE(find_all("abc", "x").empty());
  const std::string s = "one two one";
  EXPECT_EQ(replace_at(s, find_all(s, "one"), 3, "1"), "1 two 1");
  EXPECT_EQ(replace_at(s, {4}, 3, "three"), "one three one");
  EXPECT_EQ(replace_at(s, {}, 3, "x"), s);
  EXPECT_EQ(replace_at("aaaa", find_all("aaaa", "aa"), 2, ""), "");
}

// ---- rollbacks and the steps of a launch ----------------------------------------------------

TEST(RollbackOnFailure, UndoesOnlyWhenTheScopeIsLeftByAnError) {
  int undone = 0;
  {
    nshpc::RollbackOnFailure undo([&] { ++undone; });
  }
  EXPECT_EQ(undone, 0) << "a scope left normally keeps what was done";
  try {
    nshpc::RollbackOnFailure undo([&] { ++undone; });
    throw std::runtime_error("step failed");
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "step failed") << "the rollback keeps the error that caused it";
  }
  EXPECT_EQ(undone, 1);
  // A rollback that fails itself never replaces the error (nor terminates).
  try {
    nshpc::RollbackOnFailure undo([] { throw std::logic_error("rollback failed"); });
    throw std::runtime_error("step failed");
  } catch (const std::exception& e) {
    EXPECT_STREQ(e.what(), "step failed");
  }
  // Inside a handler of another error: only this scope's own failure counts.
  try {
    throw std::runtime_error("outer");
  } catch (const std::exception&) {
    nshpc::RollbackOnFailure undo([&] { ++undone; });
  }
  EXPECT_EQ(undone, 1);
}

namespace {

// What the log writes on stderr while `body` runs at `level`.
std::string stderr_of(nshpc::log::Level level, const std::function<void()>& body) {
  std::fflush(stderr);
  char path[] = "/tmp/nshpc-log-XXXXXX";
  const int file = ::mkstemp(path);
  const int saved = ::dup(2);
  ::dup2(file, 2);
  nshpc::log::set_level(level);
  body();
  nshpc::log::set_level(nshpc::log::Level::warning);
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(file);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ::unlink(path);
  return text;
}

}  // namespace

TEST(Steps, AtDebugEachStepAndTheTotalIsOneLineAndAFailureNamesItsStep) {
  const std::string ok = stderr_of(nshpc::log::Level::debug, [] {
    nshpc::Steps step("fresh", "alpha");
    step("command line");
    step("spawn");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    step.done();
  });
  EXPECT_NE(ok.find("fresh alpha: step command line "), std::string::npos) << ok;
  const auto spawn = ok.find("fresh alpha: step spawn ");
  ASSERT_NE(spawn, std::string::npos) << ok;
  EXPECT_GE(std::stod(ok.substr(spawn + 24)), 20.0) << ok;
  EXPECT_NE(ok.find("fresh alpha: total "), std::string::npos) << ok;

  const std::string failed = stderr_of(nshpc::log::Level::debug, [] {
    try {
      nshpc::Steps step("join", "beta");
      step("find sandbox");
      step("join");
      throw std::runtime_error("no");
    } catch (const std::exception&) {
    }
  });
  EXPECT_NE(failed.find("join beta: failed in step join after "), std::string::npos) << failed;
  EXPECT_EQ(failed.find("join beta: total"), std::string::npos) << failed;

  const std::string quiet = stderr_of(nshpc::log::Level::info, [] {
    nshpc::Steps step("fresh", "alpha");
    step("spawn");
  });
  EXPECT_EQ(quiet, "") << "nothing is measured or written below debug";
}

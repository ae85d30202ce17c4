// Test helpers shared by the unit and integration suites: a temporary folder owned by a scope,
// and writers forked side by side.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <gtest/gtest.h>

namespace nshpc::tests {

// A fresh folder below the temporary directory (mode 0700, named "<prefix>-XXXXXX"), removed with
// everything in it when the scope ends, also when an assertion failed.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "nshpc-test") {
    std::string templ = (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (!::mkdtemp(templ.data())) throw std::system_error(errno, std::generic_category(), "mkdtemp " + templ);
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Forks `count` children; child i runs body(i) and exits 0. Waits for all of them and fails the
// test (fatally: wrap the call in ASSERT_NO_FATAL_FAILURE) unless every one exited with status 0.
inline void run_in_children(int count, const std::function<void(int)>& body) {
  std::vector<pid_t> children;
  for (int i = 0; i < count; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << "fork: " << std::strerror(errno);
    if (pid == 0) {
      body(i);
      ::_exit(0);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = -1;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_EQ(status, 0) << "child " << pid;
  }
}

}  // namespace nshpc::tests

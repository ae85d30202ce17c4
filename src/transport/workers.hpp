// A pool of worker threads that grows on demand up to a limit: every accepted request gets a
// thread at once (a long wait never queues another call), and an idle server keeps few threads.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace nshpc::transport {

class Workers {
 public:
  explicit Workers(std::size_t max_threads) : max_threads_(max_threads) {}
  ~Workers() { join(); }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  void post(std::function<void()> work);
  // Runs what is queued, then stops and joins every thread.
  void join();

 private:
  void run();

  std::size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace nshpc::transport

// The dashboard's live events (docs/api.md, "Live events"): the streams open on /api/events and
// /api/jobs/{instance}/{job}/output, all served by one watcher thread that runs while at least
// one stream is open: every 250 ms it sends what new job output there is, about every second the
// new audit events (activity.hpp) and about every 3 s a sweep of the living instances' states.
// No thread per stream, nothing read for nobody.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/fd.hpp"
#include "dashboard/activity.hpp"
#include "instances/instances.hpp"
#include "transport/http.hpp"

namespace nshpc::dashboard {

// The longest prefix of `bytes` that ends on a whole UTF-8 character (an incomplete last
// sequence of up to 3 bytes is left for the next read).
std::size_t utf8_whole_prefix(std::string_view bytes);

class Live {
 public:
  Live(instances::Service& service, Activity& activity);
  ~Live();  // stops the watcher; the streams end with the server
  Live(const Live&) = delete;
  Live& operator=(const Live&) = delete;

  // An /api/events stream: activity (of `instance` when not empty), instances and jobs events.
  // `after`: a Last-Event-ID: the activity events after it still in the ring are sent first.
  void watch(std::shared_ptr<transport::EventSink> sink, std::string instance, std::optional<std::uint64_t> after);

  // A job's output stream from these offsets (Last-Event-ID "<stdout>:<stderr>"), then `end`.
  // The job must exist (the caller checked).
  void follow_job(std::shared_ptr<transport::EventSink> sink, const store::Instance& inst, const jobs::Record& job,
                  std::uint64_t stdout_from, std::uint64_t stderr_from);

  std::size_t streams() const;

 private:
  struct Watcher {
    std::shared_ptr<transport::EventSink> sink;
    std::string instance;
    std::uint64_t seen = 0;  // the last activity event it was given (the watcher thread's after it is added)
  };
  struct JobStream {
    std::shared_ptr<transport::EventSink> sink;
    store::Instance inst;
    std::string job_id;
    struct Output {
      const char* name;
      std::string relative;  // beneath the workspace
      UniqueFd fd;           // opened once it exists
      std::uint64_t offset = 0;
      std::string pending;   // an incomplete UTF-8 character
    } out[2];
    bool ended = false;  // the job was final at the last look
    std::chrono::steady_clock::time_point last_state{};
  };
  void start_locked();
  void run(std::stop_token stop);
  void send_activity(const std::vector<std::shared_ptr<Watcher>>& watchers);
  // Living states; an instances event to `watchers` for what changed.
  void sweep(const std::vector<std::shared_ptr<Watcher>>& watchers);
  // New output of one stream; false when the stream is done (ended and drained, or closed).
  bool pump(JobStream& stream);

  instances::Service& service_;
  Activity& activity_;
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<Watcher>> watchers_;
  std::vector<std::shared_ptr<JobStream>> jobs_;
  std::map<std::string, std::string> states_;  // living state per persistent instance, at the last sweep
  bool swept_ = false;
  bool running_ = false;
  std::condition_variable_any wake_;
  std::jthread thread_;  // last: joined before the rest goes
};

}  // namespace nshpc::dashboard

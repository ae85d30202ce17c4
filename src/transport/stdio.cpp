// stdio: a reader thread turns stdin into frames for the session (on the I/O thread), a writer
// thread drains the output queue to stdout, tool calls run on a worker pool. Blocking reads and
// writes on their own threads work for pipes, terminals and plain files alike.
#include "transport/stdio.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>

#include "base/fd.hpp"
#include "base/log.hpp"
#include "transport/framing.hpp"
#include "transport/workers.hpp"

namespace nshpc::transport {

namespace asio = boost::asio;

namespace {

// Writes queued messages to a descriptor in order, on its own thread.
class Writer {
 public:
  explicit Writer(int fd) : fd_(fd), thread_([this] { run(); }) {}
  ~Writer() { stop(); }

  void push(std::string line) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      queue_.push_back(std::move(line));
    }
    wake_.notify_one();
  }
  // Writes what is queued, then ends the thread.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::string line = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (!write_all(line)) broken_ = true;
      lock.lock();
    }
  }
  bool write_all(std::string_view data) {
    if (broken_) return false;
    while (!data.empty()) {
      ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) {
          pollfd p{fd_, POLLOUT, 0};
          ::poll(&p, 1, -1);
          continue;
        }
        log::error("stdout is closed ({}); dropping further messages", std::strerror(errno));
        return false;
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  int fd_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::string> queue_;
  bool stopping_ = false;
  bool broken_ = false;
  std::thread thread_;
};

// Reads stdin on its own thread and hands each chunk to `on_data` (EOF: an empty chunk).
// stop() interrupts a blocked read through a self-pipe.
class Reader {
 public:
  Reader(int fd, std::function<void(std::string)> on_data)
      : fd_(fd), on_data_(std::move(on_data)), wake_(make_pipe()), thread_([this] { run(); }) {}
  ~Reader() { stop(); }
  void stop() {
    if (wake_.write) {
      char byte = 1;
      ssize_t ignored = ::write(wake_.write.get(), &byte, 1);
      (void)ignored;
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::string buf(65536, '\0');
    for (;;) {
      pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_.read.get(), POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[1].revents) return;  // asked to stop
      ssize_t n = ::read(fd_, buf.data(), buf.size());
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) break;
      on_data_(std::string(buf.data(), static_cast<size_t>(n)));
    }
    on_data_(std::string());  // end of input
  }

  int fd_;
  std::function<void(std::string)> on_data_;
  Pipe wake_;
  std::thread thread_;
};

}  // namespace

int serve_stdio(mcp::Server& server, const StdioOptions& options) {
  std::signal(SIGPIPE, SIG_IGN);  // a client that goes away must not kill the server
  asio::io_context io;
  Workers workers(options.worker_threads);
  Writer writer(options.out_fd);
  LineFramer framer(options.max_message_bytes);

  mcp::Session session(
      server, "stdio",
      [&writer](const mcp::json& message) {
        writer.push(message.dump(-1, ' ', false, mcp::json::error_handler_t::replace) + "\n");
      },
      [&workers](std::function<void()> work) { workers.post(std::move(work)); });

  bool done = false;
  auto finish = [&] {
    if (done) return;
    done = true;
    session.close();  // cancels running calls and waits for them
    io.stop();
  };
  // End of input: answer what is still running (a piped batch of requests expects its
  // answers), then stop. A signal meanwhile cancels them.
  asio::steady_timer drain(io);
  std::function<void()> finish_when_idle = [&] {
    if (done) return;
    if (session.in_flight() == 0) return finish();
    drain.expires_after(std::chrono::milliseconds(20));
    drain.async_wait([&](const boost::system::error_code& ec) {
      if (!ec) finish_when_idle();
    });
  };
  auto on_frame = [&](const Frame& frame) {
    if (frame.kind == Frame::Kind::message) {
      session.receive(std::string_view(frame.text));
      return;
    }
    writer.push(mcp::make_error(nullptr, mcp::kInvalidRequest,
                                fmt::format("message of {} bytes is larger than the limit of {} bytes "
                                            "([mcp] max_message_bytes); it was skipped",
                                            frame.size, options.max_message_bytes))
                    .dump() +
                "\n");
  };

  Reader reader(options.in_fd, [&](std::string chunk) {
    asio::post(io, [&, chunk = std::move(chunk)] {
      if (done) return;
      if (chunk.empty()) {
        if (auto last = framer.finish()) on_frame(*last);
        finish_when_idle();
        return;
      }
      for (const Frame& frame : framer.feed(chunk)) on_frame(frame);
    });
  });

  asio::signal_set signals(io, SIGTERM, SIGINT, SIGHUP);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    log::info("signal {}: closing the session", sig);
    finish();
  });

  auto work = asio::make_work_guard(io);
  io.run();
  reader.stop();
  workers.join();
  writer.stop();  // flushes what the session sent before closing
  return 0;
}

}  // namespace nshpc::transport

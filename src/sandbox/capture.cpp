// The captured-run pump (see capture.hpp).
#include "sandbox/capture.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "base/error.hpp"
#include "base/process.hpp"
#include "base/steps.hpp"

namespace nshpc::sandbox {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kDrainGrace{500};
// In a living instance the pipes stay open while background processes hold them: what the
// command wrote is there when it exits; a moment more catches their first lines.
constexpr std::chrono::milliseconds kLivingDrainGrace{100};

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) throw SysError(errno, "fcntl(O_NONBLOCK)");
}

// One stream: where it comes from and where it goes.
struct Stream {
  UniqueFd from;
  Sink sink;
  std::string* kept;
  bool sink_broken = false;  // the descriptor written through to is gone (EPIPE): dropped from then on
};

class Pump {
 public:
  Pump(Execution& execution, CapturePipes pipes, const CaptureOptions& options)
      : exec_(execution), options_(options) {
    stdin_ = std::move(pipes.in);
    out_ = {std::move(pipes.out), options.out, &result_.out};
    err_ = {std::move(pipes.err), options.err, &result_.err};
    if (stdin_ && options.input.empty()) stdin_.reset();  // EOF at once
    for (int fd : {stdin_.get(), out_.from.get(), err_.from.get()})
      if (fd >= 0) set_nonblocking(fd);
  }

  CaptureResult run() {
    SigpipeBlock no_sigpipe;  // a command that does not read its stdin (or a closed sink) must not kill us
    const auto started = Clock::now();
    loop(started);
    result_.status = exec_.wait();
    if (result_.ending == Ending::timed_out || result_.ending == Ending::finished) {
      // What is left in the pipes, bounded by the cap.
      drain(out_);
      drain(err_);
      if (limit_hit_ && result_.ending == Ending::finished) result_.ending = Ending::output_limit;
    }
    result_.duration = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
    return std::move(result_);
  }

  std::chrono::milliseconds drain_grace = kDrainGrace;

 private:
  void loop(Clock::time_point started) {
    std::optional<Clock::time_point> deadline;
    if (options_.timeout) deadline = started + *options_.timeout;
    auto next_progress = started + options_.progress_interval;
    std::optional<Clock::time_point> exited_at;
    for (;;) {
      const auto now = Clock::now();
      if (exited_at) {
        // The command is gone; read what the pipes still hold.
        if (!out_.from && !err_.from) return;
        if (now - *exited_at >= drain_grace) return;
      } else {
        if (options_.cancelled && options_.cancelled()) return stop(Ending::cancelled);
        if (deadline && now >= *deadline) return stop(Ending::timed_out);
        if (options_.progress && now >= next_progress) {
          options_.progress({std::chrono::duration_cast<std::chrono::milliseconds>(now - started), result_.out,
                             result_.err});
          while (next_progress <= now) next_progress += options_.progress_interval;
        }
      }

      pollfd fds[4];
      nfds_t n = 0;
      int i_out = -1, i_err = -1, i_in = -1, i_end = -1;
      if (out_.from) fds[i_out = static_cast<int>(n++)] = {out_.from.get(), POLLIN, 0};
      if (err_.from) fds[i_err = static_cast<int>(n++)] = {err_.from.get(), POLLIN, 0};
      if (stdin_) fds[i_in = static_cast<int>(n++)] = {stdin_.get(), POLLOUT, 0};
      if (!exited_at && exec_.wait_fd() >= 0) fds[i_end = static_cast<int>(n++)] = {exec_.wait_fd(), POLLIN, 0};
      auto wait = options_.slice;
      if (!exited_at) {
        if (deadline) wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(*deadline - now));
        if (options_.progress) wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(next_progress - now));
      } else {
        wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(*exited_at + drain_grace - now));
      }
      const int ready = ::poll(fds, n, static_cast<int>(std::max<std::int64_t>(wait.count(), 0)));
      if (ready < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        stop(Ending::finished);  // nothing can be read any more: the tree goes, the error says why
        throw SysError(err, "poll", "the command's output");
      }
      if (!exited_at && i_end < 0 && exec_.ended()) exited_at = Clock::now();
      if (ready == 0) continue;

      if (i_out >= 0 && fds[i_out].revents) read_from(out_);
      if (i_err >= 0 && fds[i_err].revents) read_from(err_);
      if (limit_hit_) return stop(Ending::output_limit);
      if (i_in >= 0 && fds[i_in].revents) write_stdin();
      if (i_end >= 0 && fds[i_end].revents) {
        exited_at = Clock::now();
        stdin_.reset();
      }
    }
  }

  void stop(Ending why) {
    exec_.kill_tree();
    result_.ending = why;
    stdin_.reset();
  }

  // Reads what the stream has now (until EAGAIN, EOF or the cap); closes it at EOF.
  void read_from(Stream& s) {
    char buf[65536];
    while (s.from && !limit_hit_) {
      const ssize_t n = ::read(s.from.get(), buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        s.from.reset();  // a broken pipe: treat as EOF
        return;
      }
      if (n == 0) {
        s.from.reset();
        return;
      }
      std::size_t got = static_cast<std::size_t>(n);
      const std::size_t room = options_.output_cap - total_;
      if (got > room) {
        got = room;
        limit_hit_ = true;
      }
      total_ += got;
      deliver(s, buf, got);
    }
  }

  void deliver(Stream& s, const char* data, std::size_t size) {
    if (s.sink.fd < 0) {
      s.kept->append(data, size);
      return;
    }
    while (size > 0 && !s.sink_broken) {
      const ssize_t n = ::write(s.sink.fd, data, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          // A non-blocking sink that is full: wait for it (the command waits on us meanwhile).
          pollfd p{s.sink.fd, POLLOUT, 0};
          ::poll(&p, 1, static_cast<int>(options_.slice.count()));
          continue;
        }
        s.sink_broken = true;  // EPIPE and the like: nobody reads it any more
        return;
      }
      data += n;
      size -= static_cast<std::size_t>(n);
    }
  }

  // After the command is gone: what is left in the pipe (bounded by the cap).
  void drain(Stream& s) {
    if (s.from) read_from(s);
  }

  void write_stdin() {
    while (stdin_ && written_ < options_.input.size()) {
      const ssize_t n = ::write(stdin_.get(), options_.input.data() + written_, options_.input.size() - written_);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        stdin_.reset();  // EPIPE: the command does not read its stdin (any more)
        return;
      }
      written_ += static_cast<std::size_t>(n);
    }
    stdin_.reset();  // all written: EOF for the command
  }

  Execution& exec_;
  const CaptureOptions& options_;
  UniqueFd stdin_;
  Stream out_, err_;
  std::size_t written_ = 0;
  std::size_t total_ = 0;  // stdout + stderr bytes taken
  bool limit_hit_ = false;
  CaptureResult result_;
};

}  // namespace

CaptureResult pump(Execution& execution, CapturePipes pipes, const CaptureOptions& options) {
  Pump p(execution, std::move(pipes), options);
  p.drain_grace = options.drain_grace.value_or(kDrainGrace);
  return p.run();
}

CaptureResult capture(Backend& backend, ExecSpec spec, const CaptureOptions& options) {
  Steps step("capture", spec.target.instance_id);
  step("pipes");
  Pipe in;
  if (!options.input.empty()) {
    in = make_pipe();
    spec.stdio.in = in.read.get();
  }
  Pipe out = make_pipe();
  Pipe err = make_pipe();
  spec.stdio.out = out.write.get();
  spec.stdio.err = err.write.get();
  spec.output_readers = {out.read.get(), err.read.get()};
  const bool living = spec.target.persistent;
  step("execute");
  std::unique_ptr<Execution> execution = execute(backend, std::move(spec));
  step("until done");
  std::shared_ptr<void> keep;
  if (options.started) keep = options.started(*execution);
  // Only the sandbox holds the other ends now: EOF on stdout/stderr when it is gone.
  in.read.reset();
  out.write.reset();
  err.write.reset();
  CaptureResult result;
  {
    Pump p(*execution, {std::move(in.write), std::move(out.read), std::move(err.read)}, options);
    p.drain_grace = options.drain_grace.value_or(living ? kLivingDrainGrace : kDrainGrace);
    result = p.run();
    step("end");
  }
  keep.reset();  // what `started` returned goes before the execution it may refer to
  execution.reset();
  step.done();
  return result;
}

}  // namespace nshpc::sandbox

// Nothing of an instance runs while its trees are copied or swapped (a snapshot, a restore, a
// reset): every execution of the instance — a command, a job, a file helper, a living sandbox's
// start — holds the instance's gate shared from its launch to its end (Backend::start), and what
// copies or swaps the trees holds it exclusively. The gate is a flock(2) on <state_dir>/exec.lock,
// a host-only file no sandbox sees, opened close-on-exec so no sandbox inherits it; a process that
// dies lets go of it with its descriptors.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "base/fd.hpp"
#include "sandbox/sandbox.hpp"

namespace nshpc::sandbox {

// The gate entered shared for one execution. Waits up to `patience` while a copy holds it, then
// throws UsageError saying the instance's trees are being copied or reset. A target of no instance
// (no state_dir: doctor's smoke run) has no gate: an invalid descriptor.
UniqueFd enter_gate(const Target& target, std::chrono::milliseconds patience);

// The gate held exclusively: nothing of the instance starts until it is closed. nullopt when
// executions hold it now; `holders` then gets the pids of the processes that do (from
// /proc/locks; this process's own pid among them for its own executions).
std::optional<UniqueFd> close_gate(const Target& target, std::vector<pid_t>* holders = nullptr);

// `process` with the gate it was started under: the gate is let go when the handle is destroyed.
std::unique_ptr<Process> holding_gate(std::unique_ptr<Process> process, UniqueFd gate);

}  // namespace nshpc::sandbox

// The manager's rebalancing policy (vcuda-mgmt --rebalance): when GPU pressure stays uneven, move one lease
// from the hottest GPU to the coolest. Pure, like manager_state: it reads the state and the time it is given
// and returns a decision; the daemon (mgmt/daemon/service.cpp) asks for the move, logs and records an event.
//
// Pressure of a GPU: the larger of its utilization (percent, from its server's heartbeats) and its memory in
// use (percent of its memory, all processes). Only GPUs that take leases (up: not cordoned, draining or down)
// and whose server reported load count. Every `interval` the policy takes a sample: the spread between the
// hottest and the coolest GPU. Hysteresis: only after `sustain` samples in a row with a spread above
// `threshold` does it act, and it counts again from zero after every decision (so the load has time to
// follow a move). It never acts while a move is under way, moves at most `max_moves_per_minute`, and leaves
// a lease that moved (for any reason) where it is for `cooldown`, so a lease never bounces back and forth.
//
// Which lease: among those with a session on the hottest GPU (reported by its server, running, not
// suspended, not moving, not in cooldown) that fit on a cooler GPU, the busiest first (a session idle for
// less than one interval), then the one holding the least memory (the shortest pause). The target is the
// coolest GPU that takes it (manager_state::plan_move), and must stay cooler than the source by more than
// the threshold.
// runs on: the caller's thread; not thread-safe (the daemon calls it under its lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>

#include "mgmt/core/state.hpp"

namespace vcuda::mgmt {

struct rebalance_config {
    uint32_t threshold = 25;  // percentage points between the hottest and the coolest GPU
    uint32_t sustain = 3;     // samples in a row above the threshold before acting
    std::chrono::milliseconds interval = std::chrono::seconds(5);  // between samples
    uint32_t max_moves_per_minute = 1;
    std::chrono::milliseconds cooldown = std::chrono::minutes(10);  // a lease that moved stays this long
};

// Pressure of one GPU (0-100), as above.
uint32_t gpu_pressure(const gpu_record& g);

struct rebalance_decision {
    enum class kind {
        none,          // no sample due, even enough, or not uneven for long enough yet
        move,          // ask for `plan`
        no_candidate,  // uneven long enough, but no lease can move (`detail` says why)
        held_back,     // uneven long enough, but --rebalance-max-moves was reached this minute
    };
    kind what = kind::none;
    std::string hot_uuid, cool_uuid;
    uint32_t hot_pressure = 0, cool_pressure = 0;
    manager_state::move_plan plan;  // for move
    std::string session_id;         // for move: the session that goes
    uint64_t memory_used = 0;       // for move: what it holds
    std::string detail;             // what was seen and decided, for the log and `vcuda events`
};

class rebalancer {
  public:
    explicit rebalancer(rebalance_config cfg) : cfg_(cfg) {}
    const rebalance_config& config() const { return cfg_; }

    // Called often (the daemon: about once a second); takes a sample when one is due.
    rebalance_decision step(const manager_state& st, time_ms now);
    // A move the decision asked for was recorded (counts against max_moves_per_minute).
    void moved(time_ms now) { moves_.push_back(now); }
    uint32_t streak() const { return streak_; }

  private:
    rebalance_config cfg_;
    time_ms last_sample_{};
    bool sampled_ = false;
    uint32_t streak_ = 0;
    std::deque<time_ms> moves_;  // when the last moves were asked for, within a minute
};

}  // namespace vcuda::mgmt

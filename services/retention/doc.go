// Package retention keeps the request log within its means: a request's
// events are hot while it runs, compact once it is finished, and evicted,
// oldest finished first, when the log needs room.
//
//   - Compact folds a finished request's history into one record on its
//     events subject (events.RequestCompacted, written by a frontend), then
//     purges its tokens subjects. Every reader folds the record to the state
//     the deltas folded to, so every rendering is unchanged.
//   - A Monitor reads how full each request partition is, refuses new
//     requests above the high-water mark (Admit: ErrLogFull), reports it to
//     /health and as baton_log_used_ratio{stream}, and evicts the oldest
//     finished requests (every subject purged) while a partition is above
//     its eviction mark. A request in flight is never evicted: the room
//     between the high-water mark and the limit is its reserve.
//
// Invariants: a request is never partly evicted (its subjects are purged in
// one call, and a reader that finds no accepted event answers 404); only
// terminal requests and subjects no reader folds are evicted; compaction
// writes with the expected sequence of the events subject, so two frontends
// compacting one request store one record.
package retention

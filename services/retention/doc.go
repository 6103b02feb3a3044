// Package retention keeps the request log within its means: a request's
// events are hot while it runs, compact once it is finished, and evicted,
// oldest finished first, when the log needs room; what a worker writes
// outside its attempts is purged, and the worker quarantined. It has three
// parts, which every frontend runs:
//
//   - Compaction (Compact) folds a finished request's history into one
//     record on its events subject (events.RequestCompacted, written by a
//     frontend), then purges its tokens subjects. Every reader folds the
//     record to the state the deltas folded to, so every rendering is
//     unchanged.
//   - A Monitor, of admission and eviction, reads how full each request
//     partition is, refuses new requests above the high-water mark (Admit:
//     ErrLogFull), reports it to /health and as
//     baton_log_used_ratio{stream}, and evicts the oldest finished requests
//     (every subject purged) while a partition is above its eviction mark.
//     A request in flight is never evicted: the room between the
//     high-water mark and the limit is its reserve. The finished requests
//     of tenants over their share of the log (SetOverShare) go first, and
//     are evicted whatever the partition's usage.
//   - A Guard, the junk guard, looks at what the workers wrote to each
//     partition after each reading of its own, purges their junk (written
//     outside the attempts routed to them, or after their request ended),
//     and quarantines a worker whose junk is large or many (Fleet.Junk);
//     while a worker is quarantined it sweeps what it writes. Every writer
//     it sees in the log is looked at, by the worker id its subjects name,
//     whether or not the view holds its lease (checkStrangers): a
//     credential needs no lease to write. A large message a reader saw go
//     by (Suspect) is judged at once, between readings and between a
//     reading's questions. A sweep judges a
//     quarantined worker's subjects by their requests' last events, read
//     1,024 a batched get (classifyBatched), and once none of its output
//     is needed purges all it wrote with one purge of its tokens filter a
//     reading.
//     A message on a worker's own attempt over the attempt's bound
//     (projections.AttemptBound, which the fold applies too) is junk;
//     a quarantined worker's messages over it, or large ones after its
//     attempt's fence, are deleted by sequence (trimHeld). A quarantine is
//     stored on the worker's events subject and on its quarantine subject,
//     which only frontends write (Fleet.Junk), so that its own
//     re-registration cannot bury it. It reads
//     through the Monitor (UsageReader), so admission answers from its
//     readings too, and on a goroutine of its own, so its questions never
//     hold up eviction, nor eviction its readings.
//
// Invariants: a request is never partly evicted (its subjects are purged in
// one call, and a reader that finds no accepted event answers 404); only
// terminal requests and subjects no reader folds are evicted; compaction
// writes with the expected sequence of the events subject, so two frontends
// compacting one request store one record; of a live worker's writes the
// guard purges only junk, which no reader folds into an answer (a subject no
// reader folds, one of a request that does not exist, of an attempt not
// routed to the subject's worker, written after its request's end was
// recorded, or over its attempt's bound), and of a quarantined worker's
// everything but what a request in flight, or finished and not compacted,
// may still need (of that, only messages no reader folds: after the
// attempt's fence, or over its bound).
package retention

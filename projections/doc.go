// Package projections folds baton's events into read models: the discovery
// view of workers (Discovery), the replay state of one request (Request) and
// its timeline (Replay), the membership of frontends (Frontends), and the
// console's bounded view of recent requests (Recent).
//
// Projections are pure: no I/O, no logging, time taken from events. Apply is
// idempotent on the stream sequence (what is not newer than the last applied
// sequence is skipped), so replaying a log, or replaying it twice, gives the
// same state as having followed it live. Reads return copies.
package projections

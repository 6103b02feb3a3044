// Package ratelog bounds how many lines a flood of warnings writes: Handler
// wraps a slog.Handler so that a warning (or an error) is written the first
// time its message is seen, then at most once an interval, the line that is
// written saying how many of the same message were dropped since the last
// one. A forged or broken peer that makes every frontend warn thousands of
// times a second then costs a few lines, and the operator still sees what
// happened and how often.
package ratelog

// Package promtext reads the Prometheus text exposition that baton's
// components serve at /metrics, for the integration tests, the benchmarks
// and the chaos soak, and what a registry gathers, for the unit tests: the
// sum of a metric's samples, over all its series or over those with given
// labels. It parses only what the Go client writes
// (no timestamps needed, label values quoted and escaped) and does no I/O
// beyond reading what it is given.
package promtext

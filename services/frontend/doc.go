// Package frontend is baton's OpenAI-compatible HTTP API. It accepts requests
// into the log, routes and dispatches them to workers, streams their tokens
// from the log to clients, and migrates them when a worker fails.
//
// A frontend is stateless apart from caches rebuilt from the log: the
// discovery view, one follower per request it serves, and, once someone
// opened the console (/console) on it, the console's bounded view of recent
// requests and incidents.
package frontend

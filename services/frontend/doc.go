// Package frontend is baton's OpenAI-compatible HTTP API: the HTTP edge of a
// frontend. It admits requests, authenticates callers, applies the tenants'
// limits, writes requests as OpenAI responses and SSE streams (parsed and
// rendered by package openai, which does no I/O: the chat, completions and
// Responses APIs' wire format), bounds what one client holds (package
// httpguard), serves the console, and orders the shutdown ("stop answering,
// then stop the runtime"). Its handlers have receivers of their own:
// Frontend's (chat and completions, the middleware), requests' (what every
// API does with the runtime), drain's (the shutdown as handlers see it) and
// responses' (the Responses API, which holds only what it needs).
//
// Everything that keeps a request alive once it is in the log (following
// it, running the migration decisions, taking it over, discovery, presence,
// commands to workers) is the request runtime, package runner, which the
// edge drives through the runtime's small API and never reaches into.
//
// A frontend is stateless apart from caches rebuilt from the log: the
// runtime's, and, once someone opened the console (/console) on it, the
// console's bounded view of recent requests and incidents. drain.mu guards
// the count of open responses; Frontend.mu the budgets against a reload.
package frontend

package streams

// HeaderBenchEmit is the one piece of benchmark plumbing on the wire: a
// worker run with --bench-emit-time puts it on each token delta (a
// CloudEvents extension attribute, so events.Unmarshal ignores it), holding
// when the engine emitted the delta's first token in Unix nanoseconds; a
// frontend passes it on to its SSE client as a comment line, so the client
// measures emit-to-read latency exactly. Nothing else writes or reads it.
const HeaderBenchEmit = "ce-emitns"

package projections

// Why an event changed nothing, as Fold reports it.
const (
	IgnoredReplayed  = "ignored (not newer than the last applied event)"
	IgnoredAfterEnd  = "ignored (after the end)"
	IgnoredFenced    = "ignored (fenced)"
	IgnoredGap       = "ignored (gap)"
	IgnoredDuplicate = "ignored (duplicate)"
	IgnoredPastMax   = "ignored (past max_tokens)"
	// IgnoredOversize: a delta whose tokens' text and details come to more
	// than one message of an attempt may hold (AttemptBound); the junk
	// guard deletes such a message of a quarantined worker's.
	IgnoredOversize    = "ignored (over the attempt's bound)"
	NoEffectClosed     = "no effect (attempt already closed)"
	NoEffectOwner      = "no effect (already the owner)"
	NoEffectApplied    = "no effect (already applied)"
	NoEffect           = "no effect"
	IgnoredBadAttempt  = "ignored (no such attempt)"
	IgnoredOutOfOrder  = "ignored (not the next attempt)"
	IgnoredUnknownType = "no effect (not a request event)"
	// SkippedPrefix begins the reason of an event this build cannot read
	// (events.Unreadable): "skipped (newer version v2 of ...)". It changes
	// nothing but the last applied sequence (docs/compatibility.md).
	SkippedPrefix = "skipped ("
	// IgnoredNotRouted: an attempt's output (tokens, completed,
	// attempt_failed) on the subject of a worker that the attempt's routed
	// event does not name. NATS permissions let a worker write only the
	// subjects that name it, so this is another worker's write.
	IgnoredNotRouted = "ignored (not the routed worker)"
	// IgnoredStaleEnd: an end in the ends place (events.RequestEnded) that
	// its owner wrote before this request's accepted event was stored: an
	// earlier request's of the same id.
	IgnoredStaleEnd = "ignored (the end of an earlier request of this id)"
	// IgnoredWrongSubject: an event on a subject where its type does not
	// belong (a decision on a tokens subject, an attempt's output on the
	// events subject or another attempt's subject, another request's).
	IgnoredWrongSubject = "ignored (wrong subject for its type)"
)

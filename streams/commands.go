package streams

import (
	"fmt"
	"strings"
)

// Subjects of the core-NATS traffic between frontends and one worker, each
// named by the worker, so that NATS permissions confine a worker to its own
// (natsserver.PinWorker): a worker never reads a request's log.
const (
	commandsPrefix = "baton.commands."
	checksPrefix   = "baton.checks."
	// workerInboxPrefix starts the inboxes of a worker's connection (its
	// request replies, JetStream acknowledgements, KV watches): a worker
	// may subscribe only to its own, never to a frontend's _INBOX.
	workerInboxPrefix = "_INBOX_worker."
)

// CommandSubject is the core-NATS subject on which worker id receives
// commands for the attempts routed to it: cancels and fences.
func CommandSubject(workerID string) string { return commandsPrefix + workerID }

// CheckSubject is the core-NATS request subject on which worker id asks any
// live frontend about one of its attempts (Check); frontends answer it in a
// queue group, reading the worker's id from the subject.
func CheckSubject(workerID string) string { return checksPrefix + workerID }

// CheckSubjects matches every worker's check subject (a frontend's queue
// subscription).
const CheckSubjects = checksPrefix + "*"

// CheckQueue is the queue group of the frontends answering checks: one of
// them answers each.
const CheckQueue = "baton-frontends"

// CheckWorker returns the worker a check subject names.
func CheckWorker(subject string) (string, error) {
	id, ok := strings.CutPrefix(subject, checksPrefix)
	if !ok || !ValidID(id) {
		return "", fmt.Errorf("streams: not a check subject: %q", subject)
	}
	return id, nil
}

// WorkerInboxPrefix is the inbox prefix of worker id's connection
// (nats.CustomInboxPrefix).
func WorkerInboxPrefix(workerID string) string { return workerInboxPrefix + workerID }

// What a Command tells a worker to do with one attempt.
const (
	// CommandCancel stops the attempt as a cancel in Mode does: stop ends it
	// at the next token boundary with finish reason "cancelled", kill aborts
	// it at once and writes nothing more.
	CommandCancel = "cancel"
	// CommandFence stops the attempt without writing anything more: the
	// request moved on (a migration away from it, or its end).
	CommandFence = "fence"
	// CommandRouted says the attempt's routed decision is stored: a worker
	// that holds the attempt's output (events.Dispatch.Hold)
	// stores it from now on. Older workers never get one.
	CommandRouted = "routed"
)

// Command is what a frontend tells a worker about an attempt routed to it,
// on CommandSubject(worker). It carries out a decision recorded in the log
// (cancelled, migrated, failed); a worker that does not run the attempt
// ignores it, and one that already stopped it keeps the first cause.
type Command struct {
	RequestID string `json:"request_id"`
	Attempt   int    `json:"attempt"`
	Kind      string `json:"kind"`           // CommandCancel, CommandFence or CommandRouted
	Mode      string `json:"mode,omitempty"` // CommandCancel: events.CancelStop or events.CancelKill
	Reason    string `json:"reason,omitempty"`
	// Hold, on a fence, confines it to the job started by the held
	// dispatch of that id (events.Dispatch.Hold): a frontend whose routed
	// decision was not stored fences only what its own dispatch started.
	Hold string `json:"hold,omitempty"`
}

// Check is a worker's question about an attempt it runs, sent to any live
// frontend on CheckSubject(worker): what should this attempt obey now (a
// command the worker may have missed while its connection was down), and
// who owns the request. With Detach set, the worker reports that Owner has
// been gone for the detach timeout: the frontend cancels the request (kill)
// unless it has a live owner.
type Check struct {
	RequestID string `json:"request_id"`
	Attempt   int    `json:"attempt"`
	Owner     string `json:"owner,omitempty"`
	Detach    bool   `json:"detach,omitempty"`
}

// CheckReply answers a Check. Command is what the attempt must obey (nil:
// keep going); Owner is the request's owning frontend as the log says.
type CheckReply struct {
	Command *Command `json:"command,omitempty"`
	Owner   string   `json:"owner,omitempty"`
	Error   string   `json:"error,omitempty"` // the frontend could not answer (the log unreadable)
	// RetryAfterMS, with Error, means the check was refused unread: the
	// worker's checks exceed the frontend's rate; ask again after this long.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

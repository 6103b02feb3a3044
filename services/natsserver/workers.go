package natsserver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/baton-dev/baton/streams"
)

// WorkerPermissions is the least-privilege permission set of a worker, as
// docs/deployment.md documents it (a test checks that they are the same):
// any worker id. PinWorker narrows it to one worker.
const WorkerPermissions = `publish: [
  "baton.requests.*.*.tokens.*.*",         # its attempts' token deltas, completed, attempt_failed (pinned: .<worker>)
  "baton.workers.*.events",                # registered, draining, deregistered
  "baton.checks.*",                        # asks a frontend about its attempts (reconnect, detach)
  "$KV.baton_leases.>", "$KV.baton_load.>",
  "$JS.API.INFO", "$JS.API.STREAM.INFO.BATON_WORKERS",                                 # verifies, never creates:
  "$JS.API.STREAM.INFO.KV_baton_leases", "$JS.API.STREAM.INFO.KV_baton_load",           # a frontend or baton
  "$JS.API.STREAM.INFO.KV_baton_frontends",                                            # provision provisions
  "$JS.API.DIRECT.GET.KV_baton_leases.>", "$JS.API.DIRECT.GET.KV_baton_load.>", "$JS.API.DIRECT.GET.KV_baton_frontends.>",
  "$JS.API.CONSUMER.CREATE.KV_baton_leases.>", "$JS.API.CONSUMER.CREATE.KV_baton_frontends.>",   # owners, for detached requests
  "$JS.API.CONSUMER.DELETE.KV_baton_leases.>", "$JS.API.CONSUMER.DELETE.KV_baton_frontends.>",   # its watchers' end
  "$JS.FC.>", "$JS.ACK.>",
  "baton.outputs.*",                       # --batched-output: asks a frontend for its output stream (pinned: .<worker>)
  "baton.out.*.d.*",                       # --batched-output: its batches, one subject per owner (pinned: baton.out.<worker>.d.*)
  "$JS.API.STREAM.INFO.BATON_OUT_*"        # pinned: its own stream (BATON_OUT_<worker>); unpinned it names no stream
]
subscribe: [ "baton.dispatch.*", "baton.commands.*", "_INBOX_worker.*.>" ]   # pinned per user: .<worker id>
`

// pins are the grants of WorkerPermissions that name one worker's own
// subjects: its attempts' output, lifecycle events, checks, lease and load
// keys, dispatches, commands and inboxes, and its output stream's ask,
// subjects and info. Each is built by streams, as any
// worker's ("*", or ">" for a key) and as one worker's ("%s").
var pins = func() []struct{ any, own string } {
	grant := func(subject func(id string) string) struct{ any, own string } {
		return struct{ any, own string }{quote(subject("*")), quote(subject("%s"))}
	}
	inbox := func(id string) string { return streams.WorkerInboxPrefix(id) + ".>" }
	return []struct{ any, own string }{
		grant(streams.WorkerTokens),
		grant(streams.WorkerEvents),
		grant(streams.CheckSubject),
		{quote(streams.KVSubject(streams.LeasesBucket, ">")) + ", " + quote(streams.KVSubject(streams.LoadBucket, ">")),
			quote(streams.KVSubject(streams.LeasesBucket, "%s")) + ", " + quote(streams.KVSubject(streams.LoadBucket, "%s"))},
		grant(streams.DispatchSubject),
		grant(streams.CommandSubject),
		{quote(inbox("*")), quote(inbox("%s"))},
		grant(streams.OutputsSubject),
		grant(func(id string) string { return streams.WorkerOutput(id, "*") }),
		grant(func(id string) string { return "$JS.API.STREAM.INFO." + streams.WorkerOutputStream(id) }),
	}
}()

func quote(subject string) string { return `"` + subject + `"` }

// PinWorker narrows a worker permission set to worker id: it may write only
// its own attempts' output (the tokens subjects that name it), lifecycle
// events, checks, lease and load keys, and receive only its own dispatches,
// commands and inbox replies. It reads no request's log. It fails if perms
// lacks one of the grants it narrows.
func PinWorker(perms, id string) (string, error) {
	for _, p := range pins {
		if !strings.Contains(perms, p.any) {
			return "", fmt.Errorf("natsserver: the worker permissions lack %s", p.any)
		}
		perms = strings.ReplaceAll(perms, p.any, strings.ReplaceAll(p.own, "%s", id))
	}
	return perms, nil
}

// OutputOnly narrows a worker permission set, pinned or not, to a fleet
// that runs --batched-output everywhere: it drops the grant on the
// request log's tokens subjects, so that what a worker credential can
// store is bounded by its own output stream's MaxBytes
// (docs/internals.md, "Where a worker's output lives"), and nothing it
// writes can fill, or be folded from, the log every tenant shares. A
// worker so confined serves only attempts dispatched batched: a per-token
// write (a worker without its stream, a frontend without the switch) is a
// permissions violation. It fails if perms has no such grant.
func OutputOnly(perms string) (string, error) {
	lines := strings.SplitAfter(perms, "\n")
	kept := lines[:0]
	for _, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), `"`+streams.WorkerTokens("")) {
			continue
		}
		kept = append(kept, line)
	}
	if len(kept) == len(lines) {
		return "", errors.New("natsserver: the worker permissions grant no tokens subject to drop")
	}
	return strings.Join(kept, ""), nil
}

// WorkerUser is a per-worker NATS user: its name is the worker id.
type WorkerUser struct {
	ID, Password string
}

// ReadWorkerUsers reads a file of "WORKER_ID PASSWORD" lines ('#' starts a
// comment). Worker ids are baton ids (letters, digits, '-', '_'); passwords
// are at least 16 bytes.
func ReadWorkerUsers(path string) ([]WorkerUser, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("natsserver: worker users: %w", err)
	}
	var users []WorkerUser
	var errs []error
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
			continue
		case len(f) != 2:
			errs = append(errs, fmt.Errorf("line %d: want WORKER_ID PASSWORD", n))
		case !validWorkerID(f[0]):
			errs = append(errs, fmt.Errorf("line %d: worker id %q: want letters, digits, '-' or '_'", n, f[0]))
		case len(f[1]) < 16:
			errs = append(errs, fmt.Errorf("line %d: the password of %s is shorter than 16 bytes", n, f[0]))
		case seen[f[0]]:
			errs = append(errs, fmt.Errorf("line %d: worker %s listed twice", n, f[0]))
		default:
			seen[f[0]] = true
			users = append(users, WorkerUser{ID: f[0], Password: f[1]})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("natsserver: worker users %s: %w", path, err)
	}
	return users, nil
}

func validWorkerID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

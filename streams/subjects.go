package streams

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/baton-dev/baton/events"
)

// Names of the streams and buckets, part of the external contract.
const (
	RequestsStream = "BATON_REQUESTS"
	WorkersStream  = "BATON_WORKERS"
	LeasesBucket   = "baton_leases"
	LoadBucket     = "baton_load"
	// FrontendsBucket holds one key per live frontend replica (TTL'd like a
	// worker lease): who may own requests.
	FrontendsBucket = "baton_frontends"
	// BudgetsBucket holds the tenants' shared budgets (one key per tenant:
	// its buckets' levels and the leases frontends hold of them) and each
	// frontend's hash of its budgets file; see services/quota. Its keys
	// expire after BudgetsTTL without a write.
	BudgetsBucket = "baton_budgets"

	requestsPrefix = "baton.requests."
	livePrefix     = "baton.live.requests."
	workersPrefix  = "baton.workers."
	dispatchPrefix = "baton.dispatch."
)

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ValidID reports whether id can name a request or worker: 1 to 128 letters,
// digits, '-' or '_' (it becomes a NATS subject token). A client's
// X-Request-Id and a tenant's name are ValidIDs; a request's internal id is a
// ValidRequestID.
func ValidID(id string) bool { return idPattern.MatchString(id) }

// TenantSeparator joins a tenant's name and its client's request id into the
// internal request id. It can appear in neither (both are ValidIDs), and it
// is a legal character of a NATS subject token.
const TenantSeparator = ":"

// TenantRequestID maps a client's request id, in the namespace of tenant,
// to the request's internal id (the one in subjects and events):
// "<tenant>:<id>". The empty tenant (an API without keys) and the tenant
// "admin" use the global namespace, where the internal id is the client's id
// itself; the admin may also name any tenant's request by its internal id.
// The mapping is injective: bob's "r1" is "bob:r1", alice's is "alice:r1".
func TenantRequestID(tenant, id string) string {
	if tenant == "" || tenant == AdminTenant {
		return id
	}
	return tenant + TenantSeparator + id
}

// AdminTenant is the tenant that sees and cancels every request.
const AdminTenant = "admin"

// SplitRequestID splits an internal request id into its tenant (empty for
// the global namespace) and the client's id.
func SplitRequestID(internal string) (tenant, id string) {
	if t, rest, ok := strings.Cut(internal, TenantSeparator); ok {
		return t, rest
	}
	return "", internal
}

// ValidRequestID reports whether id is an internal request id: a ValidID,
// or "<tenant>:<ValidID>" with a ValidID tenant.
func ValidRequestID(id string) bool {
	t, rest, ok := strings.Cut(id, TenantSeparator)
	if !ok {
		return ValidID(id)
	}
	return ValidID(t) && ValidID(rest)
}

// Slots is the number of hash slots request subjects are spread over.
// A request's slot is a function of its id alone (Slot), fixed whatever
// the number of request streams: a partitioned log gives each stream a
// set of slots, so no subject depends on configuration.
const Slots = 64

// Slot is the hash slot of request id: FNV-1a (32 bits) of the id, mod Slots.
// (hash/fnv's, written out: it is computed for every live message, and
// the hash.Hash32 would be an allocation each time.)
func Slot(id string) int {
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= prime32
	}
	return int(h % Slots)
}

// RequestIDOf is the request id of a stored or republished request subject
// (what ParseRequestSubject names ID), without the rest of its parsing or
// any allocation: the live subscription's callback needs only the id to
// find the request's followers. ok is false if subj is not "<prefix><slot>.<id>.<more>"
// with the id's own slot.
func RequestIDOf(subj string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(subj, requestsPrefix)
	if !ok {
		if rest, ok = strings.CutPrefix(subj, livePrefix); !ok {
			return "", false
		}
	}
	slot, rest, ok := strings.Cut(rest, ".")
	if !ok {
		return "", false
	}
	id, _, ok = strings.Cut(rest, ".")
	if !ok || id == "" {
		return "", false
	}
	k, err := strconv.Atoi(slot)
	if err != nil || k != Slot(id) || slot != strconv.Itoa(k) {
		return "", false
	}
	return id, true
}

// requestBase is "<slot>.<id>.", the part of every subject of request id
// below the stored and live prefixes.
func requestBase(id string) string { return strconv.Itoa(Slot(id)) + "." + id + "." }

// RequestEvents is the subject of a request's lifecycle decisions:
// baton.requests.<slot>.<id>.events.
func RequestEvents(id string) string { return requestsPrefix + requestBase(id) + "events" }

// RequestTokens is the subject of what attempt k of a request, routed to
// worker, produces: baton.requests.<slot>.<id>.tokens.<k>.<worker>. The
// worker's id in the subject lets NATS permissions confine a worker to
// writing its own attempts, and a reader to accept an attempt's output
// only from the worker the attempt was routed to.
func RequestTokens(id string, attempt int, worker string) string {
	return requestsPrefix + requestBase(id) + "tokens." + strconv.Itoa(attempt) + "." + worker
}

// RequestAll matches every stored subject of a request.
func RequestAll(id string) string { return requestsPrefix + requestBase(id) + ">" }

// RequestLive matches the republished copies of a request's stored messages.
func RequestLive(id string) string { return livePrefix + requestBase(id) + ">" }

// KVSubject is the subject on which a KV bucket stores key: a TTL'd put
// (jetstream.WithMsgTTL) is a publish there.
func KVSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// WorkerEvents is the subject of a worker's lifecycle events.
func WorkerEvents(id string) string { return workersPrefix + id + ".events" }

// WorkerOfSubject is the worker id that a worker events subject
// (WorkerEvents) names; ok is false for any other subject.
func WorkerOfSubject(subj string) (id string, ok bool) { return workerOf(subj, ".events") }

// workerOf is the worker id of baton.workers.<id><suffix>.
func workerOf(subj, suffix string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(subj, workersPrefix)
	if !ok {
		return "", false
	}
	id, ok = strings.CutSuffix(rest, suffix)
	if !ok || !ValidID(id) {
		return "", false
	}
	return id, true
}

// WorkerQuarantine is the subject of a worker's quarantine records
// (events.WorkerLost with QuarantineMS), which only a frontend writes: a
// worker's credential may write its own events subject (WorkerEvents), not
// this one, so nothing the worker writes buries its quarantine there
// (projections.Discovery folds the last message of both).
func WorkerQuarantine(id string) string { return workersPrefix + id + ".quarantine" }

// WorkerOfQuarantine is the worker id that a quarantine subject
// (WorkerQuarantine) names; ok is false for any other subject.
func WorkerOfQuarantine(subj string) (id string, ok bool) { return workerOf(subj, ".quarantine") }

// DispatchSubject is the core-NATS request subject on which a worker accepts work.
func DispatchSubject(workerID string) string { return dispatchPrefix + workerID }

// RequestSubject is a request subject taken apart.
type RequestSubject struct {
	ID      string
	Kind    string // "events" or "tokens"
	Attempt int    // -1 for events
	Worker  string // the attempt's worker, for tokens
}

// ParseRequestSubject splits a stored (or republished) request subject into
// its request id, kind, attempt and worker. It checks that the slot is the
// id's.
func ParseRequestSubject(subj string) (RequestSubject, error) {
	rest, ok := strings.CutPrefix(subj, requestsPrefix)
	if !ok {
		rest, ok = strings.CutPrefix(subj, livePrefix)
	}
	if !ok {
		return RequestSubject{}, fmt.Errorf("streams: not a request subject: %q", subj)
	}
	parts := strings.Split(rest, ".")
	if len(parts) < 3 || parts[0] != strconv.Itoa(Slot(parts[1])) {
		return RequestSubject{}, fmt.Errorf("streams: not a request subject: %q", subj)
	}
	id, tail := parts[1], parts[2:]
	switch {
	case len(tail) == 1 && tail[0] == "events":
		return RequestSubject{ID: id, Kind: "events", Attempt: -1}, nil
	case len(tail) == 3 && tail[0] == "tokens" && tail[2] != "":
		k, err := strconv.Atoi(tail[1])
		if err != nil || k < 0 {
			return RequestSubject{}, fmt.Errorf("streams: bad attempt in %q", subj)
		}
		return RequestSubject{ID: id, Kind: "tokens", Attempt: k, Worker: tail[2]}, nil
	}
	return RequestSubject{}, fmt.Errorf("streams: not a request subject: %q", subj)
}

// Tail is the subject's part below the request's id: "events", or
// "tokens.<k>.<worker>".
func (r RequestSubject) Tail() string {
	if r.Kind == "events" {
		return "events"
	}
	return "tokens." + strconv.Itoa(r.Attempt) + "." + r.Worker
}

// LiveSubject maps a stored request subject to its republished copy.
func LiveSubject(subj string) string {
	if rest, ok := strings.CutPrefix(subj, requestsPrefix); ok {
		return livePrefix + rest
	}
	return subj
}

// StoredSubject maps a republished subject (a request's, or a worker's
// output, WorkerOutput) back to the stored one.
func StoredSubject(subj string) string {
	if rest, ok := strings.CutPrefix(subj, livePrefix); ok {
		return requestsPrefix + rest
	}
	if rest, ok := strings.CutPrefix(subj, liveOutPrefix); ok {
		return outPrefix + rest
	}
	return subj
}

// SubjectOf is the stored subject of ev, an event of request id: what
// attempt k produces (tokens, its completion, its failure) lives on
// RequestTokens(id, k, worker), where worker is the attempt's worker (the
// one its routed event names); every decision and command on
// RequestEvents(id).
func SubjectOf(id, worker string, ev events.Event) string {
	if k, ok := events.AttemptOutput(ev); ok {
		return RequestTokens(id, k, worker)
	}
	return RequestEvents(id)
}

// RequestsLive matches the republished copies of every request's stored
// messages: a frontend's one live subscription, dispatched to the request's
// followers by ParseRequestSubject.
func RequestsLive() string { return livePrefix + ">" }

// RequestsLiveSlot matches the republished copies of the stored messages of
// the requests in hash slot slot (Slot): a frontend subscribes to the slots
// of the requests it follows, and receives no other request's traffic.
func RequestsLiveSlot(slot int) string { return livePrefix + strconv.Itoa(slot) + ".>" }

// WorkerTokens matches the tokens subjects of every attempt routed to
// worker, of any request (RequestTokens): what NATS permissions let that
// worker write. WorkerTokens("*") matches every worker's.
func WorkerTokens(worker string) string { return requestsPrefix + "*.*.tokens.*." + worker }

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

// RequestEvents is the subject of a request's lifecycle decisions.
func RequestEvents(id string) string { return requestsPrefix + id + ".events" }

// RequestTokens is the subject of what attempt k of a request produces.
func RequestTokens(id string, attempt int) string {
	return requestsPrefix + id + ".tokens." + strconv.Itoa(attempt)
}

// RequestAll matches every stored subject of a request.
func RequestAll(id string) string { return requestsPrefix + id + ".>" }

// RequestLive matches the republished copies of a request's stored messages.
func RequestLive(id string) string { return livePrefix + id + ".>" }

// KVSubject is the subject on which a KV bucket stores key: a TTL'd put
// (jetstream.WithMsgTTL) is a publish there.
func KVSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// WorkerEvents is the subject of a worker's lifecycle events.
func WorkerEvents(id string) string { return workersPrefix + id + ".events" }

// DispatchSubject is the core-NATS request subject on which a worker accepts work.
func DispatchSubject(workerID string) string { return dispatchPrefix + workerID }

// ParseRequestSubject splits a stored (or republished) request subject into its
// request id, kind ("events" or "tokens") and attempt (-1 for events).
func ParseRequestSubject(subj string) (id, kind string, attempt int, err error) {
	rest, ok := strings.CutPrefix(subj, requestsPrefix)
	if !ok {
		rest, ok = strings.CutPrefix(subj, livePrefix)
	}
	if !ok {
		return "", "", 0, fmt.Errorf("streams: not a request subject: %q", subj)
	}
	parts := strings.Split(rest, ".")
	switch {
	case len(parts) == 2 && parts[1] == "events":
		return parts[0], "events", -1, nil
	case len(parts) == 3 && parts[1] == "tokens":
		k, err := strconv.Atoi(parts[2])
		if err != nil || k < 0 {
			return "", "", 0, fmt.Errorf("streams: bad attempt in %q", subj)
		}
		return parts[0], "tokens", k, nil
	}
	return "", "", 0, fmt.Errorf("streams: not a request subject: %q", subj)
}

// StoredSubject maps a republished subject back to the stored one.
func StoredSubject(subj string) string {
	if rest, ok := strings.CutPrefix(subj, livePrefix); ok {
		return requestsPrefix + rest
	}
	return subj
}

// SubjectOf is the stored subject of ev, an event of request id: what
// attempt k produces (tokens, its completion, its failure) lives on
// RequestTokens(id, k), every decision and command on RequestEvents(id).
func SubjectOf(id string, ev events.Event) string {
	switch ev := ev.(type) {
	case events.TokensGenerated:
		return RequestTokens(id, ev.Attempt)
	case events.RequestCompleted:
		return RequestTokens(id, ev.Attempt)
	case events.AttemptFailed:
		return RequestTokens(id, ev.Attempt)
	}
	return RequestEvents(id)
}

// RequestsLive matches the republished copies of every request's stored
// messages: a frontend's one live subscription, dispatched to the request's
// followers by ParseRequestSubject.
func RequestsLive() string { return livePrefix + ">" }

package frontend

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/apikeys"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/streams"
)

// CheckAPIKeysFile reads and checks a keys file as the frontend will
// (apikeys.Load), so that a bad file is a configuration error at start.
func CheckAPIKeysFile(path string) error {
	_, err := apikeys.Load(path)
	return err
}

// ReloadKeys reads the API keys file again (on SIGHUP). On an error the
// keys in use stay and the error is returned; without a keys file it does
// nothing.
func (fe *Frontend) ReloadKeys() error {
	if fe.keys == nil {
		return nil
	}
	if err := fe.keys.Reload(); err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	fe.log.Info("API keys reloaded", "keys", fe.keys.Size())
	return nil
}

type tenantKey struct{}

// tenantOf is the tenant of an authenticated request; "" when the API is open.
func tenantOf(r *http.Request) string {
	t, _ := r.Context().Value(tenantKey{}).(string)
	return t
}

// openPath reports whether path is served without a key: the probes and
// the metrics, which carry no request, client or server ids, and the
// console's page (its scripts ask for a key and send it with every call of
// the API, /v1/console/* included).
func openPath(path string) bool {
	return path == "/live" || path == "/health" || path == "/metrics" ||
		path == "/console" || strings.HasPrefix(path, "/console/")
}

// adminPath reports whether path is the admin's only: the console's data,
// which shows every tenant's requests, and the per-tenant metrics.
func adminPath(path string) bool {
	return strings.HasPrefix(path, "/v1/console/") || path == "/metrics/tenants"
}

// authenticate admits a request with a known key (Authorization: Bearer)
// and records its tenant; everything but openPath needs one. Without a
// keyring every request passes as the empty tenant.
func (fe *Frontend) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fe.keys == nil || openPath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		auth := r.Header.Get("Authorization")
		scheme, secret, ok := strings.Cut(auth, " ")
		secret = strings.TrimSpace(secret)
		if auth == "" {
			unauthorized(w, "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
			return
		}
		if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" {
			unauthorized(w, "The Authorization header must be 'Bearer YOUR_KEY'.")
			return
		}
		tenant, ok := fe.keys.Tenant(secret)
		if !ok {
			unauthorized(w, "Incorrect API key provided.")
			return
		}
		if adminPath(r.URL.Path) && tenant != streams.AdminTenant {
			writeError(w, http.StatusForbidden, "invalid_request_error", "permission_denied",
				"the console's data and the per-tenant metrics cover every tenant: they need the key of the tenant admin")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

func unauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="baton"`)
	writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", msg)
}

// requestID maps the id a caller names (in a path or a header) to the
// internal request id in its tenant's namespace (streams.TenantRequestID).
// The admin may name any request by its internal id; every other tenant
// names only its own. ok is false for an id the caller cannot name.
func requestID(tenant, id string) (internal string, ok bool) {
	if tenant == streams.AdminTenant {
		if !streams.ValidRequestID(id) {
			return "", false
		}
		return id, true
	}
	if !streams.ValidID(id) {
		return "", false
	}
	return streams.TenantRequestID(tenant, id), true
}

// publicID is the id a tenant knows an internal request id by.
func publicID(tenant, internal string) string {
	if tenant == "" || tenant == streams.AdminTenant {
		return internal
	}
	return strings.TrimPrefix(internal, tenant+streams.TenantSeparator)
}

// mayAccess reports whether tenant may see and act on a request: its owner
// or the admin. With an open API the tenant is "" and so is every request's.
func mayAccess(tenant string, acc events.RequestAccepted) bool {
	return tenant == streams.AdminTenant || acc.Tenant == tenant
}

// reuseError checks a re-POST under an existing id: only its tenant (or the
// admin) may attach, and only with the body and endpoint the request was
// accepted with (the id is an idempotency key).
func reuseError(t *runner.Request, tenant, public, endpoint, bodySHA string) *apiError {
	var acc events.RequestAccepted
	t.View(func(p *projections.Request) { acc = p.Accepted })
	if !mayAccess(tenant, acc) {
		return notFound(public)
	}
	if acc.BodySHA256 != "" && (acc.BodySHA256 != bodySHA || acc.Endpoint != endpoint) {
		return &apiError{status: http.StatusConflict, typ: "invalid_request_error", code: "request_id_conflict",
			message: fmt.Sprintf("request %s exists with a different body or endpoint: %s is an idempotency key, so a retry must send the same body to the same endpoint; use a new id for a new request", public, headerRequestID)}
	}
	return nil
}

func notFound(public string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "request_not_found",
		message: fmt.Sprintf("no request %q in the log (never accepted, or past retention)", public)}
}

// redactWorkers drops what only an operator needs (and what a forged
// disconnect advisory would need): process, host, lease and NATS client and
// server ids.
func redactWorkers(ws []projections.Worker) []projections.Worker {
	out := make([]projections.Worker, len(ws))
	for i, w := range ws {
		out[i] = projections.Worker{ID: w.ID, Model: w.Model, State: w.State, LeaseTTL: w.LeaseTTL, Load: w.Load, Priority: w.Priority}
	}
	return out
}

// publicIDs maps internal ids to the ids tenant knows them by.
func publicIDs(tenant string, ids []string) []string {
	if ids == nil {
		return nil
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = publicID(tenant, id)
	}
	return out
}

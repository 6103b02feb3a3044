package frontend

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/streams"
)

// MinSecretLen is the shortest API key secret accepted in a keys file.
const MinSecretLen = 16

// apiKey is one line of the keys file. Only the secret's hash is kept.
type apiKey struct {
	tenant string
	hash   [sha256.Size]byte
}

// CheckAPIKeysFile reads and checks a keys file as the frontend will (see
// parseKeys), so that a bad file is a configuration error at start.
func CheckAPIKeysFile(path string) error {
	_, err := loadKeyring(path)
	return err
}

// parseKeys reads a keys file: lines of "TENANT SECRET", '#' starts a
// comment, blank lines are skipped. Tenants are ValidIDs; a tenant may have
// several keys (rotation); a secret is at least MinSecretLen bytes and names
// one tenant only. Every problem is reported, with its line number.
func parseKeys(data []byte) ([]apiKey, error) {
	var keys []apiKey
	var errs []error
	seen := map[[sha256.Size]byte]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
			continue
		case len(fields) != 2:
			errs = append(errs, fmt.Errorf("line %d: want TENANT SECRET, got %d fields", n, len(fields)))
			continue
		case !streams.ValidID(fields[0]):
			errs = append(errs, fmt.Errorf("line %d: tenant %q: want 1 to 128 letters, digits, '-' or '_'", n, fields[0]))
			continue
		case len(fields[1]) < MinSecretLen:
			errs = append(errs, fmt.Errorf("line %d: the secret of tenant %s is shorter than %d bytes", n, fields[0], MinSecretLen))
			continue
		}
		k := apiKey{tenant: fields[0], hash: sha256.Sum256([]byte(fields[1]))}
		if prev, ok := seen[k.hash]; ok && prev != k.tenant {
			errs = append(errs, fmt.Errorf("line %d: tenants %s and %s share a secret", n, prev, k.tenant))
			continue
		}
		seen[k.hash] = k.tenant
		keys = append(keys, k)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	return keys, errors.Join(errs...)
}

// keyring holds the API keys of the frontend. A nil keyring means the API
// is open. It is safe for concurrent use; Reload swaps the whole set.
type keyring struct {
	path string
	mu   sync.RWMutex
	keys []apiKey
}

func loadKeyring(path string) (*keyring, error) {
	k := &keyring{path: path}
	if err := k.reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// reload reads the file again; on any error the keys in use stay.
func (k *keyring) reload() error {
	data, err := os.ReadFile(k.path)
	if err != nil {
		return fmt.Errorf("read API keys: %w", err)
	}
	keys, err := parseKeys(data)
	if err != nil {
		return fmt.Errorf("API keys file %s: %w", k.path, err)
	}
	k.mu.Lock()
	k.keys = keys
	k.mu.Unlock()
	return nil
}

// tenants lists the tenants the keys name, each once, sorted.
func (k *keyring) tenants() []string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	seen := map[string]bool{}
	var out []string
	for _, key := range k.keys {
		if !seen[key.tenant] {
			seen[key.tenant] = true
			out = append(out, key.tenant)
		}
	}
	slices.Sort(out)
	return out
}

func (k *keyring) size() int {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return len(k.keys)
}

// tenant returns the tenant of secret. It compares the secret's hash with
// every key in constant time and does not stop at a match, so the time taken
// says nothing about which key (if any) matched.
func (k *keyring) tenant(secret string) (string, bool) {
	h := sha256.Sum256([]byte(secret))
	k.mu.RLock()
	defer k.mu.RUnlock()
	found := -1
	for i := range k.keys {
		if subtle.ConstantTimeCompare(h[:], k.keys[i].hash[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return "", false
	}
	return k.keys[found].tenant, true
}

// ReloadKeys reads the API keys file again (on SIGHUP). On an error the
// keys in use stay and the error is returned; without a keys file it does
// nothing.
func (fe *Frontend) ReloadKeys() error {
	if fe.keys == nil {
		return nil
	}
	if err := fe.keys.reload(); err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	fe.log.Info("API keys reloaded", "keys", fe.keys.size())
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
		tenant, ok := fe.keys.tenant(secret)
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

// attachFor follows the request that the caller of r names public, if it
// may see it; for anyone else it is streams.ErrNotFound, as for an id that
// does not exist. The caller holds one reference.
func (fe *Frontend) attachFor(r *http.Request, public string) (*runner.Request, error) {
	tenant := tenantOf(r)
	id, ok := requestID(tenant, public)
	if !ok {
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, public)
	}
	t, err := fe.runtime.Attach(r.Context(), id)
	if err != nil {
		return nil, err
	}
	var acc events.RequestAccepted
	t.View(func(p *projections.Request) { acc = p.Accepted })
	if !mayAccess(tenant, acc) {
		t.Release()
		return nil, fmt.Errorf("%w: %s", streams.ErrNotFound, public)
	}
	return t, nil
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

// parentOf is the internal id of r's X-Parent-Request-Id ("" for none),
// once checkParent allows it.
func (fe *Frontend) parentOf(r *http.Request, tenant string) (string, *apiError) {
	parent := r.Header.Get(headerParentID)
	if parent == "" {
		return "", nil
	}
	if !streams.ValidRequestID(parent) {
		return "", badRequest("invalid_parent_id", "%s must be a request id", headerParentID)
	}
	if apiErr := fe.checkParent(r.Context(), tenant, parent); apiErr != nil {
		return "", apiErr
	}
	id, _ := requestID(tenant, parent)
	return id, nil
}

// checkParent checks that tenant may hang a child off parent (its own
// request, or any as the admin) and that the parent has room for one more
// child (Config.MaxChildren).
func (fe *Frontend) checkParent(ctx context.Context, tenant, parent string) *apiError {
	missing := &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "parent_not_found",
		message: fmt.Sprintf("parent request %q (%s) is not in the log", parent, headerParentID)}
	id, ok := requestID(tenant, parent)
	if !ok {
		return missing
	}
	p, err := fe.runtime.Load(ctx, id)
	if errors.Is(err, streams.ErrNotFound) {
		return missing
	}
	if err != nil {
		return &apiError{status: http.StatusInternalServerError, typ: "server_error", code: "log_unavailable", message: err.Error()}
	}
	if !mayAccess(tenant, p.Accepted) {
		return missing
	}
	if len(p.Children) >= fe.cfg.Runtime.MaxChildren {
		return badRequest("too_many_children", "parent request %s has %d children, the limit (--max-children)", parent, len(p.Children))
	}
	return nil
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

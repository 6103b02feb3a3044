package frontend

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/baton-dev/baton/services/frontend/apikeys"
)

// TestAuthenticate: with a keys file every path but the probes, /metrics and
// the console's page needs a known bearer key, the console's data the
// admin's; a request that passes carries its tenant. Without one every
// request passes as the empty tenant.
func TestAuthenticate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("alice alice-secret-0123456789\nadmin admin-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := apikeys.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, auth string
		open             bool // no keys file
		want             int
		wantTenant       string // of a request that passes
		wantCode         string // of a refusal
	}{
		{name: "no key", path: "/v1/models", want: 401, wantCode: "invalid_api_key"},
		{name: "not bearer", path: "/v1/models", auth: "Basic alice-secret-0123456789", want: 401, wantCode: "invalid_api_key"},
		{name: "bearer without a key", path: "/v1/models", auth: "Bearer  ", want: 401, wantCode: "invalid_api_key"},
		{name: "an unknown key", path: "/v1/models", auth: "Bearer nobody-secret-0123456789", want: 401, wantCode: "invalid_api_key"},
		{name: "alice", path: "/v1/models", auth: "Bearer alice-secret-0123456789", want: 200, wantTenant: "alice"},
		{name: "the scheme in any case", path: "/v1/models", auth: "bearer alice-secret-0123456789", want: 200, wantTenant: "alice"},
		{name: "alice on the console's data", path: "/v1/console/requests", auth: "Bearer alice-secret-0123456789", want: 403, wantCode: "permission_denied"},
		{name: "the admin on the console's data", path: "/v1/console/requests", auth: "Bearer admin-secret-0123456789", want: 200, wantTenant: "admin"},
		{name: "a probe", path: "/health", want: 200},
		{name: "the console's page", path: "/console/index.html", want: 200},
		{name: "an open API", path: "/v1/models", open: true, want: 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fe := &Frontend{keys: keys}
			if tc.open {
				fe.keys = nil
			}
			tenant := "-"
			h := fe.authenticate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tenant = tenantOf(r) }))
			r := httptest.NewRequest(http.MethodGet, tc.path, nil)
			if tc.auth != "" {
				r.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			if rec.Code != tc.want {
				t.Fatalf("got %d %s, want %d", rec.Code, rec.Body, tc.want)
			}
			if tc.want == 200 {
				if tenant != tc.wantTenant {
					t.Errorf("got tenant %q, want %q", tenant, tc.wantTenant)
				}
				return
			}
			if tenant != "-" {
				t.Errorf("a refused request reached the handler as tenant %q", tenant)
			}
			var body struct {
				Error struct{ Code string }
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Code != tc.wantCode {
				t.Errorf("got %s, want code %s", rec.Body, tc.wantCode)
			}
			if tc.want == 401 && rec.Header().Get("WWW-Authenticate") == "" {
				t.Error("a 401 without WWW-Authenticate")
			}
		})
	}
}

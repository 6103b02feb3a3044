package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestRegressionNoTokenFailureIs503 is issue 14 item 7: under the default
// --migration-limit 0, an attempt that fails before producing a token
// answers 503 with Retry-After (a retry is safe), not 500.
func TestRegressionNoTokenFailureIs503(t *testing.T) {
	t.Parallel()
	_, fe, _ := migrationStack(t, 1, 200, false, []string{"--mock-engine-error-after", "1"})
	first := post(t, fe.url+"/v1/completions", completion("served before the engine breaks", 5), nil)
	io.Copy(io.Discard, first.Body)
	first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first request: status %d, want 200", first.StatusCode)
	}
	resp := post(t, fe.url+"/v1/completions", completion("the engine fails before the first token", 5), nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var eb struct {
		Error *apiErrorBody `json:"error"`
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q, body %s: want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if json.Unmarshal(body, &eb) != nil || eb.Error == nil || eb.Error.Code != "migration_disabled" || eb.Error.Type != "service_unavailable" {
		t.Errorf("body %s: want an OpenAI error, code migration_disabled, type service_unavailable", body)
	}
}

// TestRegressionMigrationCountedOnce is issue 9's "the migration counter
// counts re-dispatches that happened": both workers crash after 5 tokens,
// so the request migrates once to the second worker, and when that one
// crashes too the second migration decision finds no worker. Two decisions
// are in the log; one re-dispatch happened, and the counter says 1.
func TestRegressionMigrationCountedOnce(t *testing.T) {
	t.Parallel()
	_, fe, _ := migrationStack(t, 2, 100, true, []string{"--mock-crash-after-tokens", "5"}, "--migration-limit", "3")
	prompt := "counted once"
	res, _ := streamWithin(t, 30*time.Second, fe, "once", completion(prompt, 50), nil)
	checkCleanError(t, res, prompt, 50)
	st := fe.fullState(t, "once")
	if len(st.Migrations) != 2 || len(st.Attempts) != 2 {
		t.Fatalf("migrations %+v, attempts %+v: want two migration decisions and two attempts", st.Migrations, st.Attempts)
	}
	if got := fe.metric(t, "dynamo_frontend_model_migration_total", "model", "mock", "migration_type", "ongoing_request"); got != 1 {
		t.Errorf("ongoing_request migrations = %v for one re-dispatch, want 1", got)
	}
}

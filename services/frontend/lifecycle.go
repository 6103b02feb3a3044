package frontend

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/baton-dev/baton/migrations"
	"github.com/baton-dev/baton/services/frontend/tenants"
	"github.com/baton-dev/baton/services/retention"
)

// codeLogFull is the error code of a request refused or ended because the
// request log is full.
const codeLogFull = migrations.CodeLogFull

// writeRecordError answers a request whose accepted event could not be
// stored: 503 log_full (with Retry-After) when the log is above its
// high-water mark or full, 500 log_unavailable otherwise.
func writeRecordError(w http.ResponseWriter, what string, err error) {
	var full *retention.FullError
	if errors.As(err, &full) {
		w.Header().Set("Retry-After", tenants.RetryAfter(retention.RetryAfter))
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", codeLogFull, full.Error())
		return
	}
	writeError(w, http.StatusInternalServerError, "server_error", "log_unavailable", fmt.Sprintf("could not record %s: %v", what, err))
}

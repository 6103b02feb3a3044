package frontend

import (
	"net/http"
	"strings"

	"github.com/baton-dev/baton/streams"
)

// echoRequestID sets the X-Request-Id response header to id when id can
// name a request. An invalid one is not echoed: formerly a 100,000-byte
// X-Request-Id came back verbatim in the response's headers.
func echoRequestID(w http.ResponseWriter, id string) {
	if streams.ValidRequestID(id) {
		w.Header().Set(headerRequestID, id)
	}
}

// createsInOtherTenant reports whether the admin, creating a request, names
// it in another tenant's namespace ("alice:x1"): formerly that request
// then took alice's own id x1, which answered her 404 on create. The admin
// names existing requests by internal id, but creates in its own.
func createsInOtherTenant(tenant, public string) bool {
	return tenant == streams.AdminTenant && strings.Contains(public, streams.TenantSeparator)
}

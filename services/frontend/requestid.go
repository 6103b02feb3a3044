package frontend

import (
	"net/http"
	"strings"

	"github.com/baton-dev/baton/streams"
)

// maxEchoedID is the longest invalid X-Request-Id echoed back: a valid one
// is at most 257 bytes (tenant, ':', id).
const maxEchoedID = 257

// echoRequestID sets the X-Request-Id response header to id, as every
// response carries it, unless id is longer than any valid id could be:
// formerly a 100,000-byte X-Request-Id came back verbatim in the response's
// headers. (An invalid id of a normal length is echoed, so that a client
// can match the 400 to its request.)
func echoRequestID(w http.ResponseWriter, id string) {
	if streams.ValidRequestID(id) || len(id) <= maxEchoedID {
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

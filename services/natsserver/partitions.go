package natsserver

import (
	"regexp"
	"strings"

	"github.com/baton-dev/baton/streams"
)

// requestGrant is a quoted grant that names the stream BATON_REQUESTS as a
// subject token ("$JS.API.DIRECT.GET.BATON_REQUESTS.>").
var requestGrant = regexp.MustCompile(`"([^"]*\.)` + streams.RequestsStream + `((?:\.[^"]*)?)"`)

// ForPartitions expands a permission set written for a request log of one
// stream (BATON_REQUESTS), such as docs/deployment.md's, to a log of n
// partitions: every grant that names BATON_REQUESTS is granted for each
// partition's stream too (NATS wildcards match whole tokens only, so
// BATON_REQUESTS_* cannot be written). The grant for BATON_REQUESTS itself
// stays: discovery asks for its info first. With n = 1 perms is returned as is.
func ForPartitions(perms string, n int) string {
	p := streams.Partitions(n)
	if p.Count() == 1 {
		return perms
	}
	return requestGrant.ReplaceAllStringFunc(perms, func(grant string) string {
		m := requestGrant.FindStringSubmatch(grant)
		out := []string{grant}
		for _, name := range p.Streams() {
			out = append(out, `"`+m[1]+name+m[2]+`"`)
		}
		return strings.Join(out, ", ")
	})
}

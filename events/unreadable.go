package events

import (
	"fmt"
	"strconv"
	"strings"
)

// Unreadable stands for a stored event this build cannot read: a type it
// does not know (a fact added by a newer build, or a newer or retired
// version of a known one), or data that does not decode as its type.
// Unmarshal returns it, with the error that says why, so that a reader can
// step over the event (its sequence is known) and say why it did, as
// `baton replay` does; it never changes a fold's state. It is never written:
// Marshal refuses it.
type Unreadable struct {
	Type   string `json:"type"`   // the ce-type as stored
	Reason string `json:"reason"` // why this build does not read it, in plain words
}

// EventType is the stored event's own type.
func (u Unreadable) EventType() string { return u.Type }

// versioned splits "baton.request.routed.v1" into "baton.request.routed"
// and 1; ok is false for a type without a ".v<N>" suffix.
func versioned(typ string) (base string, version int, ok bool) {
	i := strings.LastIndex(typ, ".v")
	if i <= 0 {
		return "", 0, false
	}
	v, err := strconv.Atoi(typ[i+2:])
	if err != nil || v < 0 {
		return "", 0, false
	}
	return typ[:i], v, true
}

// unknownReason says why a type is not in the registry: a newer or an older
// version of a type this build reads, or a type it has never heard of.
func unknownReason(typ string) string {
	base, v, ok := versioned(typ)
	if !ok {
		return "unknown event type (not a versioned baton type)"
	}
	var known []int
	for t := range registry {
		if b, kv, ok := versioned(t); ok && b == base {
			known = append(known, kv)
		}
	}
	if len(known) == 0 {
		return "unknown event type (written by a newer build?)"
	}
	newest := known[0]
	for _, kv := range known {
		newest = max(newest, kv)
	}
	if v > newest {
		return fmt.Sprintf("newer version v%d of %s (this build reads up to v%d)", v, base, newest)
	}
	return fmt.Sprintf("version v%d of %s is no longer read (this build reads v%d)", v, base, newest)
}

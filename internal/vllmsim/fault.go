package vllmsim

import (
	"fmt"
	"strconv"
	"strings"
)

// FaultHeader scripts a fault for one request; its value is a ParseFault spec.
const FaultHeader = "X-Vllmsim-Fault"

// Fault kinds.
const (
	FaultStatus    = "status"    // an HTTP error (Status, Retry-After RetryAfter s)
	FaultCut       = "cut"       // the connection is cut
	FaultMalformed = "malformed" // a chunk that is not JSON
	FaultNoDone    = "nodone"    // the stream ends with no finish_reason and no [DONE]
	FaultStall     = "stall"     // nothing more is sent; the connection stays open
	FaultPolicy    = "policy"    // 400 content policy violation
	FaultContext   = "context"   // 400 context length exceeded
)

// Fault is a scripted failure, After tokens into the answer.
type Fault struct {
	Kind       string
	Status     int
	RetryAfter int // seconds; 0: no Retry-After header
	After      int
}

// ParseFault reads a spec "what[@N]": what is an HTTP status with an
// optional Retry-After in seconds ("500", "429:2", "503:1"), or one of cut,
// malformed, nodone, stall, policy, context; N is the number of tokens sent
// before the fault (default 0: before the first). An empty spec is no fault.
func ParseFault(spec string) (*Fault, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, nil
	}
	what, after, hasAfter := strings.Cut(spec, "@")
	f := &Fault{}
	if hasAfter {
		n, err := strconv.Atoi(after)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("vllmsim: fault %q: bad token count %q", spec, after)
		}
		f.After = n
	}
	switch what {
	case FaultCut, FaultMalformed, FaultNoDone, FaultStall:
		f.Kind = what
	case FaultPolicy, FaultContext:
		if f.After != 0 {
			return nil, fmt.Errorf("vllmsim: fault %q: %s happens before the first token", spec, what)
		}
		f.Kind = what
	default:
		code, ra, hasRA := strings.Cut(what, ":")
		n, err := strconv.Atoi(code)
		if err != nil || n < 400 || n > 599 {
			return nil, fmt.Errorf("vllmsim: fault %q: want an HTTP status 400-599 or one of cut, malformed, nodone, stall, policy, context", spec)
		}
		f.Kind, f.Status = FaultStatus, n
		if hasRA {
			s, err := strconv.Atoi(ra)
			if err != nil || s < 0 {
				return nil, fmt.Errorf("vllmsim: fault %q: bad Retry-After %q", spec, ra)
			}
			f.RetryAfter = s
		}
	}
	return f, nil
}

// String is f's spec.
func (f *Fault) String() string {
	if f == nil {
		return ""
	}
	what := f.Kind
	if f.Kind == FaultStatus {
		what = strconv.Itoa(f.Status)
		if f.RetryAfter > 0 {
			what += ":" + strconv.Itoa(f.RetryAfter)
		}
	}
	return what + "@" + strconv.Itoa(f.After)
}

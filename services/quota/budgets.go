package quota

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/baton-dev/baton/streams"
)

// Budget is one tenant's budget. A zero field means none (unlimited),
// except Weight, whose zero means the default, 1.
type Budget struct {
	RPM        int64   // completions and responses created per minute
	TPM        int64   // tokens per minute, prompt + completion (reserved: prompt + max tokens)
	Concurrent int     // concurrent requests, background responses included
	Weight     float64 // weight for fair admission (parsed and kept; not used yet)
	Log        float64 // share of the request log's bytes, 0 to 1; 0: none (the whole log)
}

// Budgets are the budgets of every tenant: Tenants' lines, and Default's
// RPM and TPM (--tenant-rpm, --tenant-tpm) for the fields a tenant's line
// does not set, or a tenant without a line.
type Budgets struct {
	Default Budget
	Tenants map[string]Budget
}

// For is tenant's budget, with the defaults filled in.
func (b Budgets) For(tenant string) Budget {
	t, ok := b.Tenants[tenant]
	if !ok {
		return Budget{RPM: b.Default.RPM, TPM: b.Default.TPM, Weight: 1}
	}
	if t.RPM == 0 {
		t.RPM = b.Default.RPM
	}
	if t.TPM == 0 {
		t.TPM = b.Default.TPM
	}
	if t.Weight == 0 {
		t.Weight = 1
	}
	return t
}

// LogShares reports whether any tenant has a share of the request log
// (log=F below 1): without one a frontend accounts no tenant's bytes.
func (b Budgets) LogShares() bool {
	for _, t := range b.Tenants {
		if t.Log > 0 {
			return true
		}
	}
	return false
}

// Shared reports whether any tenant has a per-minute budget, which is
// what the shared bucket holds: without one a frontend sends nothing to it.
func (b Budgets) Shared() bool {
	if b.Default.RPM > 0 || b.Default.TPM > 0 {
		return true
	}
	for _, t := range b.Tenants {
		if t.RPM > 0 || t.TPM > 0 {
			return true
		}
	}
	return false
}

// Hash is a short digest of b, the same on every frontend given the same
// file and defaults: frontends compare it to find one whose budgets differ.
func (b Budgets) Hash() string {
	names := make([]string, 0, len(b.Tenants))
	for n := range b.Tenants {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	fmt.Fprintf(h, "default %d %d\n", b.Default.RPM, b.Default.TPM)
	for _, n := range names {
		t := b.Tenants[n]
		fmt.Fprintf(h, "%s %d %d %d %g", n, t.RPM, t.TPM, t.Concurrent, t.Weight)
		if t.Log > 0 { // a file without log= hashes as it did before log= was enforced
			fmt.Fprintf(h, " log=%g", t.Log)
		}
		fmt.Fprintln(h)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Parse reads a budgets file: lines "TENANT key=value…", '#' starts a
// comment, blank lines are skipped, one line per tenant. Keys are rpm, tpm
// and concurrent (whole numbers, at least 1), weight (a number above 0) and
// log (a share of the request log's bytes above 0, at most 1; 1 is the
// whole log, as without it). Every problem is reported,
// with its line number.
func Parse(data []byte) (map[string]Budget, error) {
	out := map[string]Budget{}
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		tenant := fields[0]
		if !streams.ValidID(tenant) {
			errs = append(errs, fmt.Errorf("line %d: tenant %q: want 1 to 128 letters, digits, '-' or '_'", n, tenant))
			continue
		}
		if _, dup := out[tenant]; dup {
			errs = append(errs, fmt.Errorf("line %d: tenant %s has a line already", n, tenant))
			continue
		}
		b, err := parseFields(fields[1:])
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: tenant %s: %w", n, tenant, err))
			continue
		}
		out[tenant] = b
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// maxPerMinute bounds rpm and tpm, so that sums of them stay exact.
const maxPerMinute = 1 << 40

func parseFields(fields []string) (Budget, error) {
	var b Budget
	var errs []error
	seen := map[string]bool{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok || v == "" {
			errs = append(errs, fmt.Errorf("%q: want key=value", f))
			continue
		}
		if seen[k] {
			errs = append(errs, fmt.Errorf("%s given twice", k))
			continue
		}
		seen[k] = true
		switch k {
		case "rpm", "tpm", "concurrent":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 || n > maxPerMinute {
				errs = append(errs, fmt.Errorf("%s=%s: want a whole number from 1 to %d", k, v, int64(maxPerMinute)))
				continue
			}
			switch k {
			case "rpm":
				b.RPM = n
			case "tpm":
				b.TPM = n
			default:
				b.Concurrent = int(min(n, math.MaxInt32))
			}
		case "weight":
			w, err := strconv.ParseFloat(v, 64)
			if err != nil || !(w > 0) || math.IsInf(w, 0) || w > 1e6 {
				errs = append(errs, fmt.Errorf("weight=%s: want a number above 0, at most 1e6", v))
				continue
			}
			b.Weight = w
		case "log":
			s, err := strconv.ParseFloat(v, 64)
			if err != nil || !(s > 0 && s <= 1) {
				errs = append(errs, fmt.Errorf("log=%s: want a share above 0, at most 1", v))
				continue
			}
			if s < 1 {
				b.Log = s
			}
		default:
			errs = append(errs, fmt.Errorf("unknown key %q (want rpm, tpm, concurrent, log or weight)", k))
		}
	}
	return b, errors.Join(errs...)
}

package apikeys

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestParseKeys(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		tenants []string // of the keys, in order
		err     string
	}{
		{"comments and blanks", "# keys\n\nalice  0123456789abcdef # rotated monthly\n  bob\t0123456789abcdefXY\n", []string{"alice", "bob"}, ""},
		{"two keys of one tenant", "alice 0123456789abcdef\nalice fedcba9876543210\n", []string{"alice", "alice"}, ""},
		{"empty", "# nobody\n", nil, ""},
		{"short secret", "alice short\n", nil, "line 1: the secret of tenant alice is shorter than 16 bytes"},
		{"one field", "alice\n", nil, "line 1: want TENANT SECRET, got 1 fields"},
		{"three fields", "alice 0123456789abcdef extra\n", nil, "got 3 fields"},
		{"bad tenant", "al.ice 0123456789abcdef\n", nil, `tenant "al.ice"`},
		{"tenant with the separator", "al:ice 0123456789abcdef\n", nil, `tenant "al:ice"`},
		{"shared secret", "alice 0123456789abcdef\nbob 0123456789abcdef\n", nil, "line 2: tenants alice and bob share a secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys, err := parseKeys([]byte(tt.file))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, k := range keys {
				got = append(got, k.tenant)
			}
			if strings.Join(got, ",") != strings.Join(tt.tenants, ",") {
				t.Errorf("got tenants %v, want %v", got, tt.tenants)
			}
			if strings.Contains(tt.file, "0123456789abcdef") && strings.Contains(strings.ToLower(string(mustJSON(keys))), "0123456789abcdef") {
				t.Error("a secret is kept in memory in clear")
			}
		})
	}
}

func mustJSON(keys []apiKey) []byte {
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k.tenant)
		b.Write(k.hash[:])
	}
	return []byte(b.String())
}

func TestKeyringReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("alice 0123456789abcdef\n")
	k, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	check := func(secret, want string) {
		t.Helper()
		got, ok := k.Tenant(secret)
		if got != want || ok != (want != "") {
			t.Errorf("Tenant(%q) = %q, %v; want %q", secret, got, ok, want)
		}
	}
	check("0123456789abcdef", "alice")
	check("0123456789abcdeF", "")
	check("", "")
	write("bob fedcba9876543210\n")
	if err := k.Reload(); err != nil {
		t.Fatal(err)
	}
	check("0123456789abcdef", "")
	check("fedcba9876543210", "bob")
	write("bob x\n")
	if err := k.Reload(); err == nil {
		t.Fatal("a bad file reloaded")
	}
	check("fedcba9876543210", "bob") // the keys in use stay
}

// BenchmarkKeyringTenant is the cost of one key check against n keys (every
// hash is compared, constant time).
func BenchmarkKeyringTenant(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			var file strings.Builder
			for i := range n {
				fmt.Fprintf(&file, "t%d secret-%016d\n", i, i)
			}
			keys, err := parseKeys([]byte(file.String()))
			if err != nil {
				b.Fatal(err)
			}
			k := &Keyring{keys: keys}
			secret := fmt.Sprintf("secret-%016d", n/2)
			for b.Loop() {
				if _, ok := k.Tenant(secret); !ok {
					b.Fatal("not found")
				}
			}
		})
	}
}

// Package apikeys is the frontend's API keys file: lines of "TENANT
// SECRET", parsed and checked whole (every problem reported with its line),
// held as the secrets' hashes only, reloaded in one swap, and looked up in
// constant time.
package apikeys

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/baton-dev/baton/streams"
)

// MinSecretLen is the shortest API key secret accepted in a keys file.
const MinSecretLen = 16

// apiKey is one line of the keys file. Only the secret's hash is kept.
type apiKey struct {
	tenant string
	hash   [sha256.Size]byte
}

// parseKeys reads a keys file: lines of "TENANT SECRET", '#' starts a
// comment, blank lines are skipped. Tenants are ValidIDs; a tenant may have
// several keys (rotation); a secret is at least MinSecretLen bytes and names
// one tenant only. Every problem is reported, with its line number.
func parseKeys(data []byte) ([]apiKey, error) {
	var keys []apiKey
	var errs []error
	seen := map[[sha256.Size]byte]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
			continue
		case len(fields) != 2:
			errs = append(errs, fmt.Errorf("line %d: want TENANT SECRET, got %d fields", n, len(fields)))
			continue
		case !streams.ValidID(fields[0]):
			errs = append(errs, fmt.Errorf("line %d: tenant %q: want 1 to 128 letters, digits, '-' or '_'", n, fields[0]))
			continue
		case len(fields[1]) < MinSecretLen:
			errs = append(errs, fmt.Errorf("line %d: the secret of tenant %s is shorter than %d bytes", n, fields[0], MinSecretLen))
			continue
		}
		k := apiKey{tenant: fields[0], hash: sha256.Sum256([]byte(fields[1]))}
		if prev, ok := seen[k.hash]; ok && prev != k.tenant {
			errs = append(errs, fmt.Errorf("line %d: tenants %s and %s share a secret", n, prev, k.tenant))
			continue
		}
		seen[k.hash] = k.tenant
		keys = append(keys, k)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	return keys, errors.Join(errs...)
}

// Keyring holds the API keys of a frontend. A nil Keyring means the API
// is open. It is safe for concurrent use; Reload swaps the whole set.
type Keyring struct {
	path string
	mu   sync.RWMutex
	keys []apiKey
}

// Load reads the keys file at path (parseKeys).
func Load(path string) (*Keyring, error) {
	k := &Keyring{path: path}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload reads the file again; on any error the keys in use stay.
func (k *Keyring) Reload() error {
	data, err := os.ReadFile(k.path)
	if err != nil {
		return fmt.Errorf("read API keys: %w", err)
	}
	keys, err := parseKeys(data)
	if err != nil {
		return fmt.Errorf("API keys file %s: %w", k.path, err)
	}
	k.mu.Lock()
	k.keys = keys
	k.mu.Unlock()
	return nil
}

// Size is how many keys are loaded.
func (k *Keyring) Size() int {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return len(k.keys)
}

// Tenant returns the tenant of secret. It compares the secret's hash with
// every key in constant time and does not stop at a match, so the time taken
// says nothing about which key (if any) matched.
func (k *Keyring) Tenant(secret string) (string, bool) {
	h := sha256.Sum256([]byte(secret))
	k.mu.RLock()
	defer k.mu.RUnlock()
	found := -1
	for i := range k.keys {
		if subtle.ConstantTimeCompare(h[:], k.keys[i].hash[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return "", false
	}
	return k.keys[found].tenant, true
}

// Tenants lists the tenants the keys name, each once, sorted.
func (k *Keyring) Tenants() []string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	seen := map[string]bool{}
	var out []string
	for _, key := range k.keys {
		if !seen[key.tenant] {
			seen[key.tenant] = true
			out = append(out, key.tenant)
		}
	}
	slices.Sort(out)
	return out
}

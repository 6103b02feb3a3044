package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/natsserver"
	"github.com/nats-io/nats-server/v2/server"
)

// permissionBlocks reads the least-privilege permission sets for frontends
// and workers from docs/deployment.md, so that the documented sets are the
// ones tested.
func permissionBlocks(t *testing.T) (frontendPerms, workerPerms string) {
	t.Helper()
	doc, err := os.ReadFile("../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)### Least-privilege permissions.*?```\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/deployment.md has no permission block")
	}
	block := string(m[1])
	parts := regexp.MustCompile(`(?m)^# (frontend|worker)$`).Split(block, -1)
	if len(parts) != 3 || strings.TrimSpace(parts[0]) != "" {
		t.Fatalf("permission block is not '# frontend ... # worker ...': %s", block)
	}
	return parts[1], parts[2]
}

// violations collects the server's permission-violation log lines.
type violations struct {
	mu    sync.Mutex
	lines []string
}

func (v *violations) log(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	if strings.Contains(line, "Violation") {
		v.mu.Lock()
		v.lines = append(v.lines, line)
		v.mu.Unlock()
	}
}
func (v *violations) Noticef(f string, a ...any) { v.log(f, a...) }
func (v *violations) Warnf(f string, a ...any)   { v.log(f, a...) }
func (v *violations) Fatalf(f string, a ...any)  { v.log(f, a...) }
func (v *violations) Errorf(f string, a ...any)  { v.log(f, a...) }
func (v *violations) Debugf(f string, a ...any)  { v.log(f, a...) }
func (v *violations) Tracef(f string, a ...any)  { v.log(f, a...) }

func (v *violations) all() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.lines...)
}

// TestLeastPrivilegePermissions runs a frontend and two workers as users
// holding exactly the permission sets of docs/deployment.md, on a server that
// enforces them: a stream, a migration after a worker is killed, a resume and
// a cancel all work, and the server logs no permission violation. It runs
// with one request stream, and with three partitions and the sets expanded
// as the docs say (natsserver.ForPartitions).
func TestLeastPrivilegePermissions(t *testing.T) {
	t.Parallel()
	for _, partitions := range []int{1, 3} {
		t.Run(fmt.Sprintf("partitions=%d", partitions), func(t *testing.T) { leastPrivilege(t, partitions) })
	}
}

func leastPrivilege(t *testing.T, partitions int) {
	fePerms, wkPerms := permissionBlocks(t)
	fePerms, wkPerms = natsserver.ForPartitions(fePerms, partitions), natsserver.ForPartitions(wkPerms, partitions)
	port := freePort(t)
	conf := fmt.Sprintf(`
listen: 127.0.0.1:%d
server_name: perms
jetstream { store_dir: %q }
accounts {
  BATON {
    jetstream: enabled
    users: [
      {user: frontend, password: fpw, permissions: {
%s
}}
      {user: worker, password: wpw, permissions: {
%s
allow_responses: true
}}
    ]
  }
  SYS { users: [{user: sys, password: spw}] }
}
system_account: SYS
`, port, t.TempDir(), fePerms, wkPerms)
	opts := &server.Options{}
	if err := opts.ProcessConfigString(conf); err != nil {
		t.Fatalf("server config from the documented permissions: %v\n%s", err, conf)
	}
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	v := &violations{}
	srv.SetLoggerV2(v, false, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(srv.Shutdown)

	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	s := &stack{t: t, dir: t.TempDir(), natsURL: url, workers: map[string]*proc{}, partitions: partitions}
	sys := fmt.Sprintf("nats://sys:spw@127.0.0.1:%d", port)
	// --tenant-rpm: the budgets bucket is read, written and watched (a
	// budget too large to refuse anything) under the documented grants.
	f1 := s.frontend(nil, "--nats-user", "frontend", "--nats-password", "fpw", "--nats-system-url", sys, "--migration-limit", "3", "--tenant-rpm", "1000000")
	f2 := s.frontend(nil, "--nats-user", "frontend", "--nats-password", "fpw", "--nats-system-url", sys, "--migration-limit", "3", "--tenant-rpm", "1000000")
	s.workerEnv = []string{"NATS_USER=worker", "NATS_PASSWORD=wpw"}
	s.worker("w1", "--mock-tokens-per-sec", "150", "--mock-ttft", "10ms")
	s.worker("w2", "--mock-tokens-per-sec", "150", "--mock-ttft", "10ms")
	f1.waitRoutable(t, "w1", "w2")

	// A migration (the serving worker is killed), then a frontend crash and a
	// resume on the other one.
	prompt := "least privilege"
	var once, once2 sync.Once
	first := postStream(t, f1.url, "/v1/completions", map[string]any{"model": "mock", "prompt": prompt, "max_tokens": 120},
		map[string]string{"X-Request-Id": "perm-1", "X-Resumable": "true"}, func(e sseEvent) {
			n := 0
			fmt.Sscan(e.id, &n)
			if n >= 20 {
				once.Do(func() { s.workers[f1.servingWorker(t, "perm-1")].signal(syscall.SIGKILL) })
			}
			if n >= 60 {
				once2.Do(func() { f1.signal(syscall.SIGKILL) })
			}
		})
	rest := resume(t, f2, "perm-1", lastID(first))
	joined(t, first, rest, prompt, 120)
	if st := f2.state(t, "perm-1"); len(st.Migrations) != 1 {
		t.Errorf("migrations = %+v, want one", st.Migrations)
	}
	// A cancel, through the remaining frontend.
	go func() {
		waitFor(t, 10*time.Second, "perm-2 to run", func() bool {
			resp, err := http.Get(f2.url + "/v1/requests/perm-2")
			if err != nil {
				return false
			}
			var st requestState
			_ = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			return resp.StatusCode == 200 && st.TokensGenerated > 5
		})
		cancelRequest(t, f2, "perm-2", "kill")
	}()
	killed := postStream(t, f2.url, "/v1/completions", map[string]any{"model": "mock", "prompt": "cancel me", "max_tokens": 2000},
		map[string]string{"X-Request-Id": "perm-2"}, nil)
	if killed.done || !strings.Contains(killed.errorBody, "cancel") {
		t.Errorf("killed stream: done=%v error=%q", killed.done, killed.errorBody)
	}
	// A worker's graceful shutdown (its lease, load and watchers end) under the set.
	for id, p := range s.workers {
		if p.running() {
			p.signal(syscall.SIGTERM)
			if code := p.wait(30 * time.Second); code != 0 {
				t.Errorf("worker %s exited %d after SIGTERM", id, code)
			}
		}
	}
	if vs := v.all(); len(vs) > 0 {
		t.Errorf("the server logged %d permission violations with the documented sets:\n%s", len(vs), strings.Join(vs, "\n"))
	}
}

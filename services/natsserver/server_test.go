package natsserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestResolveSysPassword(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	c := Config{StoreDir: dir}
	file, err := c.ResolveSysPassword()
	if err != nil {
		t.Fatal(err)
	}
	if file != filepath.Join(dir, SysPasswordFile) || len(c.SysPassword) < 24 {
		t.Fatalf("got file %q, password %q; want a long password in %s", file, c.SysPassword, filepath.Join(dir, SysPasswordFile))
	}
	st, err := os.Stat(file)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("password file: %v, mode %v; want 0600", err, st.Mode().Perm())
	}
	again := Config{StoreDir: dir}
	if _, err := again.ResolveSysPassword(); err != nil || again.SysPassword != c.SysPassword {
		t.Errorf("second start: %q, %v; want the stored %q", again.SysPassword, err, c.SysPassword)
	}
	other := Config{StoreDir: filepath.Join(t.TempDir(), "other")}
	if _, err := other.ResolveSysPassword(); err != nil || other.SysPassword == c.SysPassword {
		t.Errorf("another store got %q (%v), want a different password", other.SysPassword, err)
	}
	given := Config{StoreDir: dir, SysPassword: "from-the-flag"}
	if file, err := given.ResolveSysPassword(); err != nil || file != "" || given.SysPassword != "from-the-flag" {
		t.Errorf("a given password: %q %q %v", given.SysPassword, file, err)
	}
	mem := Config{InMemory: true}
	if _, err := mem.ResolveSysPassword(); err != nil || mem.SysPassword == "" {
		t.Errorf("in memory: %q %v", mem.SysPassword, err)
	}
}

func TestClusterConfig(t *testing.T) {
	c := Config{StoreDir: "x", ClusterName: "c", ClusterPort: 6222, Routes: []string{"nats-route://n2:6222", "nats-route://u:p@n3:6222"},
		ClusterUser: "route", ClusterPassword: "s3cret", ClusterTLSCert: "c.pem", ClusterTLSKey: "k.pem", ClusterTLSCA: "ca.pem", SysPassword: "x"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	conf := c.withDefaults().configString()
	for _, want := range []string{
		`authorization { user: "route", password: "s3cret", timeout: 2 }`,
		`tls { cert_file: "c.pem", key_file: "k.pem", ca_file: "ca.pem", verify: true`,
		`"nats-route://route:s3cret@n2:6222"`, `"nats-route://u:p@n3:6222"`,
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %s:\n%s", want, conf)
		}
	}
	for _, bad := range []Config{
		{StoreDir: "x", ClusterName: "c", ClusterPort: 1, ClusterUser: "u"},
		{StoreDir: "x", ClusterName: "c", ClusterPort: 1, ClusterTLSCert: "c", ClusterTLSKey: "k"},
		{StoreDir: "x", ClusterUser: "u", ClusterPassword: "p"},
		// Open routes beyond loopback (formerly started silently, and a rogue node joined).
		{StoreDir: "x", Host: "0.0.0.0", ClusterName: "c", ClusterPort: 1},
		{StoreDir: "x", Host: "10.0.0.1", ClusterName: "c", ClusterPort: 1},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}

func TestWorkerUsers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "workers")
	if err := os.WriteFile(path, []byte("# id password\nw1 0123456789abcdef\n\nw-2 fedcba9876543210 # second\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	users, err := ReadWorkerUsers(path)
	if err != nil || len(users) != 2 || users[1] != (WorkerUser{"w-2", "fedcba9876543210"}) {
		t.Fatalf("got %+v, %v", users, err)
	}
	for _, bad := range []string{"w1 short\n", "w.1 0123456789abcdef\n", "w1\n", "w1 0123456789abcdef\nw1 0123456789abcdeX\n"} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadWorkerUsers(path); err == nil {
			t.Errorf("%q read without an error", bad)
		}
	}
	perms, err := PinWorker(WorkerPermissions, "w7")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"baton.workers.w7.events"`, `"$KV.baton_leases.w7", "$KV.baton_load.w7"`, `"baton.dispatch.w7"`,
		`"baton.requests.*.*.tokens.*.w7"`, `"baton.checks.w7"`, `"baton.commands.w7"`, `"_INBOX_worker.w7.>"`,
		`"baton.outputs.w7"`, `"baton.out.w7.d.*"`, `"$JS.API.STREAM.INFO.BATON_OUT_w7"`} {
		if !strings.Contains(perms, want) {
			t.Errorf("pinned permissions lack %s:\n%s", want, perms)
		}
	}
	for _, gone := range []string{`"baton.dispatch.*"`, `"$KV.baton_leases.>"`, `"baton.workers.*.events"`,
		`tokens.*.*"`, `"baton.checks.*"`, `"baton.commands.*"`, `"_INBOX_worker.*.>"`, "BATON_REQUESTS", "_INBOX.>", "baton.live",
		`"baton.outputs.*"`, `"baton.out.*`, "BATON_OUT_*",
		"STREAM.CREATE", "STREAM.UPDATE", "STREAM.INFO.>"} { // a worker creates no stream (issue 23) and lists no request ids
		if strings.Contains(perms, gone) {
			t.Errorf("pinned permissions still grant %s", gone)
		}
	}
	only, err := OutputOnly(perms)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(only, "baton.requests.") || !strings.Contains(only, `"baton.out.w7.d.*"`) || !strings.Contains(only, `"baton.workers.w7.events"`) {
		t.Errorf("OutputOnly kept the tokens grant, or dropped another:\n%s", only)
	}
	if _, err := OutputOnly(only); err == nil {
		t.Error("OutputOnly of a set without the tokens grant did not fail")
	}
	if _, err := PinWorker(`publish: ["x"]`, "w7"); err == nil {
		t.Error("a set without the grants to pin was pinned")
	}
	if err := (Config{StoreDir: "x", WorkerUsers: users}).Validate(); err == nil {
		t.Error("worker users without --user validated")
	}
}

// TestOpenRoutesOnlyOnLoopback: routes without authentication are valid on
// loopback, or beyond it only when ClusterInsecure says so.
func TestOpenRoutesOnlyOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		host     string
		insecure bool
		auth     bool
		ok       bool
	}{
		{"", false, false, true}, {"127.0.0.1", false, false, true}, {"::1", false, false, true}, {"localhost", false, false, true},
		{"0.0.0.0", false, false, false}, {"::", false, false, false}, {"192.168.1.5", false, false, false},
		{"0.0.0.0", true, false, true}, {"0.0.0.0", false, true, true},
	} {
		c := Config{StoreDir: "x", Host: tc.host, ClusterName: "c", ClusterPort: 6222, ClusterInsecure: tc.insecure}
		if tc.auth {
			c.ClusterUser, c.ClusterPassword = "route", "route-password"
		}
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("host %q insecure %v auth %v: got %v, want ok %v", tc.host, tc.insecure, tc.auth, err, tc.ok)
		}
	}
}

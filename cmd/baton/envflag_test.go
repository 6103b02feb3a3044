package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/fleet"
	"github.com/baton-dev/baton/services/frontend"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/frontend/tenants"
	"github.com/baton-dev/baton/services/retention"
	"github.com/baton-dev/baton/streams"
)

func envOf(m map[string]string) lookupFunc {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func testEnv(m map[string]string) (*environment, *bytes.Buffer, *bytes.Buffer) {
	var out, errb bytes.Buffer
	return &environment{lookup: envOf(m), stdout: &out, stderr: &errb}, &out, &errb
}

func ptr[T any](v T) *T { return &v }

// flagDefaults fills in what the flags set when not given: the limits and
// the stream retention, at their documented defaults.
func flagDefaults(c *frontend.Config) {
	c.Runtime.DispatchTimeout = runner.DefaultDispatchTimeout
	c.DefaultMaxTokens = frontend.DefaultMaxTokens
	c.MaxTokensLimit = frontend.DefaultMaxTokensLimit
	c.Runtime.MaxPromptTokens = runner.DefaultMaxPromptTokens
	c.MaxBodyBytes = frontend.DefaultMaxBodyBytes
	if c.Runtime.MaxChildren == 0 {
		c.Runtime.MaxChildren = runner.DefaultMaxChildren
	}
	c.ReadHeaderTimeout = frontend.DefaultReadHeaderTimeout
	if c.BodyTimeout == 0 {
		c.BodyTimeout = frontend.DefaultBodyTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = frontend.DefaultIdleTimeout
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = frontend.DefaultMaxConnections
	}
	if c.MaxConnectionsPerAddress == 0 {
		c.MaxConnectionsPerAddress = frontend.DefaultMaxConnectionsPerAddress
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = frontend.DefaultWriteTimeout
	}
	c.ConsoleWindow = frontend.DefaultConsoleWindow
	c.ConsoleRequests = frontend.DefaultConsoleRequests
	c.ConsoleLostWorkers = frontend.DefaultConsoleLostWorkers
	sc := &c.Runtime.Streams
	if sc.Replicas == 0 {
		sc.Replicas = 1
	}
	sc.RequestsMaxAge = streams.DefaultRequestsMaxAge
	sc.RequestsMaxBytes = streams.DefaultRequestsMaxBytes
	sc.MaxMsgsPerSubject = streams.DefaultMaxMsgsPerSubject
	sc.MaxMsgSize = streams.DefaultMaxMsgSize
	c.Runtime.Log.HighWater = retention.DefaultHighWater
	if c.Runtime.WorkerOutputMaxBytes == 0 {
		c.Runtime.WorkerOutputMaxBytes = streams.DefaultWorkerOutputMaxBytes
	}
}

func TestFrontendFlagsAndEnv(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(t *testing.T, c frontend.Config)
	}{
		{"defaults", nil, nil, func(t *testing.T, c frontend.Config) {
			want := frontend.Config{HTTPAddr: ":8000", Runtime: runner.Config{StallTimeout: 30 * time.Second, DetachTimeout: 120 * time.Second}}
			flagDefaults(&want)
			if !equalConfig(c, want) {
				t.Errorf("got %+v, want %+v", c, want)
			}
		}},
		{"env sets", nil, map[string]string{
			"DYN_HTTP_PORT": "9000", "DYN_MIGRATION_LIMIT": "3", "DYN_MIGRATION_MAX_SEQ_LEN": "100",
			"DYN_STALL_TIMEOUT_SECS": "7", "DYN_DETACH_TIMEOUT_SECS": "0.5",
			"DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD": "0.9", "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD": "512",
			"DYN_RUNTIME_INHIBITED_DURATION_SECS": "9", "DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS": "2",
			"BATON_NATS_SYSTEM_URL": "nats://sys:pw@127.0.0.1:4222",
		}, func(t *testing.T, c frontend.Config) {
			want := frontend.Config{
				HTTPAddr: ":9000", ShutdownTimeout: 2 * time.Second,
				Runtime: runner.Config{
					MigrationLimit: 3, MigrationMaxSeqLen: 100,
					StallTimeout: 7 * time.Second, DetachTimeout: 500 * time.Millisecond,
				},
				Fleet: fleet.Config{
					ActiveDecodeBlocksThreshold: ptr(0.9), ActivePrefillTokensThreshold: ptr(512),
					InhibitedDuration: 9 * time.Second, SystemURL: "nats://sys:pw@127.0.0.1:4222",
				},
			}
			flagDefaults(&want)
			if !equalConfig(c, want) {
				t.Errorf("got %+v, want %+v", c, want)
			}
		}},
		{"batched output", nil, map[string]string{"BATON_BATCHED_OUTPUT": "true", "BATON_WORKER_OUTPUT_MAX_BYTES": "1048576"},
			func(t *testing.T, c frontend.Config) {
				if !c.Runtime.BatchedOutput || c.Runtime.WorkerOutputMaxBytes != 1<<20 {
					t.Errorf("got batched output %v, worker output max bytes %d; want true, %d", c.Runtime.BatchedOutput, c.Runtime.WorkerOutputMaxBytes, 1<<20)
				}
			}},
		{"per-address cap off", []string{"--max-connections-per-address", "0"}, map[string]string{"BATON_MAX_CONNECTIONS_PER_ADDRESS": "7"},
			func(t *testing.T, c frontend.Config) {
				if c.MaxConnectionsPerAddress != -1 {
					t.Errorf("got max connections per address %d, want -1 (none)", c.MaxConnectionsPerAddress)
				}
			}},
		{"migration exact only", nil, map[string]string{"BATON_MIGRATION_EXACT_ONLY": "true"},
			func(t *testing.T, c frontend.Config) {
				if !c.Runtime.MigrationExactOnly {
					t.Error("BATON_MIGRATION_EXACT_ONLY=true: got exact-only off")
				}
			}},
		{"migration exact only flag beats env", []string{"--migration-exact-only=false"}, map[string]string{"BATON_MIGRATION_EXACT_ONLY": "true"},
			func(t *testing.T, c frontend.Config) {
				if c.Runtime.MigrationExactOnly {
					t.Error("--migration-exact-only=false: got exact-only on")
				}
			}},
		{"tenant budgets env, the flag wins", []string{"--tenant-tpm", "9000"}, map[string]string{
			"BATON_TENANT_RPM": "60", "BATON_TENANT_TPM": "1000", "BATON_TENANT_BUDGETS_FILE": "/dev/null",
		}, func(t *testing.T, c frontend.Config) {
			if c.Tenants.RPM != 60 || c.Tenants.TPM != 9000 || c.Tenants.BudgetsFile != "/dev/null" {
				t.Errorf("got rpm %d, tpm %d, file %q; want 60, 9000, /dev/null", c.Tenants.RPM, c.Tenants.TPM, c.Tenants.BudgetsFile)
			}
		}},
		{"admission queue env, the flag wins", []string{"--admission-wait", "2s"}, map[string]string{
			"BATON_ADMISSION_QUEUE": "8", "BATON_ADMISSION_WAIT": "9s",
		}, func(t *testing.T, c frontend.Config) {
			if c.Tenants.AdmissionQueue != 8 || c.Tenants.AdmissionWait != 2*time.Second {
				t.Errorf("got admission queue %d, wait %v; want 8, 2s", c.Tenants.AdmissionQueue, c.Tenants.AdmissionWait)
			}
		}},
		{"admission queue off by default", nil, nil, func(t *testing.T, c frontend.Config) {
			if c.Tenants.AdmissionQueue != 0 {
				t.Errorf("got admission queue %d, want 0 (off)", c.Tenants.AdmissionQueue)
			}
		}},
		{"log lifecycle env", nil, map[string]string{"BATON_LOG_HIGH_WATER": "0.75", "BATON_LOG_COMPACTION": "false"},
			func(t *testing.T, c frontend.Config) {
				if c.Runtime.Log.HighWater != 0.75 || !c.Runtime.NoCompaction {
					t.Errorf("got high water %v, no compaction %v; want 0.75, true", c.Runtime.Log.HighWater, c.Runtime.NoCompaction)
				}
			}},
		{"security env", nil, map[string]string{
			"BATON_MAX_CHILDREN": "7", "BATON_BODY_TIMEOUT": "3s", "BATON_IDLE_TIMEOUT": "4s",
			"BATON_MAX_CONNECTIONS": "50", "BATON_TENANT_MAX_CONCURRENT": "2", "BATON_TENANT_RPS": "2.5",
			"BATON_MAX_CONNECTIONS_PER_ADDRESS": "9",
		}, func(t *testing.T, c frontend.Config) {
			want := frontend.Config{HTTPAddr: ":8000",
				Runtime:     runner.Config{StallTimeout: 30 * time.Second, DetachTimeout: 120 * time.Second, MaxChildren: 7},
				BodyTimeout: 3 * time.Second, IdleTimeout: 4 * time.Second, MaxConnections: 50,
				Tenants: tenants.Config{MaxConcurrent: 2, RPS: 2.5}, MaxConnectionsPerAddress: 9}
			flagDefaults(&want)
			if !equalConfig(c, want) {
				t.Errorf("got %+v, want %+v", c, want)
			}
		}},
		{"flag beats env", []string{
			"--http-port", "9100", "--migration-limit", "1", "--stall-timeout", "1m",
			"--active-decode-blocks-threshold", "0.5", "--http-host", "127.0.0.1", "--replicas", "3",
		}, map[string]string{
			"DYN_HTTP_PORT": "9000", "DYN_MIGRATION_LIMIT": "3", "DYN_STALL_TIMEOUT_SECS": "7",
			"DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD": "0.9",
		}, func(t *testing.T, c frontend.Config) {
			if c.HTTPAddr != "127.0.0.1:9100" || c.Runtime.MigrationLimit != 1 || c.Runtime.StallTimeout != time.Minute ||
				c.Fleet.ActiveDecodeBlocksThreshold == nil || *c.Fleet.ActiveDecodeBlocksThreshold != 0.5 || c.Runtime.Streams.Replicas != 3 {
				t.Errorf("got %+v, want flag values", c)
			}
		}},
		{"inhibition 0 disables", nil, map[string]string{"DYN_RUNTIME_INHIBITED_DURATION_SECS": "0"}, func(t *testing.T, c frontend.Config) {
			if c.Fleet.InhibitedDuration >= 0 {
				t.Errorf("got InhibitedDuration %v, want negative (disabled)", c.Fleet.InhibitedDuration)
			}
		}},
		{"empty env is unset", nil, map[string]string{"DYN_HTTP_PORT": "", "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD": " "}, func(t *testing.T, c frontend.Config) {
			if c.HTTPAddr != ":8000" || c.Fleet.ActivePrefillTokensThreshold != nil {
				t.Errorf("got %q %v, want :8000 and nil", c.HTTPAddr, c.Fleet.ActivePrefillTokensThreshold)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, _, _ := testEnv(tt.env)
			o, err := parseFrontend(env, tt.args)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			tt.check(t, o.cfg)
		})
	}
}

func equalConfig(a, b frontend.Config) bool {
	ra, rb := &a.Fleet, &b.Fleet
	eqF := (ra.ActiveDecodeBlocksThreshold == nil) == (rb.ActiveDecodeBlocksThreshold == nil) &&
		(ra.ActiveDecodeBlocksThreshold == nil || *ra.ActiveDecodeBlocksThreshold == *rb.ActiveDecodeBlocksThreshold)
	eqI := (ra.ActivePrefillTokensThreshold == nil) == (rb.ActivePrefillTokensThreshold == nil) &&
		(ra.ActivePrefillTokensThreshold == nil || *ra.ActivePrefillTokensThreshold == *rb.ActivePrefillTokensThreshold)
	ra.ActiveDecodeBlocksThreshold, rb.ActiveDecodeBlocksThreshold = nil, nil
	ra.ActivePrefillTokensThreshold, rb.ActivePrefillTokensThreshold = nil, nil
	return eqF && eqI && a == b
}

func TestWorkerFlagsAndEnv(t *testing.T) {
	tests := []struct {
		name                   string
		args                   []string
		env                    map[string]string
		wantTTL, wantShutdown  time.Duration
		wantTokensPerSec       float64
		wantNATS, wantLogLevel string
	}{
		{"defaults", nil, nil, 10 * time.Second, 30 * time.Second, 100, defaultNATSURL, "INFO"},
		{"env", nil, map[string]string{
			"DYN_LEASE_TTL_SECS": "3", "DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS": "12",
			"NATS_SERVER": "nats://a:1,nats://b:2", "BATON_LOG_LEVEL": "debug",
		}, 3 * time.Second, 12 * time.Second, 100, "nats://a:1,nats://b:2", "DEBUG"},
		{"flags beat env", []string{"--lease-ttl", "2s", "--nats", "nats://c:3", "--log-level", "warn", "--mock-tokens-per-sec", "500"},
			map[string]string{"DYN_LEASE_TTL_SECS": "3", "NATS_SERVER": "nats://a:1", "BATON_LOG_LEVEL": "debug"},
			2 * time.Second, 30 * time.Second, 500, "nats://c:3", "WARN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, _, _ := testEnv(tt.env)
			o, err := parseWorker(env, tt.args)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if o.cfg.LeaseTTL != tt.wantTTL || o.cfg.ShutdownTimeout != tt.wantShutdown {
				t.Errorf("got lease %v shutdown %v, want %v %v", o.cfg.LeaseTTL, o.cfg.ShutdownTimeout, tt.wantTTL, tt.wantShutdown)
			}
			if o.w.mock.TokensPerSec != tt.wantTokensPerSec {
				t.Errorf("got tokens/s %v, want %v", o.w.mock.TokensPerSec, tt.wantTokensPerSec)
			}
			if o.nats.urls != tt.wantNATS || o.common.logLevel.String() != tt.wantLogLevel {
				t.Errorf("got nats %q level %v, want %q %v", o.nats.urls, o.common.logLevel, tt.wantNATS, tt.wantLogLevel)
			}
		})
	}
}

// TestWorkerHealthCheckDefault: canaries are on unless
// DYN_HEALTH_CHECK_ENABLED says false (issue 35, as Dynamo's operator).
func TestWorkerHealthCheckDefault(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{{nil, true}, {map[string]string{"DYN_HEALTH_CHECK_ENABLED": "false"}, false}, {map[string]string{"DYN_HEALTH_CHECK_ENABLED": "true"}, true}} {
		env, _, _ := testEnv(tc.env)
		o, err := parseWorker(env, nil)
		if err != nil {
			t.Fatalf("%v: parse: %v", tc.env, err)
		}
		if o.cfg.HealthCheck != tc.want {
			t.Errorf("%v: health check %v, want %v", tc.env, o.cfg.HealthCheck, tc.want)
		}
	}
}

func TestUpPassesWorkerFlags(t *testing.T) {
	env, _, _ := testEnv(map[string]string{"DYN_HTTP_PORT": "8100"})
	o, err := parseUp(env, []string{"--workers", "3", "--mock-ttft", "5ms", "--mock-crash-after-tokens", "7", "--migration-limit", "2"})
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	got := strings.Join(o.workerArgs, " ")
	for _, want := range []string{"--mock-ttft=5ms", "--mock-crash-after-tokens=7", "--replicas 1", "--log-level INFO"} {
		if !strings.Contains(got, want) {
			t.Errorf("got worker args %q, want %q in them", got, want)
		}
	}
	if strings.Contains(got, "migration") {
		t.Errorf("got worker args %q, want no frontend flags", got)
	}
	if o.cfg.HTTPAddr != "127.0.0.1:8100" || o.cfg.Runtime.MigrationLimit != 2 || o.workers != 3 {
		t.Errorf("got addr %q limit %d workers %d, want 127.0.0.1:8100 2 3", o.cfg.HTTPAddr, o.cfg.Runtime.MigrationLimit, o.workers)
	}
}

// TestRequestPartitionsFlag: --request-partitions (or BATON_REQUEST_PARTITIONS)
// reaches the streams config of the frontend and the worker, and baton up
// passes it to its workers only when it was set (unset, they adopt the log's).
func TestRequestPartitionsFlag(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		env  map[string]string
		want int
	}{
		{"unset", nil, nil, 0},
		{"env", nil, map[string]string{"BATON_REQUEST_PARTITIONS": "3"}, 3},
		{"flag beats env", []string{"--request-partitions", "4"}, map[string]string{"BATON_REQUEST_PARTITIONS": "3"}, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env, _, _ := testEnv(tt.env)
			fe, err := parseFrontend(env, tt.args)
			if err != nil {
				t.Fatal(err)
			}
			w, err := parseWorker(env, tt.args)
			if err != nil {
				t.Fatal(err)
			}
			up, err := parseUp(env, tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if fe.cfg.Runtime.Streams.RequestPartitions != tt.want || w.cfg.Streams.RequestPartitions != tt.want || up.cfg.Runtime.Streams.RequestPartitions != tt.want {
				t.Errorf("got partitions %d, %d, %d (frontend, worker, up); want %d", fe.cfg.Runtime.Streams.RequestPartitions,
					w.cfg.Streams.RequestPartitions, up.cfg.Runtime.Streams.RequestPartitions, tt.want)
			}
			passed := strings.Contains(strings.Join(up.workerArgs, " "), fmt.Sprintf("--request-partitions %d", tt.want))
			if passed != (tt.want != 0) {
				t.Errorf("up's worker args %q: passes --request-partitions %v, want %v", up.workerArgs, passed, tt.want != 0)
			}
		})
	}
	for _, bad := range []string{"0x", "65", "-1"} {
		env, _, _ := testEnv(map[string]string{"BATON_REQUEST_PARTITIONS": bad})
		if _, err := parseWorker(env, nil); err == nil || !errors.As(err, new(usageError)) {
			t.Errorf("BATON_REQUEST_PARTITIONS=%s: got %v, want a usage error", bad, err)
		}
	}
}

// TestUpFlags: up listens on loopback unless --http-host says otherwise,
// gives worker i the status port --system-port+i-1 (always explicit, so a
// DYN_SYSTEM_PORT in the environment cannot give every worker the same one),
// and passes NATS credentials to its workers in their environment.
func TestUpFlags(t *testing.T) {
	tests := []struct {
		name      string
		env       map[string]string
		args      []string
		wantAddr  string
		wantPorts []int // of workers 1..n
		wantUser  string
		wantErr   string
	}{
		{name: "defaults", wantAddr: "127.0.0.1:8000", wantPorts: []int{0, 0}},
		{name: "all interfaces", args: []string{"--http-host", "0.0.0.0"}, wantAddr: "0.0.0.0:8000", wantPorts: []int{0, 0}},
		{name: "system port", args: []string{"--system-port", "9100", "--workers", "3"}, wantAddr: "127.0.0.1:8000", wantPorts: []int{9100, 9101, 9102}},
		{name: "system port from env", env: map[string]string{"DYN_SYSTEM_PORT": "9200"}, wantAddr: "127.0.0.1:8000", wantPorts: []int{9200, 9201}},
		{name: "credentials", args: []string{"--user", "u", "--password", "p"}, wantAddr: "127.0.0.1:8000", wantPorts: []int{0, 0}, wantUser: "u"},
		{name: "credentials from env", env: map[string]string{"BATON_NATS_USER": "eu", "BATON_NATS_PASSWORD": "ep"}, wantAddr: "127.0.0.1:8000", wantPorts: []int{0, 0}, wantUser: "eu"},
		{name: "user without password", args: []string{"--user", "u"}, wantErr: "--user and --password go together"},
		{name: "system ports past 65535", args: []string{"--system-port", "65535"}, wantErr: "--system-port 65535"},
	}
	t.Setenv("NATS_CREDS", "/elsewhere.creds")
	t.Setenv("NATS_USER", "someone-else")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, _, _ := testEnv(tt.env)
			o, err := parseUp(env, tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.As(err, new(usageError)) {
					t.Fatalf("parseUp = %v, want a usage error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseUp: %v", err)
			}
			if o.cfg.HTTPAddr != tt.wantAddr {
				t.Errorf("got addr %q, want %q", o.cfg.HTTPAddr, tt.wantAddr)
			}
			for i, want := range tt.wantPorts {
				cmd := o.workerCommand(context.Background(), "baton", i+1, "nats://127.0.0.1:4222", env)
				got := strings.Join(cmd.Args, " ")
				if w := fmt.Sprintf("--system-port %d", want); !strings.Contains(got, w) {
					t.Errorf("worker %d args %q, want %q", i+1, got, w)
				}
				if strings.Contains(got, "password") {
					t.Errorf("worker %d args %q carry a password", i+1, got)
				}
				if strings.Contains(strings.Join(cmd.Env, " "), "NATS_CREDS=") {
					t.Errorf("worker %d inherits NATS_CREDS, meant for another server", i+1)
				}
				var user string
				for _, kv := range cmd.Env {
					if v, ok := strings.CutPrefix(kv, "NATS_USER="); ok {
						user = v
					}
				}
				if user != tt.wantUser {
					t.Errorf("worker %d NATS_USER %q, want %q", i+1, user, tt.wantUser)
				}
			}
		})
	}
}

// TestBadConfigExits2 checks that every bad flag, variable or configuration
// ends with exit code 2 and a one-line reason, before anything starts.
func TestBadConfigExits2(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("# tenants\nalice short\nbob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	workers := filepath.Join(t.TempDir(), "workers")
	if err := os.WriteFile(workers, []byte("w1 0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string // in the message
	}{
		{"no command", nil, nil, "Usage"},
		{"unknown command", []string{"serve"}, nil, `unknown command "serve"`},
		{"unknown flag", []string{"frontend", "--bogus"}, nil, "--bogus"},
		{"bad int flag", []string{"frontend", "--http-port", "abc"}, nil, "--http-port"},
		{"bad int env", []string{"frontend"}, map[string]string{"DYN_HTTP_PORT": "abc"}, "DYN_HTTP_PORT"},
		{"port out of range", []string{"frontend", "--http-port", "70000"}, nil, "out of range"},
		{"bad seconds env", []string{"frontend"}, map[string]string{"DYN_STALL_TIMEOUT_SECS": "soon"}, "DYN_STALL_TIMEOUT_SECS"},
		{"negative seconds env", []string{"frontend"}, map[string]string{"DYN_DETACH_TIMEOUT_SECS": "-1"}, "negative"},
		{"bad env-only", []string{"frontend"}, map[string]string{"DYN_RUNTIME_INHIBITED_DURATION_SECS": "1.5"}, "DYN_RUNTIME_INHIBITED_DURATION_SECS"},
		{"bad shutdown env", []string{"frontend"}, map[string]string{"DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS": "x"}, "DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS"},
		{"threshold out of range", []string{"frontend", "--active-decode-blocks-threshold", "1.5"}, nil, "threshold"},
		{"several problems on one line", []string{"frontend", "--migration-limit", "-1", "--frontend-id", "a b"}, nil, "; "},
		{"bad nats url", []string{"frontend", "--nats", "http://x:1"}, nil, "--nats"},
		{"bad nats env", []string{"worker"}, map[string]string{"NATS_SERVER": "nats://"}, "--nats"},
		{"bad log level", []string{"worker", "--log-level", "loud"}, nil, "--log-level"},
		{"bad log level env", []string{"nats"}, map[string]string{"BATON_LOG_LEVEL": "loud"}, "BATON_LOG_LEVEL"},
		{"unknown engine", []string{"worker", "--engine", "tpu"}, nil, "--engine"},
		{"negative mock fault", []string{"worker", "--mock-crash-after-tokens", "-1"}, nil, "crash"},
		{"short lease", []string{"worker", "--lease-ttl", "10ms"}, nil, "lease"},
		{"bad worker id", []string{"worker", "--worker-id", "a.b"}, nil, "worker id"},
		{"bad drain env", []string{"worker"}, map[string]string{"DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS": "x"}, "DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS"},
		{"nats routes without cluster", []string{"nats", "--routes", "nats-route://a:1"}, nil, "cluster"},
		{"nats cluster without port", []string{"nats", "--cluster-name", "c"}, nil, "cluster-port"},
		{"positional argument", []string{"nats", "extra"}, nil, "extra"},
		{"up negative workers", []string{"up", "--workers", "-1"}, nil, "--workers"},
		{"up random http port", []string{"up", "--http-port", "0"}, nil, "--http-port"},
		{"missing keys file", []string{"frontend"}, map[string]string{"BATON_API_KEYS_FILE": "/nonexistent/keys"}, "read API keys"},
		{"bad keys file", []string{"frontend", "--api-keys-file", keys}, nil, "line 2: the secret of tenant alice is shorter than 16 bytes"},
		{"keys file line without secret", []string{"frontend", "--api-keys-file", keys}, nil, "line 3: want TENANT SECRET"},
		{"tls cert without key", []string{"frontend", "--tls-cert", keys}, nil, "--tls-cert and --tls-key"},
		{"zero max connections", []string{"frontend", "--max-connections", "0"}, nil, "--max-connections"},
		{"negative max connections per address", []string{"frontend", "--max-connections-per-address", "-1"}, nil, "--max-connections-per-address -1: must not be negative"},
		{"negative tenant rps", []string{"up", "--tenant-rps", "-1"}, nil, "--tenant-rps"},
		{"worker users without a user", []string{"nats", "--worker-users", workers}, nil, "--worker-users needs --user"},
		{"bad worker users", []string{"nats", "--user", "u", "--password", "p", "--worker-users", keys}, nil, "worker users"},
		{"cluster user without password", []string{"nats", "--cluster-name", "c", "--cluster-port", "6222", "--cluster-user", "r"}, nil, "--cluster-password"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, _, stderr := testEnv(tt.env)
			if code := run(tt.args, env); code != 2 {
				t.Fatalf("got exit code %d, want 2 (stderr %q)", code, stderr)
			}
			msg := stderr.String()
			if !strings.Contains(msg, tt.want) {
				t.Errorf("got stderr %q, want it to contain %q", msg, tt.want)
			}
			if tt.args != nil && strings.Count(strings.TrimSpace(msg), "\n") != 0 {
				t.Errorf("got %q, want one line", msg)
			}
		})
	}
}

func TestHelpExits0(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help"}, {"help", "up"}, {"up", "--help"}, {"nats", "-h"}, {"frontend", "--help"}, {"worker", "--help"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			env, stdout, stderr := testEnv(nil)
			if code := run(args, env); code != 0 {
				t.Fatalf("got exit code %d, want 0 (stderr %q)", code, stderr)
			}
			if stdout.Len() == 0 || stderr.Len() != 0 {
				t.Errorf("got stdout %d bytes, stderr %q; want help on stdout only", stdout.Len(), stderr)
			}
		})
	}
	env, stdout, _ := testEnv(nil)
	run([]string{"frontend", "--help"}, env)
	for _, want := range []string{"--http-port", "DYN_HTTP_PORT", "default 8000", "DYN_RUNTIME_INHIBITED_DURATION_SECS", "DYN_STALL_TIMEOUT_SECS in seconds",
		"--max-connections-per-address", "BATON_MAX_CONNECTIONS_PER_ADDRESS, default 256"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("frontend --help lacks %q", want)
		}
	}
	env, stdout, _ = testEnv(nil)
	run([]string{"up", "--help"}, env)
	if !strings.Contains(stdout.String(), "--max-connections-per-address") {
		t.Error("up --help lacks --max-connections-per-address")
	}
}

func TestParseSeconds(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"30", 30 * time.Second, false},
		{" 5 ", 5 * time.Second, false},
		{"0.25", 250 * time.Millisecond, false},
		{"0", 0, false},
		{"-1", 0, true},
		{"30s", 0, true},
		{"NaN", 0, true},
		{"1e300", 0, true},
	}
	for _, tt := range tests {
		got, err := parseSeconds(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseSeconds(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, 0},
		{"help", flag.ErrHelp, 0},
		{"usage", usagef("bad"), 2},
		{"wrapped usage", errors.Join(usagef("bad")), 2},
		{"fatal", errors.New("boom"), 1},
		{"cancelled", context.Canceled, 1},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		if got := exitCode(&b, "baton x", tt.err); got != tt.want {
			t.Errorf("%s: got %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestConnectNATSGivesUp(t *testing.T) {
	env, _, stderr := testEnv(nil)
	log := (&commonFlags{}).logger(env.stderr, "test")
	start := time.Now()
	_, err := connectNATS(context.Background(), "nats://127.0.0.1:1", "test", 300*time.Millisecond, log)
	if err == nil || !strings.Contains(err.Error(), "no NATS server") {
		t.Fatalf("got %v, want a no-server error", err)
	}
	// A stack on another port is the likely cause: the error names --nats
	// (formerly it only suggested starting a server).
	if !strings.Contains(err.Error(), "--nats URL") {
		t.Errorf("got %v, want it to suggest --nats", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("gave up after %v, want about 300ms", d)
	}
	_ = stderr
}

// TestWorkerStatusServerHost (issue 22, item 12): the worker's status
// server listens on the loopback interface unless told otherwise.
func TestWorkerStatusServerHost(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"loopback by default", []string{"--system-port", "9100"}, nil, "127.0.0.1:9100"},
		{"every interface when asked", []string{"--system-port", "9100", "--system-host", "0.0.0.0"}, nil, "0.0.0.0:9100"},
		{"env", nil, map[string]string{"DYN_SYSTEM_PORT": "9101", "DYN_SYSTEM_HOST": "::"}, "[::]:9101"},
		{"off", nil, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, _, _ := testEnv(tc.env)
			o, err := parseWorker(env, tc.args)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if o.cfg.SystemAddr != tc.want {
				t.Errorf("status server address %q, want %q", o.cfg.SystemAddr, tc.want)
			}
		})
	}
}

package frontend

import (
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/services/fleet"
	"github.com/baton-dev/baton/services/frontend/runner"
	"github.com/baton-dev/baton/services/frontend/tenants"
)

func ptr[T any](v T) *T { return &v }

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		// want are the substrings the error must hold; none: valid.
		want []string
	}{
		{name: "zero", cfg: Config{}},
		{name: "all set and sane", cfg: Config{Fleet: fleet.Config{InhibitedDuration: -1, ActiveDecodeBlocksThreshold: ptr(0.9), ActivePrefillTokensThreshold: ptr(0)},
			Runtime: runner.Config{ID: "fe-1_a", MigrationLimit: 3, MigrationMaxSeqLen: 100,
				StallTimeout: time.Second, DetachTimeout: time.Second, DispatchTimeout: time.Second, MaxPromptTokens: 1},
			ShutdownTimeout: time.Second, ConsoleWindow: time.Minute, DefaultMaxTokens: 1, MaxTokensLimit: 1,
			MaxBodyBytes: 1, ConsoleRequests: 1}},
		{name: "threshold bounds are inclusive", cfg: Config{Fleet: fleet.Config{ActiveDecodeBlocksThreshold: ptr(1.0)}}},
		{name: "threshold zero", cfg: Config{Fleet: fleet.Config{ActiveDecodeBlocksThreshold: ptr(0.0)}}},
		{name: "id with a dot", cfg: Config{Runtime: runner.Config{ID: "fe.1"}}, want: []string{`frontend id "fe.1"`}},
		{name: "id with a space", cfg: Config{Runtime: runner.Config{ID: "fe 1"}}, want: []string{`frontend id "fe 1"`}},
		{name: "negative migration limit", cfg: Config{Runtime: runner.Config{MigrationLimit: -1}}, want: []string{"migration limit -1"}},
		{name: "negative max seq len", cfg: Config{Runtime: runner.Config{MigrationMaxSeqLen: -2}}, want: []string{"migration max seq len -2"}},
		{name: "decode threshold above 1", cfg: Config{Fleet: fleet.Config{ActiveDecodeBlocksThreshold: ptr(1.5)}},
			want: []string{"active decode blocks threshold 1.5"}},
		{name: "decode threshold below 0", cfg: Config{Fleet: fleet.Config{ActiveDecodeBlocksThreshold: ptr(-0.1)}},
			want: []string{"active decode blocks threshold -0.1"}},
		{name: "negative prefill threshold", cfg: Config{Fleet: fleet.Config{ActivePrefillTokensThreshold: ptr(-5)}},
			want: []string{"active prefill tokens threshold -5"}},
		{name: "negative stall timeout", cfg: Config{Runtime: runner.Config{StallTimeout: -time.Second}}, want: []string{"stall timeout -1s"}},
		{name: "negative detach timeout", cfg: Config{Runtime: runner.Config{DetachTimeout: -time.Second}}, want: []string{"detach timeout -1s"}},
		{name: "negative shutdown timeout", cfg: Config{ShutdownTimeout: -time.Second}, want: []string{"shutdown timeout -1s"}},
		{name: "negative dispatch timeout", cfg: Config{Runtime: runner.Config{DispatchTimeout: -time.Second}}, want: []string{"dispatch timeout -1s"}},
		{name: "negative console window", cfg: Config{ConsoleWindow: -time.Minute}, want: []string{"console window -1m0s"}},
		{name: "negative default max tokens", cfg: Config{DefaultMaxTokens: -1}, want: []string{"size limits"}},
		{name: "negative max tokens limit", cfg: Config{MaxTokensLimit: -1}, want: []string{"size limits"}},
		{name: "negative max prompt tokens", cfg: Config{Runtime: runner.Config{MaxPromptTokens: -1}}, want: []string{"size limits"}},
		{name: "negative max body bytes", cfg: Config{MaxBodyBytes: -1}, want: []string{"size limits"}},
		{name: "negative console requests", cfg: Config{ConsoleRequests: -1}, want: []string{"size limits"}},
		{name: "negative read header timeout", cfg: Config{ReadHeaderTimeout: -time.Second}, want: []string{"read header timeout -1s"}},
		{name: "negative body timeout", cfg: Config{BodyTimeout: -time.Second}, want: []string{"body timeout -1s"}},
		{name: "negative idle timeout", cfg: Config{IdleTimeout: -time.Second}, want: []string{"idle timeout -1s"}},
		{name: "negative max children", cfg: Config{Runtime: runner.Config{MaxChildren: -1}}, want: []string{"max children"}},
		{name: "negative max connections", cfg: Config{MaxConnections: -1}, want: []string{"max connections"}},
		{name: "negative tenant concurrency is unlimited", cfg: Config{Tenants: tenants.Config{MaxConcurrent: -1}}},
		{name: "negative write timeout", cfg: Config{WriteTimeout: -time.Second}, want: []string{"write timeout"}},
		{name: "negative tenant rate", cfg: Config{Tenants: tenants.Config{RPS: -0.5}}, want: []string{"tenant limits"}},
		{name: "tenant limits set", cfg: Config{Tenants: tenants.Config{MaxConcurrent: 4, RPS: 0.5}}},
		{name: "TLS certificate without key", cfg: Config{TLSCertFile: "c.pem"}, want: []string{"TLS certificate and key go together"}},
		{name: "TLS key without certificate", cfg: Config{TLSKeyFile: "k.pem"}, want: []string{"TLS certificate and key go together"}},
		{name: "TLS certificate and key", cfg: Config{TLSCertFile: "c.pem", TLSKeyFile: "k.pem"}},
		{name: "every problem is reported", cfg: Config{Runtime: runner.Config{ID: "a.b", MigrationLimit: -1, StallTimeout: -1}},
			want: []string{`frontend id "a.b"`, "migration limit -1", "stall timeout -1ns"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("got %v, want valid", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got valid, want an error with %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestConfigWithDefaults(t *testing.T) {
	cases := []struct {
		name string
		got  func(Config) any
		in   Config
		want any
	}{
		{"http addr", func(c Config) any { return c.HTTPAddr }, Config{}, DefaultHTTPAddr},
		{"http addr kept", func(c Config) any { return c.HTTPAddr }, Config{HTTPAddr: ":9"}, ":9"},
		{"shutdown timeout", func(c Config) any { return c.ShutdownTimeout }, Config{}, DefaultShutdownTimeout},
		{"default max tokens", func(c Config) any { return c.DefaultMaxTokens }, Config{}, DefaultMaxTokens},
		{"max tokens limit", func(c Config) any { return c.MaxTokensLimit }, Config{}, DefaultMaxTokensLimit},
		{"max body bytes", func(c Config) any { return c.MaxBodyBytes }, Config{}, int64(DefaultMaxBodyBytes)},
		{"console window", func(c Config) any { return c.ConsoleWindow }, Config{}, DefaultConsoleWindow},
		{"read header timeout", func(c Config) any { return c.ReadHeaderTimeout }, Config{}, DefaultReadHeaderTimeout},
		{"body timeout", func(c Config) any { return c.BodyTimeout }, Config{}, DefaultBodyTimeout},
		{"idle timeout", func(c Config) any { return c.IdleTimeout }, Config{}, DefaultIdleTimeout},
		{"max connections", func(c Config) any { return c.MaxConnections }, Config{}, DefaultMaxConnections},
		{"max connections per address", func(c Config) any { return c.MaxConnectionsPerAddress }, Config{}, DefaultMaxConnectionsPerAddress},
		{"max connections per address, negative is none", func(c Config) any { return c.MaxConnectionsPerAddress }, Config{MaxConnectionsPerAddress: -1}, -1},
		{"tenant limits stay unlimited", func(c Config) any { return c.Tenants.MaxConcurrent == 0 && c.Tenants.RPS == 0 }, Config{}, true},
		{"with keys a tenant holds a quarter of the connections", func(c Config) any { return c.Tenants.MaxConcurrent }, Config{APIKeysFile: "k"}, DefaultMaxConnections / 4},
		{"with keys, negative is unlimited", func(c Config) any { return c.Tenants.MaxConcurrent }, Config{APIKeysFile: "k", Tenants: tenants.Config{MaxConcurrent: -1}}, -1},
		{"a write timeout by default", func(c Config) any { return c.WriteTimeout }, Config{}, DefaultWriteTimeout},
		{"console requests", func(c Config) any { return c.ConsoleRequests }, Config{}, DefaultConsoleRequests},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.got(tc.in.withDefaults()); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

package runner

import (
	"testing"
	"time"
)

func TestConfigWithDefaults(t *testing.T) {
	cases := []struct {
		name string
		got  func(Config) any
		in   Config
		want any
	}{
		{"stall timeout", func(c Config) any { return c.StallTimeout }, Config{}, DefaultStallTimeout},
		{"detach timeout", func(c Config) any { return c.DetachTimeout }, Config{}, DefaultDetachTimeout},
		{"dispatch timeout", func(c Config) any { return c.DispatchTimeout }, Config{}, DefaultDispatchTimeout},
		{"dispatch timeout kept", func(c Config) any { return c.DispatchTimeout }, Config{DispatchTimeout: time.Minute}, time.Minute},
		{"max prompt tokens", func(c Config) any { return c.MaxPromptTokens }, Config{}, DefaultMaxPromptTokens},
		{"max children", func(c Config) any { return c.MaxChildren }, Config{}, DefaultMaxChildren},
		{"max children kept", func(c Config) any { return c.MaxChildren }, Config{MaxChildren: 3}, 3},
		{"worker output max bytes", func(c Config) any { return c.WorkerOutputMaxBytes }, Config{}, int64(256 << 20)},
		{"worker output max age: detach timeout + 60s", func(c Config) any { return c.WorkerOutputMaxAge }, Config{DetachTimeout: time.Minute}, 2 * time.Minute},
		{"worker output max age kept", func(c Config) any { return c.WorkerOutputMaxAge }, Config{WorkerOutputMaxAge: time.Second}, time.Second},
		{"migration limit stays 0 (migration off)", func(c Config) any { return c.MigrationLimit }, Config{}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.got(tc.in.withDefaults()); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

package main

import (
	"errors"
	"testing"
)

// TestWorkerPriorityFlag: --priority (or BATON_PRIORITY) reaches the
// worker's config, the flag beating the variable; a value that is not an
// integer is a usage error.
func TestWorkerPriorityFlag(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		env  map[string]string
		want int
	}{
		{"default", nil, nil, 0},
		{"env", nil, map[string]string{"BATON_PRIORITY": "2"}, 2},
		{"flag beats env", []string{"--priority", "5"}, map[string]string{"BATON_PRIORITY": "2"}, 5},
		{"below the default", []string{"--priority", "-1"}, nil, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env, _, _ := testEnv(tt.env)
			o, err := parseWorker(env, tt.args)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if o.cfg.Priority != tt.want {
				t.Errorf("got priority %d, want %d", o.cfg.Priority, tt.want)
			}
		})
	}
	env, _, _ := testEnv(map[string]string{"BATON_PRIORITY": "high"})
	if _, err := parseWorker(env, nil); err == nil || !errors.As(err, new(usageError)) {
		t.Errorf("BATON_PRIORITY=high: got %v, want a usage error", err)
	}
}

// TestWorkerBatchedOutputFlag: --batched-output (or BATON_BATCHED_OUTPUT)
// reaches the worker's config; off by default.
func TestWorkerBatchedOutputFlag(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		env  map[string]string
		want bool
	}{
		{"default off", nil, nil, false},
		{"env", nil, map[string]string{"BATON_BATCHED_OUTPUT": "true"}, true},
		{"flag", []string{"--batched-output"}, nil, true},
		{"flag beats env", []string{"--batched-output=false"}, map[string]string{"BATON_BATCHED_OUTPUT": "true"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env, _, _ := testEnv(tt.env)
			o, err := parseWorker(env, tt.args)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if o.cfg.BatchedOutput != tt.want {
				t.Errorf("got batched output %v, want %v", o.cfg.BatchedOutput, tt.want)
			}
		})
	}
}

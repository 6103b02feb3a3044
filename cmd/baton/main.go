package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/baton-dev/baton/services/ratelog"
	"github.com/baton-dev/baton/streams"
)

// command is one subcommand.
type command struct {
	name    string
	summary string // one line, for `baton --help`
	run     func(ctx context.Context, env *environment, args []string) error
}

// environment is what a subcommand may touch of the process: injected so that
// tests can run commands in-process.
type environment struct {
	lookup lookupFunc
	stdout io.Writer
	stderr io.Writer
}

var commands = []command{
	{"up", "the whole stack on one machine: embedded NATS, a frontend and mock workers", runUp},
	{"nats", "a standalone NATS server with JetStream (embedded library)", runNATS},
	{"frontend", "the OpenAI-compatible HTTP frontend", runFrontend},
	{"worker", "a worker serving requests on an engine (mock)", runWorker},
	{"replay", "a request's timeline and output, rebuilt from the event log alone (--json)", runReplay},
	{"compact", "fold finished requests' token deltas into their compact records by hand", runCompact},
	{"evict", "remove requests from the event log by hand, cancelling the running ones first", runEvict},
	{"events", "pretty-print the event log (--follow, --request ID, --worker ID)", runEvents},
	{"provision", "create the event log's streams and buckets, or verify them (--update to change them)", runProvision},
}

func main() {
	os.Exit(run(os.Args[1:], &environment{lookup: os.LookupEnv, stdout: os.Stdout, stderr: os.Stderr}))
}

// run runs the command named by args[0] and returns the process exit code.
func run(args []string, env *environment) int {
	if len(args) == 0 {
		printUsage(env.stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && name == "help" {
			return run([]string{args[1], "--help"}, env)
		}
		printUsage(env.stdout)
		return 0
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(env.stderr, "baton: unknown command %q (see 'baton --help')\n", name)
		return 2
	}

	ctx, stop, sigs := notifyContext()
	defer stop()
	done := make(chan struct{})
	defer close(done)
	go exitOnSecondSignal(ctx, done, stop, sigs, env.stderr)

	err := cmd.run(ctx, env, args[1:])
	return exitCode(env.stderr, "baton "+name, err)
}

// notifyContext is cancelled by SIGINT or SIGTERM, which it returns. A
// worker supervised by `baton up` shares the terminal's process group, so a
// Ctrl-C reaches it as well as its parent; it ignores SIGINT and waits for the
// SIGTERM its parent forwards, so that the shutdown stays graceful and
// ordered.
func notifyContext() (context.Context, context.CancelFunc, []os.Signal) {
	sigs := []os.Signal{syscall.SIGINT, syscall.SIGTERM}
	if supervised() {
		signal.Ignore(syscall.SIGINT)
		sigs = sigs[1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), sigs...)
	return ctx, stop, sigs
}

// exitOnSecondSignal waits for the first signal (ctx done), stops catching it
// (stop), and ends the process at once on a second one. Restoring the default
// handling alone is not enough: a process started with SIGINT ignored (a
// background job of a non-interactive shell) would then ignore it again. It
// returns when done is closed.
func exitOnSecondSignal(ctx context.Context, done <-chan struct{}, stop context.CancelFunc, sigs []os.Signal, stderr io.Writer) {
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	stop()
	c := make(chan os.Signal, 1)
	signal.Notify(c, sigs...)
	defer signal.Stop(c)
	select {
	case <-done:
	case s := <-c:
		fmt.Fprintf(stderr, "baton: second signal (%v): exiting at once\n", s)
		code := 1
		if n, ok := s.(syscall.Signal); ok {
			code = 128 + int(n)
		}
		os.Exit(code)
	}
}

// supervisorEnv names the variable `baton up` sets on its children: its PID.
const supervisorEnv = "BATON_UP_PARENT_PID"

func supervised() bool {
	v := os.Getenv(supervisorEnv)
	return v != "" && v == strconv.Itoa(os.Getppid())
}

// exitCode prints err (if any) on one line and maps it to an exit code.
func exitCode(stderr io.Writer, prefix string, err error) int {
	var ue usageError
	var mismatch *streams.PartitionsMismatchError
	var definition *streams.DefinitionError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue), errors.As(err, &mismatch), errors.As(err, &definition):
		fmt.Fprintf(stderr, "%s: %s\n", prefix, oneLine(err))
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %s\n", prefix, oneLine(err))
		return 1
	}
}

func printUsage(w io.Writer) {
	fmt.Fprintf(w, "baton: a fault-tolerant control plane for LLM inference serving, event-sourced on NATS JetStream.\n\n")
	fmt.Fprintf(w, "Usage: baton <command> [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'baton <command> --help' for its flags and environment variables.\n")
	fmt.Fprintf(w, "Exit codes: 0 graceful shutdown, 1 fatal error or engine failure, 2 bad flags or configuration.\n")
}

// commonFlags are the flags every subcommand takes.
type commonFlags struct {
	logLevel slog.Level
}

func addCommonFlags(f *flagSet) *commonFlags {
	c := &commonFlags{logLevel: slog.LevelInfo}
	f.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn or error")
	f.bindEnv("log-level", "BATON_LOG_LEVEL", nil)
	f.showDefault("log-level", "info")
	return c
}

// logger returns a text logger on stderr. Its warnings and errors are
// rate-limited (package ratelog): a message repeated within
// ratelog.DefaultInterval is counted, not written, and the next line of it
// says how many were dropped.
func (c *commonFlags) logger(w io.Writer, component string) *slog.Logger {
	h := slog.NewTextHandler(w, &slog.HandlerOptions{Level: c.logLevel})
	return slog.New(ratelog.New(h, slog.LevelWarn, ratelog.DefaultInterval)).With("component", component)
}

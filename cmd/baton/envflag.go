package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// usageError is a bad flag, environment variable or configuration: the
// process prints it on one line and exits 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// badConfig wraps a Validate error as a usage error.
func badConfig(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// oneLine flattens a (joined) error message onto one line.
func oneLine(err error) string {
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	return strings.Join(lines, "; ")
}

// lookupFunc reads an environment variable; os.LookupEnv in production, a map
// in tests.
type lookupFunc func(key string) (string, bool)

// envBinding backs a flag with an environment variable, used when the flag is
// not given on the command line.
type envBinding struct {
	flag, env string
	// conv turns the variable's text into the flag's syntax (for example
	// seconds into a Go duration); nil means the same syntax.
	conv func(string) (string, error)
	unit string // of the variable, when it differs from the flag's, for --help
}

// envDoc documents a variable that has no flag.
type envDoc struct {
	name, usage, def string
}

// flagSet is a flag.FlagSet whose flags fall back to environment variables.
// Precedence: flag > environment > default.
type flagSet struct {
	*flag.FlagSet
	cmd     string // "baton frontend"
	args    string // positional arguments in the usage line
	summary string
	lookup  lookupFunc
	out     io.Writer // where --help goes

	bindings []envBinding
	envOnly  []envDoc
	defText  map[string]string // flag → default shown in help, when not DefValue
}

func newFlagSet(name, summary string, lookup lookupFunc, out io.Writer) *flagSet {
	f := &flagSet{
		FlagSet: flag.NewFlagSet("baton "+name, flag.ContinueOnError),
		cmd:     "baton " + name,
		summary: summary,
		lookup:  lookup,
		out:     out,
		defText: map[string]string{},
	}
	// Errors are returned and printed by main on one line; parse prints the
	// help for --help only.
	f.SetOutput(io.Discard)
	f.Usage = func() {}
	return f
}

// bindEnv makes env the fallback of the flag name.
func (f *flagSet) bindEnv(name, env string, conv func(string) (string, error)) {
	if f.Lookup(name) == nil {
		panic("bindEnv: no flag " + name)
	}
	f.bindings = append(f.bindings, envBinding{flag: name, env: env, conv: conv})
}

// bindEnvSeconds makes env, a number of seconds, the fallback of the
// duration flag name.
func (f *flagSet) bindEnvSeconds(name, env string) {
	f.bindEnv(name, env, secondsToDuration)
	f.bindings[len(f.bindings)-1].unit = "seconds"
}

// documentEnv lists a variable without a flag in --help.
func (f *flagSet) documentEnv(name, usage, def string) {
	f.envOnly = append(f.envOnly, envDoc{name: name, usage: usage, def: def})
}

// showDefault overrides the default shown in --help for a flag.
func (f *flagSet) showDefault(name, text string) { f.defText[name] = text }

// parse parses args, then applies the environment to every bound flag not
// given on the command line. Every failure is a usageError; --help returns
// flag.ErrHelp after printing the help.
func (f *flagSet) parse(args []string) error {
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.printHelp(f.out)
			return err
		}
		msg := strings.NewReplacer("flag -", "flag --", "defined: -", "defined: --").Replace(err.Error())
		return usagef("%s (see '%s --help')", msg, f.cmd)
	}
	if f.args == "" && f.NArg() > 0 {
		return usagef("unexpected argument %q (see '%s --help')", f.Arg(0), f.cmd)
	}
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	for _, b := range f.bindings {
		if set[b.flag] {
			continue
		}
		raw, ok := lookupSet(f.lookup, b.env)
		if !ok {
			continue
		}
		v := raw
		if b.conv != nil {
			var err error
			if v, err = b.conv(raw); err != nil {
				return usagef("%s=%q: %v", b.env, raw, err)
			}
		}
		if err := f.Set(b.flag, v); err != nil {
			return usagef("%s=%q: invalid value: %v", b.env, raw, err)
		}
	}
	return nil
}

// lookupSet is lookup with an empty value treated as unset.
func lookupSet(lookup lookupFunc, key string) (string, bool) {
	v, ok := lookup(key)
	if !ok || strings.TrimSpace(v) == "" {
		return "", false
	}
	return strings.TrimSpace(v), true
}

func (f *flagSet) printHelp(w io.Writer) {
	usage := f.cmd + " [flags]"
	if f.args != "" {
		usage += " " + f.args
	}
	fmt.Fprintf(w, "Usage: %s\n\n%s\n\nFlags:\n", usage, f.summary)
	envOf := map[string]string{}
	for _, b := range f.bindings {
		envOf[b.flag] = b.env
		if b.unit != "" {
			envOf[b.flag] += " in " + b.unit
		}
	}
	f.VisitAll(func(fl *flag.Flag) {
		typ, usage := flag.UnquoteUsage(fl)
		fmt.Fprintf(w, "  --%s %s\n", fl.Name, typ)
		var notes []string
		if env := envOf[fl.Name]; env != "" {
			notes = append(notes, "env "+env)
		}
		def, ok := f.defText[fl.Name]
		if !ok {
			def = fl.DefValue
		}
		if def != "" {
			notes = append(notes, "default "+def)
		}
		if len(notes) > 0 {
			usage += " (" + strings.Join(notes, ", ") + ")"
		}
		fmt.Fprintf(w, "        %s\n", usage)
	})
	if len(f.envOnly) > 0 {
		fmt.Fprintf(w, "\nEnvironment (no flag):\n")
		for _, e := range f.envOnly {
			fmt.Fprintf(w, "  %s\n        %s (default %s)\n", e.name, e.usage, e.def)
		}
	}
	fmt.Fprintf(w, "\nPrecedence: flag > environment variable > default.\n")
}

// secondsToDuration converts a DYN_*_SECS value (a number of seconds, such as
// "30" or "0.5") into Go duration syntax for a duration flag.
func secondsToDuration(s string) (string, error) {
	d, err := parseSeconds(s)
	if err != nil {
		return "", err
	}
	return d.String(), nil
}

// parseSeconds parses a non-negative number of seconds.
func parseSeconds(s string) (time.Duration, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, errors.New("want a number of seconds")
	}
	if f < 0 {
		return 0, errors.New("must not be negative")
	}
	if f > math.MaxInt64/float64(time.Second) {
		return 0, errors.New("too large")
	}
	return time.Duration(f * float64(time.Second)), nil
}

// envSeconds reads an environment-only variable holding seconds; ok reports
// whether it is set.
func envSeconds(lookup lookupFunc, key string) (d time.Duration, ok bool, err error) {
	raw, ok := lookupSet(lookup, key)
	if !ok {
		return 0, false, nil
	}
	d, err = parseSeconds(raw)
	if err != nil {
		return 0, false, usagef("%s=%q: %v", key, raw, err)
	}
	return d, true, nil
}

// optional is a flag value that remembers whether it was set, for settings
// whose default is "unset" (nil).
type optional[T any] struct {
	v     *T
	parse func(string) (T, error)
	show  func(T) string
}

func (o *optional[T]) String() string {
	if o == nil || o.v == nil || o.show == nil {
		return ""
	}
	return o.show(*o.v)
}

func (o *optional[T]) Set(s string) error {
	v, err := o.parse(s)
	if err != nil {
		return err
	}
	o.v = &v
	return nil
}

// Get returns the value, nil when unset.
func (o *optional[T]) Get() *T { return o.v }

func optionalFloat(f *flagSet, name, usage string) *optional[float64] {
	o := &optional[float64]{
		parse: func(s string) (float64, error) {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || math.IsNaN(v) {
				return 0, errors.New("want a number")
			}
			return v, nil
		},
		show: func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) },
	}
	f.Var(o, name, usage)
	f.showDefault(name, "unset")
	return o
}

func optionalInt(f *flagSet, name, usage string) *optional[int] {
	o := &optional[int]{
		parse: func(s string) (int, error) {
			v, err := strconv.Atoi(s)
			if err != nil {
				return 0, errors.New("want an integer")
			}
			return v, nil
		},
		show: strconv.Itoa,
	}
	f.Var(o, name, usage)
	f.showDefault(name, "unset")
	return o
}

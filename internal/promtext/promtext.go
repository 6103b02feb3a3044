package promtext

import (
	"bufio"
	"io"
	"strconv"
	"strings"
)

// Sum returns the sum of the samples of metric name in r over its series
// whose labels hold every given pair (label, value, label, value, ...): over
// all of them when no pair is given. A metric that r does not hold sums to 0.
func Sum(r io.Reader, name string, labels ...string) (float64, error) {
	var sum float64
	err := scan(r, func(n, ls string, v float64) {
		if n != name {
			return
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if !hasLabel(ls, labels[i], labels[i+1]) {
				return
			}
		}
		sum += v
	})
	return sum, err
}

// Sums returns the sum of the samples of each of names in r, over all its
// series, reading r once. A metric that r does not hold has no entry.
func Sums(r io.Reader, names ...string) (map[string]float64, error) {
	out := map[string]float64{}
	err := scan(r, func(n, _ string, v float64) {
		for _, name := range names {
			if n == name {
				out[n] += v
			}
		}
	})
	return out, err
}

// scan calls each for every sample of r: its metric name, its label set as
// written ("{a="x",b="y"}", or "" for none) and its value. Comments, blank
// lines and lines that are not samples are passed over.
func scan(r io.Reader, each func(name, labels string, v float64)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if name, labels, v, ok := sample(sc.Text()); ok {
			each(name, labels, v)
		}
	}
	return sc.Err()
}

// sample parses one line of the exposition: name, optional labels, value.
func sample(line string) (name, labels string, v float64, ok bool) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return "", "", 0, false
	}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return "", "", 0, false
	}
	name, rest := line[:i], line[i:]
	if rest[0] == '{' {
		end := labelsEnd(rest)
		if end < 0 {
			return "", "", 0, false
		}
		labels, rest = rest[:end+1], rest[end+1:]
	}
	fields := strings.Fields(rest) // the value, then perhaps a timestamp
	if len(fields) == 0 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return "", "", 0, false
	}
	return name, labels, v, true
}

// labelsEnd returns the index of the '}' that closes the label set s
// begins with, outside its quoted values (which may hold '}', spaces and
// escaped quotes); -1 if none does.
func labelsEnd(s string) int {
	quoted := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++ // an escaped character
		case c == '"':
			quoted = !quoted
		case !quoted && c == '}':
			return i
		}
	}
	return -1
}

// escape writes a label value as the exposition format does.
var escape = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// hasLabel reports whether the label set labels holds label with value.
func hasLabel(labels, label, value string) bool {
	want := label + `="` + escape.Replace(value) + `"`
	for rest := labels; ; {
		i := strings.Index(rest, want)
		if i < 0 {
			return false
		}
		if i > 0 && (rest[i-1] == '{' || rest[i-1] == ',') {
			return true
		}
		rest = rest[i+len(want):]
	}
}

package logtool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/projections"
	"github.com/baton-dev/baton/services/frontend/openai"
	"github.com/baton-dev/baton/streams"
	"github.com/nats-io/nats.go/jetstream"
)

// replayReadTimeout bounds reading one request's history.
const replayReadTimeout = 30 * time.Second

// ReadReplay reads request id's history from the log (its partition of
// parts, with batch direct get) and folds it as a frontend does. It returns
// an error wrapping streams.ErrNotFound when the log holds no accepted
// event of id.
func ReadReplay(ctx context.Context, js jetstream.JetStream, parts streams.Partitions, id string) (Doc, error) {
	ctx, cancel := context.WithTimeout(ctx, replayReadTimeout)
	defer cancel()
	var envs []events.Envelope
	for e, err := range streams.ReadRequest(ctx, js, parts, id, 1) {
		if errors.Is(err, streams.ErrNotFound) {
			return Doc{}, fmt.Errorf("%w: %s", streams.ErrNotFound, id)
		}
		if err != nil {
			return Doc{}, fmt.Errorf("read request %s: %w", id, err)
		}
		envs = append(envs, e)
	}
	doc, ok := BuildReplay(envs)
	if !ok {
		return Doc{}, fmt.Errorf("%w: %s", streams.ErrNotFound, id)
	}
	doc.Stream = parts.StreamOf(id)
	return doc, nil
}

// Doc is a request's replay: what `baton replay --json` prints.
type Doc struct {
	Stream   string            `json:"stream"` // the request's partition of the log
	Request  projections.State `json:"request"`
	Timeline []replayEntry     `json:"timeline"`
	Output   string            `json:"output"`
	// Response is the answer its client gets from a frontend, rendered from
	// the log as a frontend renders it (openai.Response): for a response of
	// the Responses API, its response object as it stands, named by its
	// client's id; for a completed chat or text completion of one choice,
	// its non-streaming answer (tool calls, logprobs, finish reason and
	// usage included).
	Response map[string]any `json:"response,omitempty"`
}

// replayEntry is one event of the timeline.
type replayEntry = projections.TimelineEntry

// BuildReplay folds a request's events, in stream order, into its state and
// timeline. ok is false when the history has no accepted event.
func BuildReplay(envs []events.Envelope) (doc Doc, ok bool) {
	r, timeline, ok := projections.Replay(envs)
	if !ok {
		return Doc{}, false
	}
	doc = Doc{Request: r.State(), Timeline: timeline, Output: r.Text()}
	if r.Accepted.Endpoint == events.EndpointResponses || (r.Status == projections.StatusCompleted && r.Accepted.Choices <= 1) {
		doc.Response = openai.Response(r, "")
	}
	return doc, true
}

// timelineLine is one line of the text timeline: an entry, or a run of
// token deltas of one attempt with the same fate.
type timelineLine struct {
	first, last replayEntry
	deltas      int
	tokens      int
	from, to    int // token offsets of the run, to exclusive
}

// coalesce groups consecutive token deltas of one attempt that the fold
// treated alike into one line (a compaction's carry apart); other entries
// stay one line each.
func coalesce(entries []replayEntry) []timelineLine {
	var out []timelineLine
	for _, e := range entries {
		tg, isDelta := e.Event.(events.TokensGenerated)
		if isDelta && len(out) > 0 {
			prev := &out[len(out)-1]
			if p, ok := prev.last.Event.(events.TokensGenerated); ok && p.Attempt == tg.Attempt && prev.last.Note == e.Note && prev.last.Carry == e.Carry {
				prev.last = e
				prev.deltas++
				prev.tokens += len(tg.Tokens)
				prev.from = min(prev.from, tg.Offset)
				prev.to = max(prev.to, tg.Offset+len(tg.Tokens))
				continue
			}
		}
		l := timelineLine{first: e, last: e, deltas: 1}
		if isDelta {
			l.tokens, l.from, l.to = len(tg.Tokens), tg.Offset, tg.Offset+len(tg.Tokens)
		}
		out = append(out, l)
	}
	return out
}

func (l timelineLine) String() string { return l.format(11, 9) }

// seq is the line's stream sequence column: "#5", or "#5-9" for a run.
func (l timelineLine) seq() string {
	seq := fmt.Sprintf("#%d", l.first.Seq)
	if l.last.Seq != l.first.Seq {
		seq += fmt.Sprintf("-%d", l.last.Seq)
	}
	return seq
}

// columnWidths are the widths of the sequence and subject columns that
// hold every line's values (at least the defaults, 11 and 9).
func columnWidths(lines []timelineLine) (seqWidth, subjectWidth int) {
	seqWidth, subjectWidth = 11, 9
	for _, l := range lines {
		seqWidth, subjectWidth = max(seqWidth, len(l.seq())), max(subjectWidth, len(l.first.Subject))
	}
	return seqWidth, subjectWidth
}

// format is the line with the sequence and subject columns padded to
// seqWidth and subjectWidth.
func (l timelineLine) format(seqWidth, subjectWidth int) string {
	seq := l.seq()
	what := l.first.Summary
	if tg, ok := l.first.Event.(events.TokensGenerated); ok {
		what = fmt.Sprintf("attempt %d: %s", tg.Attempt, tokenRangeDeltas(l.from, l.to, l.tokens, l.deltas))
		if l.first.Carry {
			// The answer written again by a compaction, on the last
			// attempt's subject: not what that attempt produced (formerly
			// "attempt 1: tokens 0-199 (200)" for an attempt that began at
			// token 60). The record's line says what each attempt did.
			what = projections.CarryPrefix + tokenRangeDeltas(l.from, l.to, l.tokens, l.deltas)
		}
	}
	if l.first.Note != "" {
		what += "  [" + l.first.Note + "]"
	}
	return fmt.Sprintf("%+7.3fs  %-*s %-*s %-15s %s", l.first.Since, seqWidth, seq, subjectWidth, l.first.Subject, kindOf(l.first.Type), what)
}

// tokenRangeDeltas describes a run of deltas covering offsets [from, to)
// with tokens tokens in all (more than to-from if some overlap).
func tokenRangeDeltas(from, to, tokens, deltas int) string {
	if deltas > 1 && to-from != tokens {
		return fmt.Sprintf("tokens %d-%d (%d tokens in %d deltas)", from, to-1, tokens, deltas)
	}
	return tokenRange(from, tokens, deltas)
}

// WriteReplay prints the timeline, the summary and the output as text.
func WriteReplay(w io.Writer, doc Doc) error {
	st := doc.Request
	var b strings.Builder
	fmt.Fprintf(&b, "request %s: %s\n\n", st.ID, statusLine(st))
	fmt.Fprintf(&b, "timeline (time since accepted, %s sequence, subject under %s):\n", cmp.Or(doc.Stream, streams.RequestsStream), strings.TrimSuffix(streams.RequestAll(st.ID), ">"))
	// The columns as wide as their widest value ("tokens.0.up-w1" formerly
	// pushed the columns after it out of line).
	lines := coalesce(doc.Timeline)
	seqWidth, subjectWidth := columnWidths(lines)
	for _, l := range lines {
		fmt.Fprintf(&b, "  %s\n", l.format(seqWidth, subjectWidth))
	}
	fmt.Fprintf(&b, "\nsummary:\n")
	row := func(k, v string) { fmt.Fprintf(&b, "  %-11s %s\n", k, v) }
	row("status", statusLine(st))
	row("model", fmt.Sprintf("%s (%s), %d prompt tokens, max_tokens %d", st.Model, st.Endpoint, st.PromptTokens, st.MaxTokens))
	row("attempts", attemptsLine(st))
	row("migrations", migrationsLine(st))
	if line := exactLine(st); line != "" {
		row("exact", line)
	}
	row("owner", st.Owner)
	row("tokens", tokensLine(st))
	if st.Cancel != nil {
		row("cancel", fmt.Sprintf("%s: %s", st.Cancel.Mode, st.Cancel.Reason))
	}
	if st.Failure != nil {
		row("failure", fmt.Sprintf("%s (status %d): %s", st.Failure.Code, st.Failure.Status, st.Failure.Message))
	}
	if st.ParentID != "" {
		row("parent", st.ParentID)
	}
	if len(st.Children) > 0 {
		row("children", strings.Join(st.Children, ", "))
	}
	if st.SkippedDeltas > 0 {
		row("gaps", fmt.Sprintf("%d deltas skipped out of order (a correct log has none)", st.SkippedDeltas))
	}
	if calls := toolCallsOf(doc.Response); calls != "" {
		row("tool calls", calls)
	}
	fmt.Fprintf(&b, "\noutput (%d tokens):\n%s", st.TokensGenerated, doc.Output)
	if !strings.HasSuffix(doc.Output, "\n") {
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func statusLine(st projections.State) string {
	s := st.Status
	if st.FinishReason != "" {
		s += ", finish reason " + st.FinishReason
	}
	return s
}

func attemptsLine(st projections.State) string {
	if len(st.Attempts) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(st.Attempts))
	for _, a := range st.Attempts {
		p := fmt.Sprintf("%d on %s from token %d", a.Attempt, a.WorkerID, a.StartOffset)
		if a.Closed {
			p += fmt.Sprintf(", closed at token %d (%s)", a.Cut, a.CloseReason)
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("%d: %s", len(parts), strings.Join(parts, "; "))
}

func migrationsLine(st projections.State) string {
	if len(st.Migrations) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(st.Migrations))
	for _, m := range st.Migrations {
		parts = append(parts, fmt.Sprintf("%s from %s at token %d (%s)", m.MigrationType, m.FromWorker, m.Offset, m.Reason))
	}
	return fmt.Sprintf("%d: %s", len(parts), strings.Join(parts, "; "))
}

// tokensLine is the answer's length: the tokens streamed, and the usage's
// count where it differs (a server may merge two tokens into one streamed
// event, or hide a matched stop sequence).
func tokensLine(st projections.State) string {
	if st.CompletionTokens > 0 && st.CompletionTokens != st.TokensGenerated {
		return fmt.Sprintf("%d streamed; %d completion tokens (the server's count, as in the usage)", st.TokensGenerated, st.CompletionTokens)
	}
	return fmt.Sprintf("%d generated", st.TokensGenerated)
}

// exactLine says whether the request's continuations were exact, and
// which were not; "" when none ran.
func exactLine(st projections.State) string {
	var approx []string
	continued := false
	for _, a := range st.Attempts {
		if a.StartOffset == 0 {
			continue
		}
		continued = true
		switch {
		case a.Exact == nil:
			approx = append(approx, fmt.Sprintf("attempt %d not shown exact", a.Attempt))
		case !*a.Exact:
			approx = append(approx, fmt.Sprintf("attempt %d approximate", a.Attempt))
		}
	}
	switch {
	case !continued:
		return ""
	case st.Exact:
		return "true: every continuation was exact"
	}
	return "false: " + strings.Join(approx, ", ")
}

// toolCallsOf lists the tool calls of an answer (a chat completion's, or a
// response object's function calls), as name(arguments).
func toolCallsOf(resp map[string]any) string {
	var out []string
	items, _ := resp["output"].([]map[string]any)
	for _, it := range items {
		if it["type"] == "function_call" {
			out = append(out, fmt.Sprintf("%v(%v)", it["name"], it["arguments"]))
		}
	}
	choices, _ := resp["choices"].([]map[string]any)
	for _, c := range choices {
		msg, _ := c["message"].(map[string]any)
		calls, _ := msg["tool_calls"].([]map[string]any)
		for _, tc := range calls {
			fn, _ := tc["function"].(map[string]any)
			out = append(out, fmt.Sprintf("%v(%v)", fn["name"], fn["arguments"]))
		}
	}
	return strings.Join(out, ", ")
}

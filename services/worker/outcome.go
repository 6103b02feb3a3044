// How an attempt ends: the event that records it, from what the engine
// returned and why the job's context ended, and the counts it reports.

package worker

import (
	"context"
	"errors"
	"log/slog"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/services/engine"
)

// outcome says how job j ended, from what the engine returned and why its
// context ended: the status for the metrics, the event that records the end
// (nil when another event already did: a kill, a fence), and whether the
// engine failed fatally (the worker shuts down once the event is stored).
func (w *Worker) outcome(j *job, res engine.Result, genErr error, out *deltas, log *slog.Logger) (status string, final events.Event, fatal bool) {
	d := j.d
	status = statusCompleted
	cause := context.Cause(j.ctx)
	completed := func(reason string) events.Event {
		return events.RequestCompleted{RequestID: d.RequestID, Attempt: d.Attempt, FinishReason: reason,
			PromptTokens: promptTokens(d, res, out), CompletionTokens: completionTokens(d, res, out), Offset: out.offset()}
	}
	failed := func(reason string) events.AttemptFailed { return w.attemptFailed(j, out, reason) }
	var upstream *engine.UpstreamError
	switch {
	case genErr == nil:
		final = completed(res.FinishReason)
	case errors.Is(cause, errCancelStop):
		w.metrics.cancellation.WithLabelValues(w.cfg.Model, events.CancelStop).Inc()
		final = completed(FinishCancelled)
	case errors.Is(cause, errCancelKill):
		w.metrics.cancellation.WithLabelValues(w.cfg.Model, events.CancelKill).Inc()
		status = statusCancelled // the cancelled event already ended the request
	case errors.Is(cause, errFenced), errors.Is(cause, errNotRouted):
		status = statusHandedOff // the frontend fenced this attempt already, or never routed it here
	case errors.Is(cause, errHandOff):
		status, final = statusHandedOff, failed("shutdown")
	case errors.Is(cause, errNoFrontend):
		status, final = statusCancelled, failed("detached")
	case errors.Is(cause, errEngineHung):
		f := failed(engineHung)
		f.Message = "the engine's server stopped answering"
		status, final = statusFailed, f
	case errors.As(genErr, &upstream):
		// The upstream failed: never a reason for this worker to exit.
		f := failed(failureReason(upstream.Class))
		f.Class, f.Status, f.Code, f.Message = upstream.Class, upstream.Status, upstream.Code, upstream.Message
		f.RetryAfterMS = upstream.RetryAfter.Milliseconds()
		status, final = statusFailed, f
		switch {
		case upstream.Class == events.FailureNotReady:
			w.upstream.notReady(upstream)
		case upstream.Class == "" && out.offset() == d.StartOffset:
			w.upstream.recheck()
		}
		log.Warn("upstream failed", "class", upstream.Class, "status", upstream.Status, "code", upstream.Code, "err", genErr)
	default:
		f := failed("engine_error")
		f.Message = genErr.Error()
		status, final = statusFailed, f
		fatal = errors.Is(genErr, engine.ErrFatal)
		log.Error("generation failed", "err", genErr)
	}
	return status, final, fatal
}

// attemptFailed is the event that reports job j's attempt failed for reason
// after the tokens out has stored.
func (w *Worker) attemptFailed(j *job, out *deltas, reason string) events.AttemptFailed {
	return events.AttemptFailed{RequestID: j.d.RequestID, Attempt: j.d.Attempt, WorkerID: w.cfg.ID,
		Offset: out.offset(), Reason: reason}
}

// failureReason is AttemptFailed.Reason for an upstream failure of class.
func failureReason(class string) string {
	if class == "" {
		return "engine_error"
	}
	return class
}

// promptTokens is the prompt's length to report at completion: the engine's
// count when it gave one for the original prompt (its usage on a first
// attempt, the recorded prompt ids or an earlier engine's count on a
// continuation); on a prefill continuation with neither, its server's
// count of the prompt and the text so far less the tokens so far (the
// prompt in the server's tokens: exact when the continuation was, off by
// the re-tokenization when not, and closer than a word count either way);
// else the frontend's.
func promptTokens(d events.Dispatch, res engine.Result, out *deltas) int {
	switch {
	case d.StartOffset == 0 && res.PromptTokens > 0:
		return res.PromptTokens
	case d.StartOffset == 0 && out.promptIDs != nil:
		return len(out.promptIDs)
	case d.PromptIDs != nil:
		return len(d.PromptIDs)
	case d.EnginePromptTokens > 0:
		return d.EnginePromptTokens
	case d.StartOffset > 0 && res.PromptTokens > d.StartOffset:
		return res.PromptTokens - d.StartOffset
	}
	return d.PromptTokens
}

// completionTokens is the answer's length to report at completion: the
// tokens of the earlier attempts (the continuation's start offset: the
// server's ids where it gave them, else its streamed events) plus this
// attempt's as its server counted them (its usage), else as streamed. A
// server may merge tokens into one streamed event or hide a matched stop
// sequence, so its count is the truth where it gave one.
func completionTokens(d events.Dispatch, res engine.Result, out *deltas) int {
	if res.CompletionTokens > 0 {
		return d.StartOffset + res.CompletionTokens
	}
	return out.offset()
}

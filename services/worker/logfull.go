package worker

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/baton-dev/baton/streams"
)

// An attempt whose tokens the request log refused at its limits stops
// (errLogFull), and its frontend must learn why: otherwise it sees only
// silence, and once its monitor no longer reads the log as full it takes
// the silence for a stall, fences the attempt and inhibits this healthy
// worker. A full log is often full for a moment only (eviction of finished
// requests makes room within one or two of the monitor's readings), so the
// worker stores the attempt's end, an AttemptFailed of class log_full, as
// soon as the log takes it; the frontend then ends the request with
// log_full. While the log stays full, the frontend's monitor sees it so,
// and the frontend ends the request itself.

// Spacing and bound of the tries to store the end of an attempt the log
// refused: logFullRetry is about the frontend monitor's reading interval
// (an eviction round), logFullPatience the default stall timeout, after
// which the frontend has ended the attempt itself.
const (
	logFullRetry    = 250 * time.Millisecond
	logFullPatience = 30 * time.Second
)

// reportLogFull stores the end of job j's attempt, whose tokens out the log
// refused at its limits: an AttemptFailed of class events.FailureLogFull at
// the offset up to which its tokens are stored. It tries again every
// logFullRetry while the log refuses it too, until the attempt is overruled
// (a fence or a kill: its frontend ended it; the worker's shutdown) or for
// logFullPatience. Each try is the same event id, stored at most once.
func (w *Worker) reportLogFull(j *job, out *deltas, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), logFullPatience)
	defer cancel()
	f := w.attemptFailed(j, out, events.FailureLogFull)
	f.Class, f.Code = events.FailureLogFull, events.FailureLogFull
	f.Message = "the request log refused this attempt's tokens at its limits"
	actx, acancel := context.WithTimeout(ctx, streams.AppendAckTimeout)
	f.Offset = out.storedOffset(actx)
	acancel()
	env := out.log.Envelope(events.ID(j.d.RequestID, j.d.Attempt, "failed"), j.d.RequestID, f)
	for try := 1; ; try++ {
		_, err := out.log.Append(ctx, out.subject, env, -1)
		switch {
		case err == nil:
			log.Info("stored the end of the attempt the full log refused", "offset", f.Offset, "tries", try)
			return
		case !errors.Is(err, streams.ErrStreamFull):
			log.Warn("store the end of the attempt the full log refused", "tries", try, "err", err)
			return
		}
		t := time.NewTimer(logFullRetry)
		select {
		case <-t.C:
		case <-j.overruled:
			t.Stop()
			return // its frontend ended it, or the worker leaves
		case <-ctx.Done():
			t.Stop()
			log.Warn("the full log did not take the end of the attempt it refused", "tries", try, "patience", logFullPatience)
			return
		}
	}
}

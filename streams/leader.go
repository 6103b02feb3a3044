package streams

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Direct gets are answered by any replica of a stream with AllowDirect, and a
// replica may be behind its leader: a read of a request's history from one can
// miss the newest events (a completion, say) that a client already saw
// through another frontend. Nothing would then make the reader look again,
// for no later message arrives to reveal the gap. readSubject therefore ends
// every read with one question to the stream leader, which alone answers the
// non-direct message API: what is the last message on these subjects? Anything
// past what the replica returned is read from the leader.

// msgGetResponse is the stream leader's answer to $JS.API.STREAM.MSG.GET.
type msgGetResponse struct {
	apiAnswer
	Message *struct {
		Subject  string    `json:"subject"`
		Sequence uint64    `json:"seq"`
		Header   []byte    `json:"hdrs,omitempty"`
		Data     []byte    `json:"data,omitempty"`
		Time     time.Time `json:"time"`
	} `json:"message,omitempty"`
}

// leaderGet asks stream's leader for a message: the last on subject (last
// set), or the first on subject at or after seq. It returns nil, nil when
// there is none.
func leaderGet(ctx context.Context, js jetstream.JetStream, stream, subject string, seq uint64, last bool) (*jetstream.RawStreamMsg, error) {
	req := map[string]any{"next_by_subj": subject, "seq": seq}
	if last {
		req = map[string]any{"last_by_subj": subject}
	}
	return leaderAsk(ctx, js, stream, subject, req)
}

// leaderAsk asks stream's leader for the message req names
// ($JS.API.STREAM.MSG.GET's request); about is what errors say it was
// for.
func leaderAsk(ctx context.Context, js jetstream.JetStream, stream, about string, req map[string]any) (*jetstream.RawStreamMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	// A short question: a leader that does not answer at once is in an
	// election, and the caller falls back to what the replica said.
	ctx, cancel := context.WithTimeout(ctx, leaderTimeout)
	defer cancel()
	m, err := js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("ask the leader of %s for %s: %w", stream, about, err)
	}
	var resp msgGetResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("ask the leader of %s for %s: %w", stream, about, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("ask the leader of %s for %s: %s", stream, about, resp.Error.Description)
	}
	if resp.Message == nil {
		return nil, nil
	}
	raw := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Sequence,
		Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return nil, fmt.Errorf("ask the leader of %s for %s: headers: %w", stream, about, err)
		}
		raw.Header = h
	}
	return raw, nil
}

// leaderTimeout bounds one question to a stream leader.
const leaderTimeout = time.Second

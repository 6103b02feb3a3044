package streams

import (
	"encoding/json"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestAsyncAppendsExpire: an append nobody answers fails once
// AppendAckTimeout has passed since it was sent, not before, and leaves the
// window (a stalled append then goes); the one timer serves every deadline;
// a late answer changes nothing.
func TestAsyncAppendsExpire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sent []*nats.Msg
		a := &asyncAppends{max: 2}
		a.init("r.", func(m *nats.Msg) error { sent = append(sent, m); return nil })
		send := func() *asyncAppend {
			t.Helper()
			p, err := a.send(&nats.Msg{Subject: "s"})
			if err != nil {
				t.Fatalf("send: %v", err)
			}
			return p
		}
		ack := func(m *nats.Msg) { a.reply(&nats.Msg{Subject: m.Reply, Data: []byte(`{"stream":"S","seq":1}`)}) }
		state := func(p *asyncAppend) string {
			switch done, err := p.Outcome(); {
			case !done:
				return "pending"
			case err == nil:
				return "stored"
			case errors.Is(err, jetstream.ErrAsyncPublishTimeout):
				return "timed out"
			default:
				return err.Error()
			}
		}

		first, second := send(), send() // t = 0
		time.Sleep(2 * time.Second)
		third := make(chan *asyncAppend)
		go func() { p, _ := a.send(&nats.Msg{Subject: "s"}); third <- p }()
		synctest.Wait()
		if len(sent) != 2 {
			t.Fatalf("%d appends sent with a window of 2 full, want 2", len(sent))
		}
		ack(sent[0]) // t = 2 s: room for the third
		p3 := <-third
		time.Sleep(AppendAckTimeout - 2*time.Second - time.Millisecond) // just before the second's deadline
		synctest.Wait()
		if got := state(second); got != "pending" {
			t.Fatalf("before its deadline the unanswered append is %s, want pending", got)
		}
		time.Sleep(time.Millisecond) // t = AppendAckTimeout
		synctest.Wait()
		for _, c := range []struct {
			name string
			p    *asyncAppend
			want string
		}{{"first", first, "stored"}, {"second", second, "timed out"}, {"third", p3, "pending"}} {
			if got := state(c.p); got != c.want {
				t.Errorf("at the second's deadline the %s append is %s, want %s", c.name, got, c.want)
			}
		}
		ack(sent[1]) // late: it changes nothing
		if got := state(second); got != "timed out" {
			t.Errorf("after a late answer the expired append is %s, want timed out", got)
		}
		select {
		case err := <-second.Err():
			if !Transient(err) {
				t.Errorf("the timeout %v is not transient: the caller would not repair it", err)
			}
		default:
			t.Error("the expired append's Err channel yields nothing")
		}

		time.Sleep(2 * time.Second) // t = AppendAckTimeout + 2 s: the third's deadline
		synctest.Wait()
		if got := state(p3); got != "timed out" {
			t.Errorf("at its deadline the third append is %s, want timed out", got)
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(a.pending) != 0 || a.armed {
			t.Errorf("%d appends pending, timer armed %v, want 0 false", len(a.pending), a.armed)
		}
	})
}

// TestParsePubAck reads JetStream's answers as encoding/json does: the
// server's usual forms in one pass, every other through encoding/json.
func TestParsePubAck(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		flat       bool   // read without encoding/json
		errCode    uint16 // an API error with this code
		invalid    bool   // ErrInvalidJSAck
	}{
		{name: "stored", data: `{"stream":"BATON_REQUESTS_0","seq":42}`, flat: true},
		{name: "domain", data: `{"stream":"S","domain":"hub","seq":7}`, flat: true},
		{name: "duplicate", data: `{"stream":"S","seq":7,"duplicate": true}`, flat: true},
		{name: "spaces", data: " { \"stream\" : \"S\" ,\n\"seq\" : 1 } ", flat: true},
		{name: "escaped stream name", data: `{"stream":"S\u0031","seq":1}`},
		{name: "batch", data: `{"stream":"S","seq":9,"duplicate": true,"batch":"b","count":3}`},
		{name: "counter", data: `{"stream":"S","seq":9,"val":"12"}`},
		{name: "stream full", data: `{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`, errCode: 10077},
		{name: "wrong last sequence", data: `{"type":"io.nats.jetstream.api.v1.pub_ack_response","error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"},"stream":"S","seq":0}`, errCode: 10071},
		{name: "no stream", data: `{"seq":1}`, invalid: true},
		{name: "empty object", data: `{}`, invalid: true},
		{name: "empty", data: ``, invalid: true},
		{name: "not json", data: `+OK`, invalid: true},
		{name: "trailing garbage", data: `{"stream":"S","seq":1}x`, invalid: true},
		{name: "negative seq", data: `{"stream":"S","seq":-1}`, invalid: true},
		{name: "largest seq", data: `{"stream":"S","seq":18446744073709551615}`},
		{name: "seq overflows", data: `{"stream":"S","seq":18446744073709551616}`, invalid: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := "S"
			ack, err := parsePubAck([]byte(tc.data), &stream)
			if _, flat := parseFlatPubAck([]byte(tc.data), new(string)); flat != tc.flat {
				t.Errorf("read in one pass %v, want %v", flat, tc.flat)
			}
			var apiErr *jetstream.APIError
			switch {
			case tc.invalid:
				if !errors.Is(err, jetstream.ErrInvalidJSAck) {
					t.Errorf("got %+v, %v; want ErrInvalidJSAck", ack, err)
				}
				return
			case tc.errCode != 0:
				if !errors.As(err, &apiErr) || uint16(apiErr.ErrorCode) != tc.errCode {
					t.Errorf("got %+v, %v; want API error %d", ack, err, tc.errCode)
				}
				return
			case err != nil:
				t.Fatalf("got error %v, want an ack", err)
			}
			var want jetstream.PubAck
			if err := json.Unmarshal([]byte(tc.data), &want); err != nil {
				t.Fatal(err)
			}
			if ack != want {
				t.Errorf("got %+v, want %+v (encoding/json's)", ack, want)
			}
		})
	}
}

// TestAsyncAppendsPublishFailure: an append whose publish fails leaves the
// window at once, and so does one that fails with the connection while it
// is being published: neither keeps a place, nor gives back one twice.
func TestAsyncAppendsPublishFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fail := nats.ErrConnectionClosed
		a := &asyncAppends{max: 1}
		a.init("r.", func(*nats.Msg) error {
			if fail == nats.ErrDisconnected {
				a.failAll(fail) // the connection is lost as the append goes out
			}
			return fail
		})
		start := time.Now()
		for i, err := range []error{nats.ErrConnectionClosed, nats.ErrDisconnected, nil} {
			fail = err
			_, got := a.send(&nats.Msg{Subject: "s"})
			if !errors.Is(got, err) {
				t.Errorf("send %d: got %v, want %v", i, got, err)
			}
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("the sends took %v: one waited for a place the failed ones kept", d)
		}
		if n := len(a.window); n != 1 {
			t.Errorf("%d places taken with one append pending, want 1", n)
		}
	})
}

// TestParsePubAckAllocates: the usual acknowledgement, of the stream the
// last one named, is read with no allocation.
func TestParsePubAckAllocates(t *testing.T) {
	data := []byte(`{"stream":"BATON_REQUESTS_0","seq":123456789,"duplicate": true}`)
	stream := "BATON_REQUESTS_0"
	if n := testing.AllocsPerRun(100, func() {
		if _, err := parsePubAck(data, &stream); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per acknowledgement, want 0", n)
	}
}

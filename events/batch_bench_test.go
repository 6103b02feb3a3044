package events_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/textproto"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/events"
	"github.com/nats-io/nats.go"
)

// BenchmarkBatch compares, per token, n deltas of one token each (n
// attempts, one decode step, token ids given) written and read as one
// batch with what they cost today as n messages, headers included:
//
//   - encode: what a worker does: today, per delta, its event id,
//     DeltaEncoder.EncodeInto into a reused map and the header's wire form
//     (as nats.go's publish writes it, headerWire); as a batch, n
//     AppendDelta, the batch's headers and their wire form, once.
//   - decode: what a frontend does with the republished copies: parse the
//     header block (nats.DecodeHeadersMsg, what nats.go does on receipt,
//     with the five headers RePublish adds), read the stream sequences
//     (streams.Decode) and decode; as a batch, the same once, then n
//     entries.
//
// Run: go test -run '^$' -bench BenchmarkBatch -benchmem ./events/
func BenchmarkBatch(b *testing.B) {
	for _, n := range []int{1, 8, 64, 500} {
		w := newWorkload(b, n)
		b.Run(fmt.Sprintf("n=%d/encode/messages", n), w.encodeMessages)
		b.Run(fmt.Sprintf("n=%d/encode/batch", n), w.encodeBatch)
		b.Run(fmt.Sprintf("n=%d/decode/messages", n), w.decodeMessages)
		b.Run(fmt.Sprintf("n=%d/decode/batch", n), w.decodeBatch)
	}
}

// workload is one decode step of n attempts, and its wire forms.
type workload struct {
	n        int
	now      time.Time
	encs     []*events.DeltaEncoder
	deltas   []events.TokensGenerated
	msgs     [][2][]byte // each delta as received: header block, data
	batchHdr []byte      // the batch as received
	batch    []byte
}

func newWorkload(b *testing.B, n int) *workload {
	w := &workload{n: n, now: time.Now()}
	for i := range n {
		req := fmt.Sprintf("alice:req-%016d", i)
		enc, err := events.NewDeltaEncoder(batchSource, req, 1)
		if err != nil {
			b.Fatal(err)
		}
		w.encs = append(w.encs, enc)
		w.deltas = append(w.deltas, events.TokensGenerated{RequestID: req, Attempt: 1, Offset: 100 + i, Tokens: []string{" word"}, IDs: []int{1000 + i}})
		h, data, err := enc.Encode(events.ID(req, 1, 100+i), w.now, w.deltas[i])
		if err != nil {
			b.Fatal(err)
		}
		delete(h, events.HeaderMsgID) // a first try's: see services/worker/delta.go
		republished(h, "BATON_REQUESTS", "baton.requests.17."+req+".tokens.1.w1", 123456+i)
		w.msgs = append(w.msgs, [2][]byte{headerWire(h), data})
	}
	enc, err := events.NewBatchEncoder(batchSource)
	if err != nil {
		b.Fatal(err)
	}
	for _, ev := range w.deltas {
		if err := enc.AppendDelta("", w.now, ev); err != nil {
			b.Fatal(err)
		}
	}
	h, body, err := enc.Message(nil, "w1.1")
	if err != nil {
		b.Fatal(err)
	}
	republished(h, "BATON_OUT_w1", "baton.out.w1.d.fe-1", 4567)
	w.batchHdr, w.batch = headerWire(h), body
	return w
}

// republished adds the headers a JetStream RePublish adds to a message.
func republished(h events.Header, stream, subject string, seq int) {
	h["Nats-Stream"] = []string{stream}
	h["Nats-Subject"] = []string{subject}
	h["Nats-Sequence"] = []string{strconv.Itoa(seq)}
	h["Nats-Time-Stamp"] = []string{"2026-12-04T19:00:00.123456789Z"}
	h["Nats-Last-Sequence"] = []string{strconv.Itoa(seq - 40)}
}

func (w *workload) encodeMessages(b *testing.B) {
	var h events.Header
	var wire int
	b.ReportAllocs()
	for b.Loop() {
		wire = 0
		for i, ev := range w.deltas {
			var data []byte
			var err error
			h, data, err = w.encs[i].EncodeInto(h, events.ID(ev.RequestID, ev.Attempt, ev.Offset), w.now, ev)
			if err != nil {
				b.Fatal(err)
			}
			delete(h, events.HeaderMsgID)
			wire += len(headerWire(h)) + len(data)
		}
	}
	w.report(b, wire)
}

func (w *workload) encodeBatch(b *testing.B) {
	enc, err := events.NewBatchEncoder(batchSource)
	if err != nil {
		b.Fatal(err)
	}
	var h events.Header
	var wire int
	b.ReportAllocs()
	for b.Loop() {
		enc.Reset()
		for _, ev := range w.deltas {
			if err := enc.AppendDelta("", w.now, ev); err != nil {
				b.Fatal(err)
			}
		}
		var body []byte
		if h, body, err = enc.Message(h, "w1.1"); err != nil {
			b.Fatal(err)
		}
		wire = len(headerWire(h)) + len(body)
	}
	w.report(b, wire)
}

func (w *workload) decodeMessages(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range w.msgs {
			h, err := nats.DecodeHeadersMsg(m[0])
			if err != nil {
				b.Fatal(err)
			}
			sequences(b, h)
			if _, err := events.Unmarshal(events.Header(h), m[1]); err != nil {
				b.Fatal(err)
			}
		}
	}
	w.report(b, 0)
}

func (w *workload) decodeBatch(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		h, err := nats.DecodeHeadersMsg(w.batchHdr)
		if err != nil {
			b.Fatal(err)
		}
		sequences(b, h)
		d, err := events.DecodeBatch(events.Header(h), w.batch)
		if err != nil {
			b.Fatal(err)
		}
		for range w.n {
			if _, err := d.Next(); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := d.Next(); !errors.Is(err, io.EOF) {
			b.Fatal(err)
		}
	}
	w.report(b, 0)
}

// sequences reads the stream position, as streams.Decode does.
func sequences(b *testing.B, h nats.Header) {
	if _, err := strconv.ParseUint(h.Get("Nats-Sequence"), 10, 64); err != nil {
		b.Fatal(err)
	}
	if _, err := strconv.ParseUint(h.Get("Nats-Last-Sequence"), 10, 64); err != nil {
		b.Fatal(err)
	}
}

func (w *workload) report(b *testing.B, wire int) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*w.n), "ns/token")
	if wire > 0 {
		b.ReportMetric(float64(wire)/float64(w.n), "wireB/token")
	}
}

// headerWire is the wire form of a message's headers as nats.go v1.55.0
// writes it when it publishes (Msg.headerBytes, unexported: its size pass,
// which checks the keys, then the block; values trimmed, CR and LF made
// spaces).
func headerWire(h events.Header) []byte {
	size := len("NATS/1.0\r\n") + 2
	for k, vs := range h {
		if !headerKey(k) {
			panic("bad header key " + k)
		}
		for _, v := range vs {
			size += len(k) + len(textproto.TrimString(v)) + 4
		}
	}
	var buf bytes.Buffer
	buf.Grow(size)
	buf.WriteString("NATS/1.0\r\n")
	for k, vs := range h {
		for _, v := range vs {
			buf.WriteString(k)
			buf.WriteString(": ")
			_, _ = newlines.WriteString(&buf, textproto.TrimString(v))
			buf.WriteString("\r\n")
		}
	}
	buf.WriteString("\r\n")
	return buf.Bytes()
}

var newlines = strings.NewReplacer("\r", " ", "\n", " ")

func headerKey(k string) bool {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c == ':' || c >= 0x7f {
			return false
		}
	}
	return k != ""
}

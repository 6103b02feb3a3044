package httpguard

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func TestReadAllSized(t *testing.T) {
	body := strings.Repeat("x", 100)
	big := strings.Repeat("y", maxPresized+500)
	for _, tc := range []struct {
		name    string
		body    string
		size    int64
		maxCap  int // the buffer's capacity at most (0: any)
		oneByte bool
	}{
		{name: "Content-Length exact: no spare but the end's byte", body: body, size: 100, maxCap: 101},
		{name: "Content-Length exact, read a byte at a time", body: body, size: 100, maxCap: 101, oneByte: true},
		{name: "unknown length", body: body, size: -1},
		{name: "shorter than said", body: body, size: 150, maxCap: 151},
		{name: "longer than said: grows", body: body, size: 10},
		{name: "past the presized bound: grows", body: big, size: int64(len(big))},
		{name: "empty", body: "", size: 5, maxCap: 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r io.Reader = strings.NewReader(tc.body)
			if tc.oneByte {
				r = iotest.OneByteReader(r)
			}
			got, err := readAllSized(r, tc.size)
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			if string(got) != tc.body {
				t.Errorf("got %d bytes, want the %d of the body", len(got), len(tc.body))
			}
			if tc.maxCap > 0 && cap(got) > tc.maxCap {
				t.Errorf("got a buffer of %d bytes, want at most %d", cap(got), tc.maxCap)
			}
		})
	}
	if _, err := readAllSized(iotest.ErrReader(io.ErrUnexpectedEOF), 10); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("got error %v, want the reader's", err)
	}
}

// TestRequestBody: the bytes ReadBody read are the handler's body, not a
// copy, within the limit; past it the handler sees what it saw before.
func TestRequestBody(t *testing.T) {
	for _, tc := range []struct {
		name     string
		body     string
		limit    int64
		buffered bool
		wantErr  bool
	}{
		{name: "read by ReadBody, within the limit", body: `{"a":1}`, limit: 100, buffered: true},
		{name: "read by ReadBody, at the limit", body: `{"a":1}`, limit: 7, buffered: true},
		{name: "read by ReadBody, past the limit", body: `{"a":12}`, limit: 7, buffered: true, wantErr: true},
		{name: "not read before", body: `{"a":1}`, limit: 100},
		{name: "not read before, past the limit", body: `{"a":12}`, limit: 7, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []byte
			var err error
			var read []byte
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if b, ok := r.Body.(*bufferedBody); ok {
					read = b.data
				}
				got, err = Body(w, r, tc.limit)
				if rest, _ := io.ReadAll(r.Body); len(rest) != 0 {
					t.Errorf("the body still reads %q after Body", rest)
				}
			})
			var next http.Handler = h
			if tc.buffered {
				next = ReadBody(time.Minute, tc.limit, h)
			}
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(tc.body))
			next.ServeHTTP(httptest.NewRecorder(), req)
			var tooLarge *http.MaxBytesError
			switch {
			case tc.wantErr:
				if !errors.As(err, &tooLarge) {
					t.Fatalf("got error %v, want a MaxBytesError", err)
				}
				return
			case err != nil:
				t.Fatalf("got error %v, want none", err)
			}
			if string(got) != tc.body {
				t.Errorf("got body %q, want %q", got, tc.body)
			}
			if tc.buffered && (len(read) == 0 || &got[0] != &read[0]) {
				t.Error("got a copy of the body ReadBody read, want its bytes")
			}
		})
	}
}

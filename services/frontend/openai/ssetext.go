package openai

import (
	"strconv"
	"unicode/utf8"

	"github.com/baton-dev/baton/events"
)

// The chunk of a delta that carries text alone is the hot path of a
// stream: one per delta, thousands of streams. textChunk writes it byte for
// byte as chunk writes it through maps and encoding/json (keys sorted, HTML
// escaped), into the writer's reused buffer: no map, no reflection, no
// allocation once the buffers have grown. FuzzTextChunk holds the two to
// the same bytes.

// textEvent writes the SSE event of the chunk of choice index carrying
// tokens (text alone, no details).
func (s *SSE) textEvent(id, index int, tokens []string, first bool) {
	if s.err != nil {
		return
	}
	if s.suffix == nil {
		s.suffix = chunkSuffix(s.head)
	}
	s.text = s.text[:0]
	for _, t := range tokens {
		s.text = append(s.text, t...)
	}
	b := append(s.buf[:0], "id: "...)
	b = strconv.AppendInt(b, int64(id), 10)
	b = append(b, "\ndata: "...)
	b = appendTextChoice(b, s.head.endpoint, index, s.text, first)
	b = append(b, s.suffix...)
	b = append(b, "\n\n"...)
	s.buf = b
	_, s.err = s.w.Write(b)
}

// appendTextChoice appends `{"choices":[<choice>` for text.
func appendTextChoice(b []byte, endpoint string, index int, text []byte, first bool) []byte {
	b = append(b, `{"choices":[{`...)
	if endpoint == events.EndpointChat {
		b = append(b, `"delta":{"content":`...)
		b = appendJSONString(b, text)
		if first {
			b = append(b, `,"role":"assistant"`...)
		}
		b = append(b, `},"finish_reason":null,"index":`...)
		b = strconv.AppendInt(b, int64(index), 10)
		return append(b, `,"logprobs":null}`...)
	}
	b = append(b, `"finish_reason":null,"index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	b = append(b, `,"logprobs":null,"text":`...)
	b = appendJSONString(b, text)
	return append(b, '}')
}

// chunkSuffix is what follows the choices in every chunk of h's stream:
// `],"created":…,"id":…,"model":…,"object":…}`.
func chunkSuffix(h chunkHead) []byte {
	id, object := "cmpl-"+h.id, "text_completion"
	if h.endpoint == events.EndpointChat {
		id, object = "chatcmpl-"+h.id, "chat.completion.chunk"
	}
	b := append([]byte(`],"created":`), strconv.AppendInt(nil, h.created, 10)...)
	b = append(b, `,"id":`...)
	b = appendJSONString(b, []byte(id))
	b = append(b, `,"model":`...)
	b = appendJSONString(b, []byte(h.model))
	b = append(b, `,"object":`...)
	b = appendJSONString(b, []byte(object))
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends src as encoding/json writes a string (with its
// default HTML escaping): invalid UTF-8 becomes U+FFFD, U+2028 and U+2029
// are escaped.
func appendJSONString(dst, src []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(src); {
		if c := src[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = append(dst, src[start:i]...)
			switch c {
			case '\\', '"':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(src[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, src[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, src[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, src[start:]...)
	return append(dst, '"')
}

// Package openai renders requests in OpenAI's wire format, with no I/O of
// its own beyond the writer it is given: the non-streaming answer of a
// request (Answer, and Response from its projection), the chunks of a
// stream as server-sent events (SSE, with a hand-written fast path for
// text-only chunks that is byte-identical to the general one), and the
// error bodies. The frontend writes its responses with it, and baton
// replay renders the answer it shows with it, so both say the same.
package openai

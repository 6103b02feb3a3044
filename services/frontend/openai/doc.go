// Package openai is OpenAI's wire format for the requests in the log, with
// no I/O of its own beyond the writer it is given: the chat and text
// completions (their request bodies parsed and checked, ParseCompletion;
// the non-streaming answer, Answer; the chunks of a stream as
// server-sent events, SSE, with a hand-written fast path for text-only
// chunks that is byte-identical to the general one; the error bodies), and
// the Responses API (its request bodies parsed and rendered as the chat
// request engines are sent, ParseResponseRequest; a response's object and
// its stream of semantic events, ResponseRender and ResponseSSE; its input
// items). Response renders the answer of a request of any endpoint from its
// projection: the frontend answers with it, and baton replay shows it, so
// both say the same.
package openai

// Package engine defines what a worker runs requests on (Engine) and its
// implementations: Mock (deterministic output, simulated timing and KV cache,
// scripted faults) and OpenAI (an adapter to any OpenAI-compatible server:
// vLLM, SGLang, llama.cpp, Ollama). Implementations are safe for concurrent use.
//
// An engine emits one Token per token of output: its text and, when the
// engine knows them, its id and what the server said beyond the text
// (Details). A failure of the server behind an engine is an *UpstreamError
// whose Class (events.FailureClient, FailureUnavailable, FailureNotReady, or
// none) tells the frontend what to do; no such failure is ErrFatal. An
// engine that can find out what its server supports is a Prober.
package engine

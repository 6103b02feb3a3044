// Package engine defines what a worker runs requests on (Engine) and its
// implementations: Mock (deterministic output, simulated timing and KV cache,
// scripted faults) and OpenAI (an adapter to any OpenAI-compatible server:
// vLLM, SGLang, llama.cpp, Ollama). Implementations are safe for concurrent use.
package engine

// Package vllmsim is a simulator of vLLM's OpenAI-compatible HTTP server, for
// tests, the chaos soak and a try-out stack: a deterministic model behind the
// API that baton's OpenAI engine talks to, with scripted faults.
//
// It follows vLLM's documented API:
//   - https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html
//     (Completions and Chat APIs, extra sampling parameters such as top_k and
//     seed, the chat template's add_generation_prompt and
//     continue_final_message, the Tokenizer API /tokenize and /detokenize);
//   - vLLM's protocol (vllm/entrypoints/openai/protocol.py): a completions
//     prompt may be a list of token ids; return_token_ids (vLLM >= 0.10.2)
//     adds prompt_token_ids to the first chunk and token_ids to each choice;
//     stream_options.include_usage ends a stream with a usage chunk; errors
//     are {"error":{"message","type","param","code"}}; a stream that fails
//     after its first chunk carries the error as a data event;
//   - the OpenAI API reference for the shapes vLLM copies: chat chunks with
//     delta.content and delta.tool_calls (streamed arguments), logprobs
//     {content:[{token,logprob,bytes,top_logprobs}]} on chat and
//     {tokens,token_logprobs,top_logprobs,text_offset} on completions.
//
// The model: a tokenizer of 256 byte tokens, a few special tokens and a
// vocabulary of words (each with and without a leading space), so any text
// round-trips through /tokenize and /detokenize; a ChatML chat template. The
// token at each position is a pure function of the token ids before it (and
// of the seed, when temperature > 0): greedy decoding and seeded sampling
// repeat exactly, and a request continued from its prompt ids plus the ids
// generated so far produces exactly the rest of the uninterrupted answer.
// Without a seed, temperature > 0 samples from a process-wide random source.
//
// Upstreams as they are: Config.ListedModel lists another name than the one
// served (Ollama lists "tiny:latest" for "tiny"), Config.Slots queues
// generations beyond N parallel slots and sends nothing while they wait,
// and Config.TemplatedCompletions wraps a completions prompt in the chat
// template, as Ollama does.
//
// Faults are scripted per process (Config.Fault, for the first
// Config.FaultRequests requests or all, optionally only those whose body
// contains Config.FaultMatch), per request by the header X-Vllmsim-Fault, or
// by the body field vllmsim_fault (BodyFault), which reaches the simulator
// through a proxy that passes the client's fields on; see ParseFault. Every request body is recorded and served
// at GET /sim/requests, so that tests can assert on what an upstream received.
// GET /sim/status (and GET /metrics, with vLLM's vllm:num_requests_running)
// counts the generations running and those aborted because their client went
// away before the answer ended, so that tests can check that a cancel freed
// the server.
package vllmsim

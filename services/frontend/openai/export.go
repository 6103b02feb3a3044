package openai

// What other renderings of a request in the log (the Responses API's, in
// the frontend) share with the chat and completions renderings.

// TokenDetails is engine.Details as the log stores it: what the engine said
// about a token beyond its text.
type TokenDetails = tokenDetails

// ToolCallDelta is one tool call's part in a token's details.
type ToolCallDelta = toolCallDelta

// AppendJSONString appends src to dst as a JSON string, quotes included,
// as encoding/json would write it, without its reflection.
func AppendJSONString(dst, src []byte) []byte { return appendJSONString(dst, src) }

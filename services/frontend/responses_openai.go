package frontend

import (
	"net/http"

	"github.com/baton-dev/baton/services/frontend/openai"
)

// The Responses API's rendering uses the OpenAI wire helpers of the openai
// package under these names.
type (
	tokenDetails  = openai.TokenDetails
	toolCallDelta = openai.ToolCallDelta
)

func appendJSONString(dst, src []byte) []byte { return openai.AppendJSONString(dst, src) }

func errorBody(typ, code, message string) map[string]any { return openai.ErrorBody(typ, code, message) }

func startSSE(w http.ResponseWriter) (flush func()) { return openai.StartSSE(w) }
